// The AdamW kernel with AVX2 + FMA + F16C, 8 elements per iteration; compiled with -mavx2
// -mfma -mf16c and called only when detail::cpu_has_avx2_fma_f16c(). Each lane performs the
// operations of adamw.h's specification in its order: the intrinsics below are IEEE
// single-precision mul/fma/sqrt/div, so every lane equals detail::adamw_scalar bit for bit.
// The code has no separate add for the compiler to fuse with a multiply. The last
// (end - begin) % 8 elements go to the scalar reference.
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <cstdint>

#include "core/cpu/adamw.h"
#include "core/simd_avx2.h"

namespace memfit::detail {

namespace {

enum class Out { kNone, kF32, kF16, kBF16 };

template <DType G>
inline __m256 load_grad(const unsigned char* p, std::size_t i) {
  if constexpr (G == DType::kF16) {  // exact; F16C quiets NaNs as core/dtype.h's f16_to_f32
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
  } else if constexpr (G == DType::kBF16) {
    const __m256i h =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p + 4 * i));
  }
}

using avx2::f32_to_bf16_lanes;

template <Out O>
inline void store_out(unsigned char* o, std::size_t i, __m256 p) {
  if constexpr (O == Out::kF32) {
    _mm256_storeu_ps(reinterpret_cast<float*>(o + 4 * i), p);
  } else if constexpr (O == Out::kF16) {
    // Rounding fixed by the immediate (nearest even), not by MXCSR.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * i),
                     _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT));
  } else if constexpr (O == Out::kBF16) {
    const __m256i h = f32_to_bf16_lanes(_mm256_castps_si256(p));
    // packus works per 128-bit half; the permute puts the two 64-bit results side by side.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * i), _mm256_castsi256_si128(packed));
  }
}

template <DType G, Out O>
void kernel(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin, std::size_t end) {
  const auto* gp = static_cast<const unsigned char*>(b.grad);
  auto* op = static_cast<unsigned char*>(b.param_out);
  float* const pp = b.param;
  float* const mp = b.exp_avg;
  float* const vp = b.exp_avg_sq;
  const __m256 grad_scale = _mm256_set1_ps(k.grad_scale);
  const __m256 beta1 = _mm256_set1_ps(k.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(k.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(k.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(k.one_minus_beta2);
  const __m256 inv_bc2_sqrt = _mm256_set1_ps(k.inv_bc2_sqrt);
  const __m256 eps = _mm256_set1_ps(k.eps);
  const __m256 neg_step_size = _mm256_set1_ps(k.neg_step_size);
  const __m256 decay = _mm256_set1_ps(k.decay);
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_mul_ps(load_grad<G>(gp, i), grad_scale);
    const __m256 m =
        _mm256_fmadd_ps(beta1, _mm256_loadu_ps(mp + i), _mm256_mul_ps(one_minus_beta1, g));
    const __m256 t = _mm256_mul_ps(one_minus_beta2, g);
    const __m256 v = _mm256_fmadd_ps(beta2, _mm256_loadu_ps(vp + i), _mm256_mul_ps(t, g));
    const __m256 d = _mm256_fmadd_ps(_mm256_sqrt_ps(v), inv_bc2_sqrt, eps);
    const __m256 u = _mm256_div_ps(m, d);
    const __m256 pd = _mm256_mul_ps(_mm256_loadu_ps(pp + i), decay);
    const __m256 p = _mm256_fmadd_ps(neg_step_size, u, pd);
    _mm256_storeu_ps(mp + i, m);
    _mm256_storeu_ps(vp + i, v);
    _mm256_storeu_ps(pp + i, p);
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

void adamw_avx2(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin,
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

#endif  // x86
