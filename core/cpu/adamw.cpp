// AdamW on the host: buffer validation, the scalar reference kernel, run-time dispatch and the
// OpenMP tile driver. The vector kernels live in adamw_avx2.cpp / adamw_avx512.cpp.
#include "core/cpu/adamw.h"

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "memory/error.h"
#include "memory/size.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <xmmintrin.h>
#define MEMFIT_ADAMW_X86 1
#endif

namespace memfit {

namespace {

// Below this many elements the threads cost more than they save (a team wake-up is a few
// microseconds; 64K elements take ~30 us on one core).
constexpr std::size_t kParallelMin = std::size_t{1} << 16;

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("adamw: " + what); }

void check_dtype(const char* name, DType t) {
  if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) {
    bad(std::string(name) + " = " + std::to_string(static_cast<int>(t)) +
        "; valid: f32, f16, bf16");
  }
}

struct Range {
  const char* name;
  std::uintptr_t begin;
  std::uintptr_t end;
};

void check_buffers(const AdamWBuffers& b) {
  check_dtype("grad_dtype", b.grad_dtype);
  if (b.param_out != nullptr) check_dtype("out_dtype", b.out_dtype);
  if (b.n == 0) return;
  // n * 4 must be addressable; the other sizes are smaller.
  const std::size_t f32_bytes = checked_mul(b.n, 4, "adamw: n * sizeof(float)");
  const bool has_out = b.param_out != nullptr;
  Range r[5] = {
      {"param", reinterpret_cast<std::uintptr_t>(b.param), 0},
      {"exp_avg", reinterpret_cast<std::uintptr_t>(b.exp_avg), 0},
      {"exp_avg_sq", reinterpret_cast<std::uintptr_t>(b.exp_avg_sq), 0},
      {"grad", reinterpret_cast<std::uintptr_t>(b.grad), 0},
      {"param_out", reinterpret_cast<std::uintptr_t>(b.param_out), 0},
  };
  const std::size_t sizes[5] = {4, 4, 4, dtype_size(b.grad_dtype),
                                has_out ? dtype_size(b.out_dtype) : 1};
  const int count = has_out ? 5 : 4;
  for (int i = 0; i < count; ++i) {
    if (r[i].begin == 0) {
      bad(std::string("null ") + r[i].name + " with n = " + std::to_string(b.n) +
          "; valid: a buffer of n elements" +
          (i == 4 ? " (param_out may be null: no copy-out)" : ""));
    }
    if (r[i].begin % sizes[i] != 0) {
      bad(std::string(r[i].name) + " at " + std::to_string(r[i].begin) +
          " is not aligned to its element size " + std::to_string(sizes[i]) +
          "; valid: a multiple of " + std::to_string(sizes[i]));
    }
    const std::size_t bytes = i < 3 ? f32_bytes : b.n * sizes[i];
    if (r[i].begin > UINTPTR_MAX - bytes) {
      bad(std::string(r[i].name) +
          " + n elements wraps the address space (n = " + std::to_string(b.n) + ")");
    }
    r[i].end = r[i].begin + bytes;
  }
  for (int i = 0; i < count; ++i) {
    for (int j = i + 1; j < count; ++j) {
      if (r[i].begin < r[j].end && r[j].begin < r[i].end) {
        bad(std::string(r[i].name) + " and " + r[j].name + " overlap (n = " + std::to_string(b.n) +
            "); valid: disjoint buffers");
      }
    }
  }
}

#ifdef MEMFIT_ADAMW_X86
// Sets MXCSR to its power-on value (all exceptions masked, round to nearest, no FTZ/DAZ) for
// the kernel on this thread and restores the caller's afterwards, so a caller's flush-to-zero
// mode (common in inference code) cannot change the bits.
class DefaultMxcsr {
 public:
  DefaultMxcsr() : saved_(_mm_getcsr()) { _mm_setcsr(kDefault); }
  ~DefaultMxcsr() { _mm_setcsr(saved_); }
  DefaultMxcsr(const DefaultMxcsr&) = delete;
  DefaultMxcsr& operator=(const DefaultMxcsr&) = delete;

 private:
  static constexpr unsigned kDefault = 0x1F80;
  unsigned saved_;
};
#else
struct DefaultMxcsr {};
#endif

detail::AdamWKernel pick_kernel() {
#ifdef MEMFIT_ADAMW_X86
  if (detail::cpu_has_avx512()) return &detail::adamw_avx512;
  if (detail::cpu_has_avx2_fma_f16c()) return &detail::adamw_avx2;
#endif
  return &detail::adamw_scalar;
}

// The scalar loop for one (grad, out) dtype pair; load/store are lambdas so they inline.
template <typename LoadG, typename StoreOut>
void scalar_loop(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin, std::size_t end,
                 LoadG load_g, StoreOut store_out) {
  float* const pp = b.param;
  float* const mp = b.exp_avg;
  float* const vp = b.exp_avg_sq;
  for (std::size_t i = begin; i < end; ++i) {
    // One operation per statement, in the header's order; only std::fma fuses.
    const float g = load_g(i) * k.grad_scale;
    const float m = std::fma(k.beta1, mp[i], k.one_minus_beta1 * g);
    const float t = k.one_minus_beta2 * g;
    const float v = std::fma(k.beta2, vp[i], t * g);
    const float d = std::fma(std::sqrt(v), k.inv_bc2_sqrt, k.eps);
    const float u = m / d;
    const float pd = pp[i] * k.decay;
    const float p = std::fma(k.neg_step_size, u, pd);
    mp[i] = m;
    vp[i] = v;
    pp[i] = p;
    store_out(i, p);
  }
}

template <typename LoadG>
void scalar_out(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin, std::size_t end,
                LoadG load_g) {
  if (b.param_out == nullptr) {
    return scalar_loop(k, b, begin, end, load_g, [](std::size_t, float) {});
  }
  auto* o = static_cast<unsigned char*>(b.param_out);
  switch (b.out_dtype) {
    case DType::kF32:
      return scalar_loop(k, b, begin, end, load_g,
                         [o](std::size_t i, float p) { std::memcpy(o + 4 * i, &p, 4); });
    case DType::kF16:
      return scalar_loop(k, b, begin, end, load_g, [o](std::size_t i, float p) {
        const std::uint16_t h = f32_to_f16(p);
        std::memcpy(o + 2 * i, &h, 2);
      });
    case DType::kBF16:
      return scalar_loop(k, b, begin, end, load_g, [o](std::size_t i, float p) {
        const std::uint16_t h = f32_to_bf16(p);
        std::memcpy(o + 2 * i, &h, 2);
      });
  }
}

}  // namespace

void adamw_step(const AdamWConstants& k, const AdamWBuffers& b, int threads) {
  detail::adamw_run(detail::adamw_dispatched(), k, b, threads);
}

const char* adamw_isa() {
#ifdef MEMFIT_ADAMW_X86
  const detail::AdamWKernel fn = detail::adamw_dispatched();
  if (fn == &detail::adamw_avx512) return "avx512";
  if (fn == &detail::adamw_avx2) return "avx2+fma+f16c";
#endif
  return "scalar";
}

namespace detail {

void adamw_scalar(const AdamWConstants& k, const AdamWBuffers& b, std::size_t begin,
                  std::size_t end) {
  const auto* g = static_cast<const unsigned char*>(b.grad);
  switch (b.grad_dtype) {
    case DType::kF32:
      return scalar_out(k, b, begin, end, [g](std::size_t i) {
        float x;
        std::memcpy(&x, g + 4 * i, 4);
        return x;
      });
    case DType::kF16:
      return scalar_out(k, b, begin, end, [g](std::size_t i) {
        std::uint16_t h;
        std::memcpy(&h, g + 2 * i, 2);
        return f16_to_f32(h);
      });
    case DType::kBF16:
      return scalar_out(k, b, begin, end, [g](std::size_t i) {
        std::uint16_t h;
        std::memcpy(&h, g + 2 * i, 2);
        return bf16_to_f32(h);
      });
  }
}

bool cpu_has_avx2_fma_f16c() {
#ifdef MEMFIT_ADAMW_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
             f16c = c & (1u << 29);
  if (!fma || !osxsave || !avx || !f16c) return false;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0x6u) != 0x6u) return false;  // the OS saves XMM and YMM state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b & (1u << 5)) != 0;  // AVX2
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#ifdef MEMFIT_ADAMW_X86
  if (!cpu_has_avx2_fma_f16c()) return false;  // the kernel also uses FMA and F16C
  unsigned a, b, c, d;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0xE6u) != 0xE6u) return false;  // opmask, ZMM_Hi256, Hi16_ZMM state saved too
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const unsigned need = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);  // F, DQ, BW, VL
  return (b & need) == need;
#else
  return false;
#endif
}

AdamWKernel adamw_dispatched() {
  static const AdamWKernel fn = pick_kernel();  // the CPU does not change under a process
  return fn;
}

void adamw_run(AdamWKernel kernel, const AdamWConstants& k, const AdamWBuffers& b, int threads) {
  if (kernel == nullptr) bad("null kernel");
  if (threads < 0) bad("threads = " + std::to_string(threads) + "; valid: 0 (all) or >= 1");
  validate_adamw_constants(k);
  check_buffers(b);
  if (b.n == 0) return;
  const std::size_t tiles = (b.n + kAdamWTile - 1) / kAdamWTile;
  const int team = threads == 0 ? omp_get_max_threads() : threads;
  if (team <= 1 || b.n < kParallelMin) {
    DefaultMxcsr mx;
    kernel(k, b, 0, b.n);
    return;
  }
  // Static schedule: each thread gets one contiguous run of tiles, which the hardware
  // prefetchers stream well; elementwise math makes the split invisible in the result.
#pragma omp parallel num_threads(team)
  {
    DefaultMxcsr mx;
#pragma omp for schedule(static)
    for (std::size_t t = 0; t < tiles; ++t) {
      const std::size_t begin = t * kAdamWTile;
      const std::size_t end = begin + kAdamWTile < b.n ? begin + kAdamWTile : b.n;
      kernel(k, b, begin, end);
    }
  }
}

}  // namespace detail

}  // namespace memfit
