// CPU AdamW (core/cpu/adamw.h): the specification re-implemented here in plain std::fma code
// and compared bit for bit; every kernel (scalar, AVX2, AVX-512, the dispatched one, any
// thread count) against the scalar reference bit for bit; the arithmetic against a double
// precision evaluation within a derived rounding bound; and the step against PyTorch's
// torch.optim.AdamW trajectory stored in tests/core/data/adamw_golden.bin (written by
// bench/torch_adamw.py --golden) within a tolerance explained at that test.
#include "core/cpu/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "memory/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define MEMFIT_TEST_X86 1
#endif

namespace memfit {
namespace {

using u16 = std::uint16_t;
using u32 = std::uint32_t;
using detail::AdamWKernel;

constexpr double kEps32 = 1.0 / (1 << 24);  // unit roundoff of binary32
constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

u32 bits(float f) {
  u32 u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(u32 u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Where a copy-out goes: none, or one of the three dtypes.
struct OutSel {
  bool on;
  DType dt;
};
constexpr OutSel kOuts[] = {
    {false, DType::kF32}, {true, DType::kF32}, {true, DType::kF16}, {true, DType::kBF16}};
std::string out_name(OutSel o) { return o.on ? dtype_name(o.dt) : "none"; }

float widen(const std::vector<unsigned char>& g, DType dt, std::size_t i) {
  if (dt == DType::kF32) {
    float f;
    std::memcpy(&f, g.data() + 4 * i, 4);
    return f;
  }
  u16 h;
  std::memcpy(&h, g.data() + 2 * i, 2);
  return dt == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
}

void store_grad(std::vector<unsigned char>& g, DType dt, std::size_t i, float x) {
  if (dt == DType::kF32) {
    std::memcpy(g.data() + 4 * i, &x, 4);
    return;
  }
  const u16 h = dt == DType::kF16 ? f32_to_f16(x) : f32_to_bf16(x);
  std::memcpy(g.data() + 2 * i, &h, 2);
}

struct State {
  std::vector<float> p, m, v;
  std::vector<unsigned char> out;  // copy-out bytes
};

struct Inputs {
  State s;
  std::vector<unsigned char> grad;
  DType gdt = DType::kF32;
};

// Values of optimizer-state scale with a spread of magnitudes, zeros, and f32 subnormals in
// gradients and second moments (the kernels must not flush them).
Inputs random_inputs(std::size_t n, DType gdt, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  Inputs in;
  in.gdt = gdt;
  in.s.p.resize(n);
  in.s.m.resize(n);
  in.s.v.resize(n);
  in.grad.resize(n * dtype_size(gdt));
  for (std::size_t i = 0; i < n; ++i) {
    const float scale = std::pow(10.0f, -6.0f + 7.0f * ud(rng));
    float g = nd(rng) * scale;
    const float r = ud(rng);
    if (r < 0.02f) g = 0.0f;
    if (r > 0.99f) g = from_bits(1 + (rng() & 0x7FFFFF)) * (r > 0.995f ? 1.0f : -1.0f);
    store_grad(in.grad, gdt, i, g);
    in.s.p[i] = nd(rng) * 0.05f;
    in.s.m[i] = nd(rng) * scale * 0.5f;
    const float sv = scale * scale * std::fabs(nd(rng));
    in.s.v[i] = r < 0.03f ? 0.0f : (r > 0.985f ? from_bits(1 + (rng() & 0xFFFF)) : sv);
  }
  return in;
}

// Buffers at 64-byte alignment plus a per-array element offset, so vector loads straddle
// cache lines and the arrays are misaligned against one another.
class Workspace {
 public:
  Workspace(const Inputs& in, OutSel o, unsigned shift) : n_(in.s.p.size()) {
    const std::size_t gsz = dtype_size(in.gdt), osz = dtype_size(o.dt);
    p_ = place(0, 4, shift % 16);
    m_ = place(1, 4, (shift + 5) % 16);
    v_ = place(2, 4, (shift + 11) % 16);
    g_ = place(3, gsz, (shift + 3) % 32);
    std::memcpy(p_, in.s.p.data(), n_ * 4);
    std::memcpy(m_, in.s.m.data(), n_ * 4);
    std::memcpy(v_, in.s.v.data(), n_ * 4);
    std::memcpy(g_, in.grad.data(), n_ * gsz);
    b_.n = n_;
    b_.param = reinterpret_cast<float*>(p_);
    b_.exp_avg = reinterpret_cast<float*>(m_);
    b_.exp_avg_sq = reinterpret_cast<float*>(v_);
    b_.grad = g_;
    b_.grad_dtype = in.gdt;
    if (o.on) {
      o_ = place(4, osz, (shift + 7) % 32);
      std::memset(o_, 0xA5, n_ * osz);
      b_.param_out = o_;
      b_.out_dtype = o.dt;
    }
  }
  const AdamWBuffers& buffers() const { return b_; }
  State state() const {
    State s;
    s.p.assign(b_.param, b_.param + n_);
    s.m.assign(b_.exp_avg, b_.exp_avg + n_);
    s.v.assign(b_.exp_avg_sq, b_.exp_avg_sq + n_);
    if (o_) s.out.assign(o_, o_ + n_ * dtype_size(b_.out_dtype));
    return s;
  }

 private:
  unsigned char* place(int k, std::size_t esz, unsigned off_elems) {
    raw_[k].resize(n_ * esz + 64 + 64 * esz);
    auto addr = reinterpret_cast<std::uintptr_t>(raw_[k].data());
    addr = (addr + 63) / 64 * 64 + off_elems * esz;
    return reinterpret_cast<unsigned char*>(addr);
  }
  std::size_t n_;
  std::vector<unsigned char> raw_[5];
  unsigned char *p_ = nullptr, *m_ = nullptr, *v_ = nullptr, *g_ = nullptr, *o_ = nullptr;
  AdamWBuffers b_;
};

// kernel == nullptr: the public adamw_step (dispatched).
State run(AdamWKernel kernel, const AdamWConstants& k, const Inputs& in, OutSel o,
          int threads = 0, unsigned shift = 1) {
  Workspace ws(in, o, shift);
  if (kernel == nullptr) {
    adamw_step(k, ws.buffers(), threads);
  } else {
    detail::adamw_run(kernel, k, ws.buffers(), threads);
  }
  return ws.state();
}

// Index of the first element whose bits differ (NaN == NaN whatever the payload), or -1.
template <typename T>
long first_diff(const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) == 0) continue;
    if constexpr (std::is_same_v<T, float>) {
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    }
    return static_cast<long>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<long>(a.size());
}

// Copy-outs compare by value: NaNs of either payload are equal.
bool same_out(const State& a, const State& b, DType dt, std::size_t* at) {
  const std::size_t n = a.p.size();
  for (std::size_t i = 0; i < n && !a.out.empty(); ++i) {
    const std::size_t sz = dtype_size(dt);
    if (std::memcmp(&a.out[i * sz], &b.out[i * sz], sz) == 0) continue;
    std::vector<unsigned char> ga(a.out.begin() + i * sz, a.out.begin() + (i + 1) * sz);
    std::vector<unsigned char> gb(b.out.begin() + i * sz, b.out.begin() + (i + 1) * sz);
    if (std::isnan(widen(ga, dt, 0)) && std::isnan(widen(gb, dt, 0))) continue;
    *at = i;
    return false;
  }
  return a.out.size() == b.out.size();
}

void expect_identical(const State& want, const State& got, DType out_dt, const std::string& ctx) {
  const long dp = first_diff(want.p, got.p), dm = first_diff(want.m, got.m),
             dv = first_diff(want.v, got.v);
  EXPECT_EQ(dp, -1) << ctx << ": param differs at " << dp;
  EXPECT_EQ(dm, -1) << ctx << ": exp_avg differs at " << dm;
  EXPECT_EQ(dv, -1) << ctx << ": exp_avg_sq differs at " << dv;
  std::size_t at = 0;
  EXPECT_TRUE(same_out(want, got, out_dt, &at)) << ctx << ": copy-out differs at " << at;
}

AdamWConstants test_constants(std::int64_t step = 3, double grad_scale = 1.0 / 1024) {
  AdamWOptions o;
  o.lr = 2e-3;
  o.weight_decay = 0.05;
  return adamw_constants(o, step, grad_scale);
}

// ---- the specification ------------------------------------------------------------------

TEST(AdamWConstants, FollowTheSpecification) {
  AdamWOptions o;  // torch defaults
  o.lr = 1e-3;
  const AdamWConstants k = adamw_constants(o, 1, 0.25);
  EXPECT_EQ(k.grad_scale, 0.25f);
  EXPECT_EQ(k.beta1, 0.9f);
  EXPECT_EQ(k.one_minus_beta1, static_cast<float>(1.0 - 0.9));
  EXPECT_EQ(k.beta2, 0.999f);
  EXPECT_EQ(k.one_minus_beta2, static_cast<float>(1.0 - 0.999));
  EXPECT_EQ(k.eps, 1e-8f);
  // Step 1: bias corrections are 1 - beta, so step size lr / 0.1 and 1 / sqrt(0.001).
  EXPECT_EQ(k.neg_step_size, static_cast<float>(-1e-3 / (1.0 - 0.9)));
  EXPECT_EQ(k.inv_bc2_sqrt, static_cast<float>(1.0 / std::sqrt(1.0 - 0.999)));
  EXPECT_EQ(k.decay, static_cast<float>(1.0 - 1e-3 * 0.01));
  // Late steps: the corrections vanish.
  const AdamWConstants late = adamw_constants(o, 1000000);
  EXPECT_EQ(late.neg_step_size, -1e-3f);
  EXPECT_EQ(late.inv_bc2_sqrt, 1.0f);
  EXPECT_EQ(late.grad_scale, 1.0f);
}

// The header's per-element sequence, transcribed independently of adamw.cpp.
void spec_element(const AdamWConstants& k, float graw, float& p, float& m, float& v) {
  const float g = graw * k.grad_scale;
  m = std::fma(k.beta1, m, k.one_minus_beta1 * g);
  v = std::fma(k.beta2, v, (k.one_minus_beta2 * g) * g);
  const float d = std::fma(std::sqrt(v), k.inv_bc2_sqrt, k.eps);
  p = std::fma(k.neg_step_size, m / d, p * k.decay);
}

TEST(AdamW, ScalarReferenceIsTheSpecification) {
  for (DType gdt : kDTypes) {
    const Inputs in = random_inputs(4099, gdt, 7);
    const AdamWConstants k = test_constants();
    const State got = run(detail::adamw_scalar, k, in, {true, DType::kF32});
    State want = in.s;
    want.out.resize(in.s.p.size() * 4);
    for (std::size_t i = 0; i < in.s.p.size(); ++i) {
      spec_element(k, widen(in.grad, gdt, i), want.p[i], want.m[i], want.v[i]);
      std::memcpy(&want.out[4 * i], &want.p[i], 4);
    }
    expect_identical(want, got, DType::kF32, std::string("grad ") + dtype_name(gdt));
  }
}

TEST(AdamW, CopyOutIsConvertOfTheUpdatedParams) {
  const Inputs in = random_inputs(1000, DType::kBF16, 8);
  for (DType odt : kDTypes) {
    const State s = run(nullptr, test_constants(), in, {true, odt});
    std::vector<unsigned char> want(s.p.size() * dtype_size(odt));
    convert(s.p.data(), DType::kF32, want.data(), odt, s.p.size());
    EXPECT_EQ(want, s.out) << "out " << dtype_name(odt);
  }
}

// ---- kernels against one another, bit for bit --------------------------------------------

void compare_kernels(AdamWKernel kernel, const char* name, std::size_t n, std::uint32_t seed,
                     int threads) {
  for (DType gdt : kDTypes) {
    const Inputs in = random_inputs(n, gdt, seed + static_cast<unsigned>(gdt));
    for (OutSel o : kOuts) {
      const AdamWConstants k = test_constants(1 + static_cast<int>(n % 7));
      const State want = run(detail::adamw_scalar, k, in, o, 1, 0);
      const State got = run(kernel, k, in, o, threads, static_cast<unsigned>(n) % 13 + 1);
      expect_identical(want, got, o.dt,
                       std::string(name) + " n=" + std::to_string(n) + " grad " +
                           dtype_name(gdt) + " out " + out_name(o));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(AdamW, DispatchedMatchesScalarForEveryLengthTo200) {
  std::printf("dispatched kernel: %s\n", adamw_isa());
  for (std::size_t n = 0; n <= 200; ++n) compare_kernels(nullptr, adamw_isa(), n, 100 + n, 1);
}

TEST(AdamW, DispatchedMatchesScalarOnOneMillionAnyThreads) {
  compare_kernels(nullptr, adamw_isa(), 1000003, 5, 0);
  compare_kernels(nullptr, adamw_isa(), 1000003, 5, 3);
}

#ifdef MEMFIT_TEST_X86
TEST(AdamW, Avx2MatchesScalar) {
  if (!detail::cpu_has_avx2_fma_f16c()) {
    GTEST_SKIP() << "this CPU lacks AVX2/FMA/F16C: the AVX2 kernel cannot run here";
  }
  for (std::size_t n = 0; n <= 200; ++n) compare_kernels(detail::adamw_avx2, "avx2", n, 300 + n, 1);
  compare_kernels(detail::adamw_avx2, "avx2", 1 << 20, 9, 0);
}

TEST(AdamW, Avx512MatchesScalar) {
  if (!detail::cpu_has_avx512()) {
    GTEST_SKIP() << "this CPU lacks AVX-512 F/BW/VL/DQ (or the OS does not enable it): the "
                    "AVX-512 kernel is unverified on this machine";
  }
  for (std::size_t n = 0; n <= 200; ++n) {
    compare_kernels(detail::adamw_avx512, "avx512", n, 500 + n, 1);
  }
  compare_kernels(detail::adamw_avx512, "avx512", 1 << 20, 11, 0);
}

TEST(AdamW, CallerFlushToZeroModeChangesNothingAndIsRestored) {
  const Inputs in = random_inputs(70000, DType::kF32, 12);  // above the parallel threshold
  const AdamWConstants k = test_constants();
  const State want = run(detail::adamw_scalar, k, in, {true, DType::kBF16}, 1);
  const unsigned saved = _mm_getcsr();
  const unsigned ftz_daz = saved | 0x8040u;
  _mm_setcsr(ftz_daz);
  const State got1 = run(nullptr, k, in, {true, DType::kBF16}, 1);
  const unsigned after = _mm_getcsr();
  const State got0 = run(nullptr, k, in, {true, DType::kBF16}, 0);
  _mm_setcsr(saved);
  EXPECT_EQ(after, ftz_daz);
  expect_identical(want, got1, DType::kBF16, "FTZ/DAZ set, 1 thread");
  expect_identical(want, got0, DType::kBF16, "FTZ/DAZ set, all threads");
}
#endif

TEST(AdamW, NonFiniteValuesPropagateAlikeOnEveryKernel) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {inf, -inf, nan, -nan, 0.0f, -0.0f, 3e38f, -3e38f, 1e-45f, 1e20f};
  const std::size_t n = 10 * 10 * 4;
  for (DType gdt : kDTypes) {
    Inputs in = random_inputs(n, gdt, 13);
    for (std::size_t i = 0; i < n; ++i) {
      store_grad(in.grad, gdt, i, specials[i % 10]);
      const float s = specials[(i / 10) % 10];
      switch (i / 100) {
        case 0: in.s.p[i] = s; break;
        case 1: in.s.m[i] = s; break;
        case 2: in.s.v[i] = std::fabs(s); break;
        default: in.s.v[i] = s; break;  // a negative or NaN v: sqrt gives NaN on every path
      }
    }
    for (OutSel o : kOuts) {
      const State want = run(detail::adamw_scalar, test_constants(), in, o, 1);
      const State got = run(nullptr, test_constants(), in, o, 1, 2);
      expect_identical(want, got, o.dt, std::string("specials grad ") + dtype_name(gdt));
    }
  }
}

TEST(AdamW, TrajectoriesStayIdenticalOverSteps) {
  AdamWOptions o;
  o.lr = 1e-2;
  Inputs a = random_inputs(20011, DType::kBF16, 14);
  Inputs b = a;
  for (int step = 1; step <= 10; ++step) {
    const AdamWConstants k = adamw_constants(o, step, 1.0 / 3.0);
    a.s = run(detail::adamw_scalar, k, a, {true, DType::kBF16}, 1);
    b.s = run(nullptr, k, b, {true, DType::kBF16}, 0, step);
    expect_identical(a.s, b.s, DType::kBF16, "step " + std::to_string(step));
    // A new gradient each step, the same for both.
    Inputs next = random_inputs(a.s.p.size(), DType::kBF16, 100 + step);
    a.grad = b.grad = next.grad;
  }
}

// ---- arithmetic against double precision -------------------------------------------------

// One element of the step in double from the same float constants, with a bound on what the
// binary32 evaluation may differ: each float operation adds at most one unit roundoff (u) of
// its result, propagated through the later operations; kTiny covers subnormal results, whose
// error is absolute. The bound is some 1.5-2x the worst case, so a changed order or a lost
// term (several u or more) fails it.
struct Ref {
  double p, m, v;
  double tol_p, tol_m, tol_v;
};
constexpr double kTiny = 4.0 * 1.401298464324817e-45;

Ref reference(const AdamWConstants& k, float graw, float p0, float m0, float v0) {
  const double u = kEps32;
  const double g = static_cast<double>(graw) * k.grad_scale;
  const double tm = static_cast<double>(k.beta1) * m0, tg = static_cast<double>(k.one_minus_beta1) * g;
  Ref r;
  r.m = tm + tg;
  r.v = static_cast<double>(k.beta2) * v0 + static_cast<double>(k.one_minus_beta2) * g * g;
  const double d = std::sqrt(r.v) * k.inv_bc2_sqrt + k.eps;
  const double q = r.m / d;
  const double pd = static_cast<double>(p0) * k.decay;
  r.p = pd + static_cast<double>(k.neg_step_size) * q;
  r.tol_m = 3 * u * (std::fabs(tm) + std::fabs(tg)) + kTiny;  // g, product, fma
  r.tol_v = 5 * u * r.v + kTiny;                              // no cancellation: all terms >= 0
  const double tol_q = r.tol_m / d + 7 * u * std::fabs(q);    // d: sqrt, fma, half of v's
  r.tol_p = 2 * u * std::fabs(pd) + std::fabs(k.neg_step_size) * tol_q +
            u * std::fabs(k.neg_step_size * q) + u * std::fabs(r.p) + kTiny;
  return r;
}

TEST(AdamW, WithinRoundingOfDoublePrecision) {
  for (DType gdt : kDTypes) {
    for (double scale : {1.0, 1.0 / 1024, 1.0 / 3}) {
      const Inputs in = random_inputs(100000, gdt, 15);
      AdamWOptions o;
      o.lr = 5e-3;
      o.weight_decay = 0.1;
      const AdamWConstants k = adamw_constants(o, 2, scale);
      const State s = run(nullptr, k, in, {false, DType::kF32});
      double worst = 0;  // largest error / tolerance seen, printed to show the bound's slack
      for (std::size_t i = 0; i < s.p.size(); ++i) {
        const Ref r = reference(k, widen(in.grad, gdt, i), in.s.p[i], in.s.m[i], in.s.v[i]);
        const double em = std::fabs(s.m[i] - r.m), ev = std::fabs(s.v[i] - r.v),
                     ep = std::fabs(s.p[i] - r.p);
        ASSERT_LE(em, r.tol_m) << "m at " << i << " grad " << dtype_name(gdt);
        ASSERT_LE(ev, r.tol_v) << "v at " << i << " grad " << dtype_name(gdt);
        ASSERT_LE(ep, r.tol_p) << "p at " << i << " grad " << dtype_name(gdt);
        worst = std::max({worst, em / r.tol_m, ev / r.tol_v, ep / r.tol_p});
      }
      std::printf("grad %-4s scale %.6g: worst error / bound = %.3f\n", dtype_name(gdt), scale,
                  worst);
    }
  }
}

TEST(AdamW, ThirtyStepTrajectoryTracksExactMath) {
  // The float kernel against AdamW evaluated entirely in double (double hyperparameters, no
  // float constants): after 30 steps the master weights agree to a few float ulps of the
  // weight plus a few ulps of the accumulated updates (lr per step at most).
  const std::size_t n = 5000;
  AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  Inputs in = random_inputs(n, DType::kF32, 16);
  std::fill(in.s.m.begin(), in.s.m.end(), 0.0f);
  std::fill(in.s.v.begin(), in.s.v.end(), 0.0f);
  std::vector<double> p(in.s.p.begin(), in.s.p.end()), m(n, 0.0), v(n, 0.0);
  const int steps = 30;
  for (int t = 1; t <= steps; ++t) {
    const Inputs g = random_inputs(n, DType::kF32, 1000 + t);
    in.grad = g.grad;
    in.s = run(nullptr, adamw_constants(o, t), in, {false, DType::kF32});
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    for (std::size_t i = 0; i < n; ++i) {
      const double gi = widen(in.grad, DType::kF32, i);
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * gi;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * gi * gi;
      p[i] -= o.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
    }
  }
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double tol = 8 * kEps32 * (std::fabs(p[i]) + steps * o.lr);
    ASSERT_LE(std::fabs(in.s.p[i] - p[i]), tol) << "p at " << i;
    ASSERT_LE(std::fabs(in.s.v[i] - v[i]), 8 * steps * kEps32 * v[i] + kTiny) << "v at " << i;
    worst = std::max(worst, std::fabs(in.s.p[i] - p[i]) / tol);
  }
  std::printf("30 steps: worst param error / tolerance = %.3f\n", worst);
}

// ---- against PyTorch -----------------------------------------------------------------------

std::string golden_path() {
  if (const char* dir = std::getenv("MEMFIT_SOURCE_DIR")) {
    return std::string(dir) + "/tests/core/data/adamw_golden.bin";
  }
  std::string here = __FILE__;  // the source tree, when the variable is not set (a direct run)
  return here.substr(0, here.find_last_of('/')) + "/data/adamw_golden.bin";
}

template <typename T>
void read_into(std::ifstream& f, T* dst, std::size_t count) {
  f.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(count * sizeof(T)));
  if (!f) throw std::runtime_error("adamw_golden.bin: truncated");
}

// PyTorch (1.13, the Debian package that wrote the file) evaluates the same formula in another
// order: p * decay, m * beta1 + (1 - beta1) g, v * beta2 + (1 - beta2) g g, sqrt(v) /
// sqrt(bc2) + eps (a division where we multiply by the rounded reciprocal), p + (-step) (m / d),
// with its own choice of where vector code fuses. Each step both sides round each quantity a
// few times, so they may differ by a few u (unit roundoff) of the terms per step, and earlier
// differences carry on through m, v and p. The tolerance follows that propagation with K = 4 u
// per step and term: m's against S_t = beta1 S_{t-1} + (1 - beta1)|g_t| (the size of the terms
// m sums, which bounds errors even where m cancels to near zero); v's relative, growing by K u
// a step; p's carried (times the decay) plus this step's K u of |p| and the update's error.
TEST(AdamW, MatchesPyTorchGoldenTrajectory) {
  std::ifstream f(golden_path(), std::ios::binary);
  ASSERT_TRUE(f) << "cannot open " << golden_path()
                 << " (regenerate: /usr/bin/python3 bench/torch_adamw.py --golden <path>)";
  char magic[8];
  u32 version = 0, cases = 0;
  char torch_version[33] = {};
  read_into(f, magic, 8);
  read_into(f, &version, 1);
  read_into(f, &cases, 1);
  read_into(f, torch_version, 32);
  ASSERT_EQ(std::string(magic, 8), "MFADAMW1");
  ASSERT_EQ(version, 1u);
  ASSERT_GE(cases, 1u);
  constexpr double K = 4;
  const double u = kEps32;
  for (u32 c = 0; c < cases; ++c) {
    u32 n = 0, steps = 0;
    double hp[5];
    read_into(f, &n, 1);
    read_into(f, &steps, 1);
    read_into(f, hp, 5);
    ASSERT_GT(n, 0u);
    AdamWOptions o{hp[0], hp[1], hp[2], hp[3], hp[4]};
    Inputs in;
    in.gdt = DType::kF32;
    in.s.p.resize(n);
    in.s.m.assign(n, 0.0f);
    in.s.v.assign(n, 0.0f);
    in.grad.resize(4 * n);
    read_into(f, in.s.p.data(), n);
    std::vector<double> sm(n, 0.0), tol_p(n, 0.0);
    std::vector<float> tp(n), tm(n), tv(n);
    double worst[3] = {0, 0, 0};  // error / tolerance of m, v, p: the bound's slack
    for (u32 t = 1; t <= steps; ++t) {
      read_into(f, in.grad.data(), 4 * n);
      read_into(f, tp.data(), n);
      read_into(f, tm.data(), n);
      read_into(f, tv.data(), n);
      const AdamWConstants k = adamw_constants(o, t);
      in.s = run(nullptr, k, in, {false, DType::kF32});
      for (u32 i = 0; i < n; ++i) {
        const double g = widen(in.grad, DType::kF32, i);
        sm[i] = o.beta1 * sm[i] + (1 - o.beta1) * std::fabs(g);
        const double tol_m = K * u * sm[i] + kTiny;
        const double tol_v = K * u * t * tv[i] + kTiny;
        const double d = std::sqrt(static_cast<double>(tv[i])) * k.inv_bc2_sqrt + k.eps;
        const double q = tm[i] / d;
        const double tol_q = tol_m / d + std::fabs(q) * (K / 2 * t + K) * u;
        tol_p[i] = tol_p[i] * std::fabs(k.decay) + K * u * std::fabs(tp[i]) +
                   std::fabs(k.neg_step_size) * tol_q + kTiny;
        const double em = std::fabs(in.s.m[i] - tm[i]), ev = std::fabs(in.s.v[i] - tv[i]),
                     ep = std::fabs(in.s.p[i] - tp[i]);
        ASSERT_LE(em, tol_m) << "case " << c << " step " << t << " exp_avg at " << i;
        ASSERT_LE(ev, tol_v) << "case " << c << " step " << t << " exp_avg_sq at " << i;
        ASSERT_LE(ep, tol_p[i]) << "case " << c << " step " << t << " param at " << i;
        worst[0] = std::max(worst[0], em / tol_m);
        worst[1] = std::max(worst[1], ev / tol_v);
        worst[2] = std::max(worst[2], ep / tol_p[i]);
      }
    }
    std::printf(
        "golden case %u (n=%u, %u steps, torch %s): worst error / tolerance: exp_avg %.3f, "
        "exp_avg_sq %.3f, param %.3f\n",
        c, n, steps, torch_version, worst[0], worst[1], worst[2]);
  }
}

// ---- validation ------------------------------------------------------------------------------

template <typename F>
void expect_invalid(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InvalidArgument; expected one naming '" << needle << "'";
  } catch (const InvalidArgument& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find(needle), std::string::npos) << w;
    EXPECT_NE(w.find("valid"), std::string::npos) << w;
  }
}

TEST(AdamWValidation, OptionsAndStep) {
  const auto with = [](auto edit) {
    AdamWOptions o;
    edit(o);
    return o;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_invalid([&] { adamw_constants(with([](auto& o) { o.lr = -1e-3; }), 1); }, "lr");
  expect_invalid([&] { adamw_constants(with([&](auto& o) { o.lr = nan; }), 1); }, "lr");
  expect_invalid([&] { adamw_constants(with([](auto& o) { o.beta1 = 1.0; }), 1); }, "beta1");
  expect_invalid([&] { adamw_constants(with([](auto& o) { o.beta1 = -0.1; }), 1); }, "beta1");
  expect_invalid([&] { adamw_constants(with([](auto& o) { o.beta2 = 1.0; }), 1); }, "beta2");
  expect_invalid([&] { adamw_constants(with([](auto& o) { o.eps = 0.0; }), 1); }, "eps");
  expect_invalid([&] { adamw_constants(with([](auto& o) { o.eps = 1e-50; }), 1); }, "eps");
  expect_invalid([&] { adamw_constants(with([](auto& o) { o.weight_decay = -1; }), 1); },
                 "weight_decay");
  expect_invalid([&] { adamw_constants(AdamWOptions{}, 0); }, "step");
  expect_invalid([&] { adamw_constants(AdamWOptions{}, 1, 0.0); }, "grad_scale");
  expect_invalid([&] { adamw_constants(AdamWOptions{}, 1, 1e300); }, "grad_scale");
  // A beta within 2^-25 of 1 rounds to 1.0f, which would freeze the moment.
  expect_invalid([&] { adamw_constants(with([](auto& o) { o.beta2 = 1 - 1e-9; }), 1); }, "beta2");
  EXPECT_NO_THROW(adamw_constants(with([](auto& o) { o.beta1 = 0.0; o.lr = 0.0; }), 1));
}

TEST(AdamWValidation, BuffersConstantsAndThreadsWriteNothing) {
  const std::size_t n = 64;
  Inputs in = random_inputs(n, DType::kBF16, 17);
  Workspace ws(in, {true, DType::kF16}, 1);
  const AdamWConstants k = test_constants();
  const State before = ws.state();
  const auto edit = [&](auto f) {
    AdamWBuffers b = ws.buffers();
    f(b);
    return b;
  };
  expect_invalid([&] { adamw_step(k, edit([](auto& b) { b.param = nullptr; })); }, "param");
  expect_invalid([&] { adamw_step(k, edit([](auto& b) { b.grad = nullptr; })); }, "grad");
  expect_invalid(
      [&] {
        adamw_step(k, edit([](auto& b) {
                     b.exp_avg = reinterpret_cast<float*>(reinterpret_cast<char*>(b.exp_avg) + 1);
                   }));
      },
      "exp_avg");
  expect_invalid(
      [&] {
        adamw_step(k, edit([](auto& b) { b.grad = static_cast<const char*>(b.grad) + 1; }));
      },
      "grad");
  expect_invalid([&] { adamw_step(k, edit([](auto& b) { b.exp_avg_sq = b.param + 8; })); },
                 "overlap");
  expect_invalid([&] { adamw_step(k, edit([](auto& b) { b.param_out = b.exp_avg + 3; })); },
                 "param_out");
  expect_invalid([&] { adamw_step(k, edit([](auto& b) { b.grad_dtype = DType{7}; })); },
                 "grad_dtype");
  expect_invalid([&] { adamw_step(k, edit([](auto& b) { b.out_dtype = DType{9}; })); },
                 "out_dtype");
  expect_invalid([&] { adamw_step(k, ws.buffers(), -1); }, "threads");
  AdamWConstants bad = k;
  bad.beta1 = 1.0f;
  expect_invalid([&] { adamw_step(bad, ws.buffers()); }, "beta1");
  bad = k;
  bad.eps = 0.0f;
  expect_invalid([&] { adamw_step(bad, ws.buffers()); }, "eps");
  bad = k;
  bad.neg_step_size = std::numeric_limits<float>::quiet_NaN();
  expect_invalid([&] { adamw_step(bad, ws.buffers()); }, "neg_step_size");
  const State after = ws.state();
  expect_identical(before, after, DType::kF16, "after rejected calls");
  // n == 0 touches nothing, so it needs no buffers.
  AdamWBuffers empty;
  EXPECT_NO_THROW(adamw_step(k, empty));
  // And the valid call does write.
  adamw_step(k, ws.buffers());
  EXPECT_NE(first_diff(before.p, ws.state().p), -1);
}

}  // namespace
}  // namespace memfit
