// AVX2 lane helpers shared by the *_avx2.cpp kernels (dtype conversion, AdamW's copy-out).
// Include only from files the build compiles with -mavx2 (names ending in _avx2.cpp); the
// callers dispatch to those files at run time after checking the CPU.
#pragma once

#include <immintrin.h>

namespace memfit::avx2 {

// core/dtype.h's f32 -> bf16 rule, 8 lanes at once: round to nearest even on the low 16 bits;
// NaN keeps its sign and top payload bits with the quiet bit set. Input: f32 bit patterns as
// integer lanes; result: bf16 bits in the low half of each 32-bit lane.
inline __m256i f32_to_bf16_lanes(__m256i x) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  // NaN: |x| > inf as integers (both sides are below 2^31, so the signed compare is exact).
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

}  // namespace memfit::avx2
