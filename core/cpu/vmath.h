// Lane math for the CPU kernels that are compiled once per ISA (flash_attention_kernel.h,
// vec_kernels.h; vec_isa.h picks the build): 16-float GCC vectors, which the compiler maps onto
// the file's ISA (one ZMM, two YMM or four XMM registers), and exp().
// Include it only inside such a kernel's per-ISA anonymous namespace, below its
// `#pragma GCC target` and its includes of <algorithm> and <cstring>: every definition here
// is internal to that file, so none is ever emitted with instructions the CPU may lack.
#pragma once

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));  // any float address
typedef std::int32_t i16v __attribute__((vector_size(64)));

constexpr int kLanes = 16;

inline v16 load(const float* p) { return *reinterpret_cast<const v16u*>(p); }
inline void store(float* p, v16 v) { *reinterpret_cast<v16u*>(p) = v; }
inline v16 splat(float x) { return v16{} + x; }

// exp(x) per lane: x = n ln2 + r, |r| <= ln2/2, exp(r) by Cephes' expf polynomial (relative
// error ~2 ulp), 2^n from the exponent bits. Lanes below -87.3 (where 2^n would leave the
// normal range) give 0, so -inf (a masked score) gives exactly 0; lanes above 88.38 are taken
// as 88.38 (exp = 2.4e38, finite; f32 exp overflows at 88.72).
inline v16 vexp(v16 x) {
  const v16 lo = splat(-87.3365447f), hi = splat(88.3762626f);
  const v16 xc = x < lo ? lo : (x > hi ? hi : x);
  const v16 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const v16 n = (xc * 1.44269504088896341f + magic) - magic;
  const v16 r = xc - n * 0.693359375f - n * -2.12194440e-4f;
  v16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const i16v bits = (__builtin_convertvector(n, i16v) + 127) << 23;
  v16 two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const v16 e = p * two_n;
  return x < lo ? v16{} : e;
}

inline float hsum(v16 v) {
  float s = 0.0f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

inline float hmax(v16 v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = std::max(m, v[i]);
  return m;
}
