// The AdamW kernel with AVX-512 (F, BW, VL, DQ) + FMA + F16C, 16 elements per iteration;
// compiled with -mavx512f/bw/vl/dq -mfma -mf16c and called only when detail::cpu_has_avx512().
// Same operations in the same order as adamw.h's specification and adamw_avx2.cpp, so every
// lane equals detail::adamw_scalar bit for bit; no separate add exists for the compiler to
// fuse. The last (end - begin) % 16 elements go to the scalar reference.
#if defined(__x86_64__) || defined(__i386__)

// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports at every inlined use (GCC bug 105593, fixed in GCC 13).
// Clang has no such warning (and -Wunknown-warning-option would reject the name).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "core/cpu/adamw.h"

namespace memfit::detail {

namespace {

enum class Out { kNone, kF32, kF16, kBF16 };

template <DType G>
inline __m512 load_grad(const unsigned char* p, std::size_t i) {
  if constexpr (G == DType::kF16) {  // exact; quiets NaNs as core/dtype.h's f16_to_f32
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)));
  } else if constexpr (G == DType::kBF16) {
    const __m512i h =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  } else {
    return _mm512_loadu_ps(p + 4 * i);
  }
}

// core/dtype.h's f32 -> bf16 rule, lane by lane: round to nearest even on the low 16 bits,
// NaN -> top bits with the quiet bit set; then narrowed to 16 packed lanes.
inline __m256i f32_to_bf16_lanes(__m512i x) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet));
}

template <Out O>
inline void store_out(unsigned char* o, std::size_t i, __m512 p) {
  if constexpr (O == Out::kF32) {
    _mm512_storeu_ps(o + 4 * i, p);
  } else if constexpr (O == Out::kF16) {
    // Rounding fixed by the immediate (nearest even), not by MXCSR.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 2 * i),
                        _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT));
  } else if constexpr (O == Out::kBF16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 2 * i),
                        f32_to_bf16_lanes(_mm512_castps_si512(p)));
  }
}

template <DType G, Out O>
void kernel(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin, std::size_t end) {
  const auto* gp = static_cast<const unsigned char*>(b.grad);
  auto* op = static_cast<unsigned char*>(b.param_out);
  float* const pp = b.param;
  float* const mp = b.exp_avg;
  float* const vp = b.exp_avg_sq;
  const __m512 grad_scale = _mm512_set1_ps(k.grad_scale);
  const __m512 beta1 = _mm512_set1_ps(k.beta1);
  const __m512 one_minus_beta1 = _mm512_set1_ps(k.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(k.beta2);
  const __m512 one_minus_beta2 = _mm512_set1_ps(k.one_minus_beta2);
  const __m512 inv_bc2_sqrt = _mm512_set1_ps(k.inv_bc2_sqrt);
  const __m512 eps = _mm512_set1_ps(k.eps);
  const __m512 neg_step_size = _mm512_set1_ps(k.neg_step_size);
  const __m512 decay = _mm512_set1_ps(k.decay);
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 g = _mm512_mul_ps(load_grad<G>(gp, i), grad_scale);
    const __m512 m =
        _mm512_fmadd_ps(beta1, _mm512_loadu_ps(mp + i), _mm512_mul_ps(one_minus_beta1, g));
    const __m512 t = _mm512_mul_ps(one_minus_beta2, g);
    const __m512 v = _mm512_fmadd_ps(beta2, _mm512_loadu_ps(vp + i), _mm512_mul_ps(t, g));
    const __m512 d = _mm512_fmadd_ps(_mm512_sqrt_ps(v), inv_bc2_sqrt, eps);
    const __m512 u = _mm512_div_ps(m, d);
    const __m512 pd = _mm512_mul_ps(_mm512_loadu_ps(pp + i), decay);
    const __m512 p = _mm512_fmadd_ps(neg_step_size, u, pd);
    _mm512_storeu_ps(mp + i, m);
    _mm512_storeu_ps(vp + i, v);
    _mm512_storeu_ps(pp + i, p);
    store_out<O>(op, i, p);
  }
  if (i < end) adamw_scalar(k, b, i, end);
}

template <DType G>
void with_out(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin, std::size_t end) {
  if (b.param_out == nullptr) return kernel<G, Out::kNone>(k, b, begin, end);
  switch (b.out_dtype) {
    case DType::kF32:
      return kernel<G, Out::kF32>(k, b, begin, end);
    case DType::kF16:
      return kernel<G, Out::kF16>(k, b, begin, end);
    case DType::kBF16:
      return kernel<G, Out::kBF16>(k, b, begin, end);
  }
}

}  // namespace

void adamw_avx512(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin,
                  std::size_t end) {
  switch (b.grad_dtype) {
    case DType::kF32:
      return with_out<DType::kF32>(k, b, begin, end);
    case DType::kF16:
      return with_out<DType::kF16>(k, b, begin, end);
    case DType::kBF16:
      return with_out<DType::kBF16>(k, b, begin, end);
  }
}

}  // namespace memfit::detail

#pragma GCC diagnostic pop

#endif  // x86
