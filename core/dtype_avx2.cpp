// AVX2 + F16C conversions; compiled with -mavx2 -mf16c, called only when the CPU has both
// (detail::cpu_has_avx2_f16c). Every lane computes exactly what the scalar functions in
// dtype.cpp compute, NaNs included: the F16C instructions quiet NaNs and keep the top payload
// bits, which is the rule the scalar path implements, and the bf16 rounding below is the
// scalar integer formula lane by lane. Tails (n % 8) go to the scalar path.
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <cstring>

#include "core/dtype.h"
#include "core/simd_avx2.h"

namespace memfit::detail {

namespace {

// Rounding is fixed by the immediate, not by MXCSR, so a caller's rounding mode does not leak
// in. (MXCSR.DAZ would flush f32 denormal inputs, but those round to +-0 in f16 anyway.)
constexpr int kRne = _MM_FROUND_TO_NEAREST_INT;

using avx2::f32_to_bf16_lanes;

// Two vectors of 16-bit-valued lanes -> 16 packed uint16 in order. packus works per 128-bit
// half, so the 64-bit quarters come out as a0 b0 a1 b1 and are put back in order.
inline __m256i pack16(__m256i a, __m256i b) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
}

inline __m128i pack8(__m256i a) {
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(a, a), 0xD8));
}

inline __m256i load_u16x8_as_u32(const unsigned char* p) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 load_bf16x8(const unsigned char* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(load_u16x8_as_u32(p), 16));
}

inline __m256 load_f16x8(const unsigned char* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline void store_u16x8(unsigned char* p, __m128i v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
}

}  // namespace

void convert_avx2(const void* src, DType st, void* dst, DType dt, std::size_t n) {
  if (n == 0 || (src == dst && st == dt)) return;
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  const std::size_t ss = dtype_size(st), ds = dtype_size(dt);
  std::size_t i = 0;

  if (st == DType::kF32 && dt == DType::kBF16) {
    for (; i + 16 <= n; i += 16) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i * 4));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i * 4 + 32));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i * 2),
                          pack16(f32_to_bf16_lanes(a), f32_to_bf16_lanes(b)));
    }
    for (; i + 8 <= n; i += 8) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i * 4));
      store_u16x8(d + i * 2, pack8(f32_to_bf16_lanes(a)));
    }
  } else if (st == DType::kF32 && dt == DType::kF16) {
    for (; i + 8 <= n; i += 8) {
      store_u16x8(d + i * 2, _mm256_cvtps_ph(
                                 _mm256_loadu_ps(reinterpret_cast<const float*>(s + i * 4)), kRne));
    }
  } else if (st == DType::kBF16 && dt == DType::kF32) {
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(reinterpret_cast<float*>(d + i * 4), load_bf16x8(s + i * 2));
    }
  } else if (st == DType::kF16 && dt == DType::kF32) {
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(reinterpret_cast<float*>(d + i * 4), load_f16x8(s + i * 2));
    }
  } else if (st == DType::kF16 && dt == DType::kBF16) {
    // Through f32, which holds every f16 exactly: one rounding, as in the scalar path.
    for (; i + 8 <= n; i += 8) {
      const __m256i x = _mm256_castps_si256(load_f16x8(s + i * 2));
      store_u16x8(d + i * 2, pack8(f32_to_bf16_lanes(x)));
    }
  } else if (st == DType::kBF16 && dt == DType::kF16) {
    for (; i + 8 <= n; i += 8) {
      store_u16x8(d + i * 2, _mm256_cvtps_ph(load_bf16x8(s + i * 2), kRne));
    }
  }
  if (i < n) convert_scalar(s + i * ss, st, d + i * ds, dt, n - i);
}

}  // namespace memfit::detail

#endif  // x86
