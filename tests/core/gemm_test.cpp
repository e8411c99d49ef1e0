// CPU GEMM against a naive double-precision reference on each engine (MEMFIT_CPU_GEMM = blas,
// dnnl, auto): every A/B/C dtype combination, every transpose, batched-strided with broadcast
// operands, alpha/beta, odd sizes, K = 0, poisoned outputs; the engine choice and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/gemm_engine.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "tests/core/backend_testutil.h"

namespace memfit {
namespace {

using cpu::GemmEngine;
using cpu::GemmPath;
using testing::HostBuf;
using testing::kAllDTypes;

constexpr GemmEngine kEngines[] = {GemmEngine::kBlas, GemmEngine::kDnnl, GemmEngine::kAuto};

// Sets MEMFIT_CPU_GEMM for the scope and restores what was there.
class ScopedGemmEngine {
 public:
  explicit ScopedGemmEngine(const char* value) {
    if (const char* old = std::getenv(cpu::kGemmEngineEnv)) old_ = old;
    if (value == nullptr) {
      ::unsetenv(cpu::kGemmEngineEnv);
    } else {
      ::setenv(cpu::kGemmEngineEnv, value, 1);
    }
  }
  explicit ScopedGemmEngine(GemmEngine e) : ScopedGemmEngine(cpu::gemm_engine_name(e)) {}
  ~ScopedGemmEngine() {
    if (old_) {
      ::setenv(cpu::kGemmEngineEnv, old_->c_str(), 1);
    } else {
      ::unsetenv(cpu::kGemmEngineEnv);
    }
  }
  ScopedGemmEngine(const ScopedGemmEngine&) = delete;
  ScopedGemmEngine& operator=(const ScopedGemmEngine&) = delete;

 private:
  std::optional<std::string> old_;
};

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Relative error allowed on the output: its rounding (half an ulp is 2^-24, 2^-11, 2^-8 for
// f32, f16, bf16), with a margin of about 2x.
double out_eps(DType t) {
  switch (t) {
    case DType::kF32:
      return 1e-6;
    case DType::kF16:
      return 1e-3;
    case DType::kBF16:
      return 1e-2;
  }
  return 0;
}

struct Case {
  std::int64_t m, n, k, batch;
  bool ta, tb;
  float alpha, beta;
  std::int64_t pad_a = 0;    // extra elements between A's batch entries
  bool broadcast_b = false;  // stride_b = 0
  std::int64_t pad_c = 0;
  bool broadcast_a = false;  // stride_a = 0 (pad_a then unused)
};

std::string describe(const Case& c, DType da, DType db, DType dc, GemmEngine e) {
  return std::string("engine ") + cpu::gemm_engine_name(e) + " A " + dtype_name(da) + " B " +
         dtype_name(db) + " C " + dtype_name(dc) +
         " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " batch=" + std::to_string(c.batch) + (c.ta ? " TA" : "") + (c.tb ? " TB" : "") +
         " alpha=" + std::to_string(c.alpha) + " beta=" + std::to_string(c.beta) +
         (c.broadcast_a ? " A broadcast" : "") + (c.broadcast_b ? " B broadcast" : "");
}

// Runs one case on `engine` through CpuBackend::gemm and compares every output element with
// the double reference computed from the quantized inputs (what the backend actually sees).
// Returns the path the engine took.
GemmPath run_case(const Case& c, DType da, DType db, DType dc, std::uint32_t seed,
                  GemmEngine engine = GemmEngine::kBlas) {
  SCOPED_TRACE(describe(c, da, db, dc, engine));
  ScopedGemmEngine scoped(engine);
  std::mt19937 rng(seed);
  const std::int64_t sa = c.broadcast_a ? 0 : c.m * c.k + c.pad_a;
  const std::int64_t sb = c.broadcast_b ? 0 : c.k * c.n;
  const std::int64_t sc = c.m * c.n + c.pad_c;
  HostBuf a(da, std::max<std::int64_t>(1, c.broadcast_a ? c.m * c.k : c.batch * sa));
  HostBuf b(db, std::max<std::int64_t>(1, c.broadcast_b ? c.k * c.n : c.batch * c.k * c.n));
  HostBuf cc(dc, std::max<std::int64_t>(1, c.batch * sc));
  a.randomize(rng);
  b.randomize(rng);
  // A's padding is NaN: reading it would poison the result.
  if (!c.broadcast_a) {
    for (std::int64_t bi = 0; bi < c.batch; ++bi)
      for (std::int64_t p = c.m * c.k; p < sa; ++p) a.set(bi * sa + p, kNaN);
  }
  // With beta == 0, C starts as NaN and must be overwritten; otherwise random. C's padding
  // holds a sentinel that must survive.
  constexpr float kSentinel = 1024.0f;  // exact in every dtype
  for (std::int64_t bi = 0; bi < c.batch; ++bi) {
    for (std::int64_t p = 0; p < sc; ++p) {
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      float v = p >= c.m * c.n ? kSentinel : (c.beta == 0.0f ? kNaN : u(rng));
      cc.set(bi * sc + p, v);
    }
  }
  HostBuf c0(dc, cc.size());
  for (std::int64_t i = 0; i < cc.size(); ++i) c0.set(i, cc.get(i));

  GemmDesc d;
  d.m = c.m;
  d.n = c.n;
  d.k = c.k;
  d.trans_a = c.ta;
  d.trans_b = c.tb;
  d.alpha = c.alpha;
  d.beta = c.beta;
  d.batch = c.batch;
  d.stride_a = sa;
  d.stride_b = sb;
  d.stride_c = sc;
  const GemmPath path = cpu::plan_gemm(d, da, db, dc, engine).path;
  CpuBackend be;
  be.gemm(kDefaultStream, d, a.t(), b.t(), cc.t());

  int bad = 0;
  for (std::int64_t bi = 0; bi < c.batch; ++bi) {
    for (std::int64_t i = 0; i < c.m; ++i) {
      for (std::int64_t j = 0; j < c.n; ++j) {
        double acc = 0, mag = 0;
        for (std::int64_t p = 0; p < c.k; ++p) {
          // op(A)(i,p) and op(B)(p,j) from their stored row-major layouts.
          double av = a.get(bi * sa + (c.ta ? p * c.m + i : i * c.k + p));
          double bv = b.get(bi * sb + (c.tb ? j * c.k + p : p * c.n + j));
          acc += av * bv;
          mag += std::fabs(av * bv);
        }
        double ref = c.alpha * acc;
        mag *= std::fabs(c.alpha);
        if (c.beta != 0.0f) {
          double old = c0.get(bi * sc + i * c.n + j);
          ref += c.beta * old;
          mag += std::fabs(c.beta * old);
        }
        const double got = cc.get(bi * sc + i * c.n + j);
        // f32 accumulation error grows like sqrt(K) ulps of the magnitude summed.
        const double tol = out_eps(dc) * std::fabs(ref) +
                           1e-6 * std::sqrt(static_cast<double>(c.k) + 1) * mag + 1e-30;
        if (!(std::fabs(got - ref) <= tol) && ++bad <= 5) {
          ADD_FAILURE() << "batch " << bi << " (" << i << "," << j << "): got " << got << " want "
                        << ref << " tol " << tol;
        }
      }
    }
    for (std::int64_t p = c.m * c.n; p < sc; ++p) {
      if (cc.get(bi * sc + p) != kSentinel) {
        ADD_FAILURE() << "C padding written at batch " << bi << " element " << p;
        return path;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  return path;
}

using Combo = std::tuple<DType, DType, DType, int /* 0 NN, 1 NT, 2 TN, 3 TT */, GemmEngine>;

class GemmCombo : public ::testing::TestWithParam<Combo> {};

TEST_P(GemmCombo, MatchesDoubleReference) {
  const auto [da, db, dc, tr, engine] = GetParam();
  const bool ta = tr & 2, tb = tr & 1;
  const std::int64_t sizes[][3] = {{1, 1, 1}, {3, 17, 33}, {17, 3, 67}, {33, 67, 17}, {67, 1, 3}};
  std::uint32_t seed = 1;
  int dnnl_calls = 0;
  for (const auto& s : sizes) {
    // beta = 0 over a NaN-poisoned C, then alpha/beta both in play, batched.
    dnnl_calls += run_case({s[0], s[1], s[2], 1, ta, tb, 1.5f, 0.0f}, da, db, dc, seed++, engine) ==
                  GemmPath::kDnnl;
    dnnl_calls += run_case({s[0], s[1], s[2], 2, ta, tb, -0.5f, 0.25f}, da, db, dc, seed++,
                           engine) == GemmPath::kDnnl;
  }
  // oneDNN 2.6 runs f32, and bf16 on any AVX-512 CPU (emulated without AVX512-BF16), into an
  // output of the inputs' dtype or f32 whenever it is asked to; BLAS never uses it.
  const bool dnnl_can = da == db &&
                        (da == DType::kF32 || (da == DType::kBF16 && cpu::dnnl_isa().avx512_core)) &&
                        (dc == da || dc == DType::kF32);
  if (engine == GemmEngine::kDnnl && dnnl_can) EXPECT_EQ(dnnl_calls, 10);
  if (engine == GemmEngine::kBlas || da != db) EXPECT_EQ(dnnl_calls, 0);
}

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  static const char* kTr[] = {"NN", "NT", "TN", "TT"};
  return std::string(cpu::gemm_engine_name(std::get<4>(info.param))) + "_" +
         dtype_name(std::get<0>(info.param)) + "_" + dtype_name(std::get<1>(info.param)) + "_" +
         dtype_name(std::get<2>(info.param)) + "_" + kTr[std::get<3>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAllTransposes, GemmCombo,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes),
                                            ::testing::ValuesIn(kAllDTypes),
                                            ::testing::ValuesIn(kAllDTypes),
                                            ::testing::Values(0, 1, 2, 3),
                                            ::testing::ValuesIn(kEngines)),
                         combo_name);

TEST(Gemm, BatchedStridedWithPaddingAndBroadcast) {
  for (GemmEngine e : kEngines) {
    for (DType da : kAllDTypes) {
      for (DType dc : kAllDTypes) {
        for (int tr = 0; tr < 4; ++tr) {
          Case c{5, 7, 9, 3, bool(tr & 2), bool(tr & 1), 0.75f, -1.25f};
          c.pad_a = 5;
          c.broadcast_b = true;
          c.pad_c = 3;
          run_case(c, da, DType::kBF16, dc, 100 + tr, e);
          run_case(c, da, da, dc, 300 + tr, e);  // one dtype: oneDNN's case
          c.beta = 0.0f;
          run_case(c, da, DType::kF16, dc, 200 + tr, e);
          run_case(c, da, da, dc, 400 + tr, e);
          // A broadcast instead (B strided with padding-free batches).
          Case ca{6, 5, 11, 4, bool(tr & 2), bool(tr & 1), 1.0f, 0.5f};
          ca.broadcast_a = true;
          ca.pad_c = 2;
          run_case(ca, da, da, dc, 500 + tr, e);
        }
      }
    }
  }
}

TEST(Gemm, DnnlRunsTheSixteenBitCasesItCan) {
  // Under dnnl, one-dtype bf16 products go to oneDNN on AVX-512 CPUs (AVX512-BF16 kernels where
  // present); f16 goes there only if this oneDNN has an implementation, else to BLAS.
  const GemmPath bf16 = run_case({33, 65, 47, 3, false, true, 1.0f, 1.0f}, DType::kBF16,
                                 DType::kBF16, DType::kBF16, 11, GemmEngine::kDnnl);
  if (cpu::dnnl_isa().avx512_core) EXPECT_EQ(bf16, GemmPath::kDnnl);
  run_case({33, 65, 47, 3, true, false, 0.5f, 0.0f}, DType::kF16, DType::kF16, DType::kF16, 12,
           GemmEngine::kDnnl);
}

TEST(Gemm, LargerThanBlockingSizes) {
  // Past OpenBLAS's and oneDNN's register and cache blocking in every dimension.
  for (GemmEngine e : kEngines) {
    run_case({131, 97, 259, 1, false, true, 1.0f, 0.0f}, DType::kBF16, DType::kBF16, DType::kF32, 7,
             e);
    run_case({97, 131, 259, 2, true, false, 1.0f, 1.0f}, DType::kF16, DType::kF32, DType::kBF16, 8,
             e);
    run_case({97, 131, 259, 2, true, false, 1.0f, 1.0f}, DType::kBF16, DType::kBF16, DType::kBF16,
             8, e);
    run_case({257, 129, 300, 1, true, true, 1.0f, 1.0f}, DType::kF32, DType::kF32, DType::kF32, 13,
             e);
  }
}

TEST(Gemm, KZeroGivesBetaTimesC) {
  for (GemmEngine e : kEngines) {
    for (DType dc : kAllDTypes) {
      for (float beta : {0.0f, 2.0f, -0.5f}) {
        // A and B hold nothing: K = 0 must not read them.
        run_case({3, 17, 0, 2, false, false, 1.0f, beta}, DType::kF32, DType::kBF16, dc, 9, e);
        run_case({17, 3, 0, 1, true, true, 1.0f, beta}, DType::kF16, DType::kF32, dc, 10, e);
        run_case({5, 4, 0, 3, false, true, 1.0f, beta}, DType::kBF16, DType::kBF16, dc, 10, e);
      }
    }
  }
  // Exactly beta * C (beta = 2 is exact in every dtype) and exactly 0 over NaN.
  CpuBackend be;
  HostBuf a(DType::kF32, 1), b(DType::kF32, 1), c(DType::kBF16, 6);
  for (int i = 0; i < 6; ++i) c.set(i, 0.5f + i);
  GemmDesc d;
  d.m = 2;
  d.n = 3;
  d.k = 0;
  d.beta = 2.0f;
  be.gemm(kDefaultStream, d, a.t(), b.t(), c.t());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.get(i), 2.0f * (0.5f + i));
  c.fill(kNaN);
  d.beta = 0.0f;
  be.gemm(kDefaultStream, d, a.t(), b.t(), c.t());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.get(i), 0.0f);
}

TEST(Gemm, EmptyDimensionsAreNoOps) {
  CpuBackend be;
  HostBuf a(DType::kF32, 4), b(DType::kF32, 4), c(DType::kF32, 4);
  c.fill(kNaN);
  GemmDesc d;
  d.m = 0;
  d.n = 2;
  d.k = 2;
  be.gemm(kDefaultStream, d, a.t(), b.t(), c.t());
  d.m = 2;
  d.batch = 0;
  be.gemm(kDefaultStream, d, a.t(), b.t(), c.t());
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(c.get(i)));
  // Zero-element tensors with no memory are fine when nothing is touched.
  Tensor none(nullptr, Shape{0}, DType::kF32, Device::kCpu);
  d.m = d.n = d.k = 0;
  d.batch = 1;
  be.gemm(kDefaultStream, d, none, none, none);
}

TEST(Gemm, ExactSmallProduct) {
  // [[1,2],[3,4]] @ [[5,6],[7,8]] = [[19,22],[43,50]]: exact in every dtype and engine.
  for (auto [e, dt] : [] {
         std::vector<std::pair<GemmEngine, DType>> v;
         for (GemmEngine e : kEngines)
           for (DType dt : kAllDTypes) v.emplace_back(e, dt);
         return v;
       }()) {
    SCOPED_TRACE(std::string(cpu::gemm_engine_name(e)) + " " + dtype_name(dt));
    ScopedGemmEngine scoped(e);
    CpuBackend be;
    HostBuf a(dt, 4), b(dt, 4), c(dt, 4);
    const float av[] = {1, 2, 3, 4}, bv[] = {5, 6, 7, 8};
    for (int i = 0; i < 4; ++i) {
      a.set(i, av[i]);
      b.set(i, bv[i]);
    }
    GemmDesc d;
    d.m = d.n = d.k = 2;
    be.gemm(kDefaultStream, d, a.t(Shape{2, 2}), b.t(Shape{2, 2}), c.t(Shape{2, 2}));
    EXPECT_EQ(c.get(0), 19);
    EXPECT_EQ(c.get(1), 22);
    EXPECT_EQ(c.get(2), 43);
    EXPECT_EQ(c.get(3), 50);
    d.trans_a = d.trans_b = true;  // A^T B^T = (BA)^T = [[23,31],[34,46]]
    be.gemm(kDefaultStream, d, a.t(), b.t(), c.t());
    EXPECT_EQ(c.get(0), 23);
    EXPECT_EQ(c.get(1), 31);
    EXPECT_EQ(c.get(2), 34);
    EXPECT_EQ(c.get(3), 46);
  }
}

TEST(GemmEngine, BadVariableIsAConfigErrorNamingItAndTheValidValues) {
  EXPECT_EQ(cpu::parse_gemm_engine(nullptr), GemmEngine::kAuto);
  EXPECT_EQ(cpu::parse_gemm_engine(""), GemmEngine::kAuto);
  EXPECT_EQ(cpu::parse_gemm_engine("auto"), GemmEngine::kAuto);
  EXPECT_EQ(cpu::parse_gemm_engine("blas"), GemmEngine::kBlas);
  EXPECT_EQ(cpu::parse_gemm_engine("dnnl"), GemmEngine::kDnnl);
  ScopedGemmEngine scoped("mkl");
  CpuBackend be;
  HostBuf a(DType::kBF16, 4), b(DType::kBF16, 4), c(DType::kF32, 4);
  c.fill(3.0f);
  GemmDesc d;
  d.m = d.n = d.k = 2;
  try {
    be.gemm(kDefaultStream, d, a.t(), b.t(), c.t());
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    for (const char* want : {"MEMFIT_CPU_GEMM", "'mkl'", "auto", "blas", "dnnl"}) {
      EXPECT_NE(what.find(want), std::string::npos) << want << " not in: " << what;
    }
  }
  EXPECT_EQ(c.get(0), 3.0f);  // nothing written
}

TEST(GemmEngine, AutoPlansByDtypeAndIsa) {
  GemmDesc d;
  d.m = 64;
  d.n = 48;
  d.k = 32;
  d.trans_b = true;
  const auto path = [&](DType a, DType b, DType c, GemmEngine e) {
    return cpu::plan_gemm(d, a, b, c, e).path;
  };
  const DType f32 = DType::kF32, bf16 = DType::kBF16, f16 = DType::kF16;
  EXPECT_EQ(path(bf16, bf16, f32, GemmEngine::kAuto),
            cpu::dnnl_isa().bf16 ? GemmPath::kDnnl : GemmPath::kBlas);
  EXPECT_EQ(path(f32, f32, f32, GemmEngine::kAuto),
            cpu::dnnl_isa().avx512_core ? GemmPath::kDnnl : GemmPath::kBlas);
  EXPECT_EQ(path(f16, f16, f16, GemmEngine::kAuto), GemmPath::kBlas);
  EXPECT_EQ(path(bf16, f32, f32, GemmEngine::kAuto), GemmPath::kBlas);  // mixed
  EXPECT_EQ(path(bf16, bf16, f32, GemmEngine::kBlas), GemmPath::kBlas);
  EXPECT_EQ(cpu::dnnl_chosen_by_auto(bf16), cpu::dnnl_isa().bf16);
  // The BLAS path's scratch: the widened operands that are not f32.
  EXPECT_EQ(cpu::plan_gemm(d, bf16, f32, bf16, GemmEngine::kBlas).scratch_floats,
            std::size_t{64 * 32 + 64 * 48});
  EXPECT_EQ(cpu::plan_gemm(d, f32, f32, f32, GemmEngine::kBlas).scratch_floats, 0u);
  // The oneDNN path's: its scratchpad, rounded up to floats, the same on every call.
  const cpu::GemmPlan p = cpu::plan_gemm(d, f32, f32, f32, GemmEngine::kDnnl);
  ASSERT_EQ(p.path, GemmPath::kDnnl);
  EXPECT_EQ(p.scratch_floats, (p.dnnl->scratch_bytes() + 3) / 4);
  EXPECT_EQ(cpu::plan_gemm(d, f32, f32, f32, GemmEngine::kDnnl).dnnl, p.dnnl);  // cached
  // k == 0 and empty GEMMs never reach oneDNN.
  GemmDesc k0 = d;
  k0.k = 0;
  EXPECT_EQ(cpu::plan_gemm(k0, f32, f32, f32, GemmEngine::kDnnl).path, GemmPath::kBlas);
  GemmDesc empty = d;
  empty.n = 0;
  EXPECT_EQ(cpu::plan_gemm(empty, f32, f32, f32, GemmEngine::kDnnl).path, GemmPath::kNone);
  EXPECT_EQ(cpu::plan_gemm(empty, f32, f32, f32, GemmEngine::kDnnl).scratch_floats, 0u);
}

// Each engine: the same GEMM twice gives the same bits, on a worker stream too, and its scratch
// comes from the workspace allocator as Category::kWorkspace "cpu.gemm.scratch" blocks of
// exactly gemm_scratch_floats() floats.
TEST(GemmEngine, DeterministicAndScratchFromTheWorkspaceAllocator) {
  for (GemmEngine e : kEngines) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(cpu::gemm_engine_name(e)) + " " + dtype_name(dt));
      ScopedGemmEngine scoped(e);
      std::mt19937 rng(21);
      GemmDesc d;
      d.m = 96;
      d.n = 80;
      d.k = 200;
      d.trans_a = true;
      d.beta = 1.0f;
      HostBuf a(dt, d.m * d.k), b(dt, d.k * d.n);
      a.randomize(rng);
      b.randomize(rng);
      HostBuf c1(dt, d.m * d.n), c2(dt, d.m * d.n), c3(dt, d.m * d.n);
      c1.randomize(rng);
      for (std::int64_t i = 0; i < c1.size(); ++i) c3.set(i, c2.set(i, c1.get(i)));

      CpuBackend be({.worker_streams = true});
      HostProvider host;
      CachingAllocator alloc(host, {}, &be.stream_sync());
      be.set_workspace_allocator(&alloc);
      int allocs = 0;
      alloc.add_listener([&](const AllocatorEvent& ev) {
        if (ev.kind == EventKind::kAlloc && ev.category == Category::kWorkspace &&
            ev.tag == "cpu.gemm.scratch") {
          ++allocs;
        }
      });
      be.gemm(kDefaultStream, d, a.t(), b.t(), c1.t());
      be.gemm(kDefaultStream, d, a.t(), b.t(), c2.t());
      StreamId s = be.create_stream();
      be.gemm(s, d, a.t(), b.t(), c3.t());
      be.synchronize(s);
      for (std::int64_t i = 0; i < c1.size(); ++i) {
        ASSERT_EQ(c1.get(i), c2.get(i)) << i;
        ASSERT_EQ(c1.get(i), c3.get(i)) << i;
      }
      const std::size_t want = cpu::gemm_scratch_floats(d, a.t(), b.t(), c1.t()) * sizeof(float);
      EXPECT_EQ(allocs, want == 0 ? 0 : 3);
      EXPECT_EQ(alloc.stats().requested_bytes[kStatAll].allocated,
                static_cast<std::int64_t>(3 * want));
      if (e == GemmEngine::kBlas) EXPECT_EQ(want, dt == DType::kF32 ? 0u : 4u * (96 * 200 + 200 * 80 + 96 * 80));
      be.set_workspace_allocator(nullptr);
      be.destroy_stream(s);
    }
  }
}

TEST(GemmEngine, ConcurrentCallsOnOneCachedMatmul) {
  // Two worker streams run the same shape at once: one cached primitive, two scratchpads.
  ScopedGemmEngine scoped(GemmEngine::kDnnl);
  CpuBackend be({.worker_streams = true});
  StreamId s1 = be.create_stream(), s2 = be.create_stream();
  std::mt19937 rng(5);
  GemmDesc d;
  d.m = d.n = d.k = 128;
  HostBuf a(DType::kF32, d.m * d.k), b(DType::kF32, d.k * d.n), ref(DType::kF32, d.m * d.n);
  a.randomize(rng);
  b.randomize(rng);
  be.gemm(kDefaultStream, d, a.t(), b.t(), ref.t());
  std::vector<HostBuf> out1, out2;
  for (int i = 0; i < 8; ++i) {
    out1.emplace_back(DType::kF32, d.m * d.n);
    out2.emplace_back(DType::kF32, d.m * d.n);
  }
  for (int i = 0; i < 8; ++i) {
    be.gemm(s1, d, a.t(), b.t(), out1[static_cast<std::size_t>(i)].t());
    be.gemm(s2, d, a.t(), b.t(), out2[static_cast<std::size_t>(i)].t());
  }
  be.synchronize(s1);
  be.synchronize(s2);
  for (int i = 0; i < 8; ++i) {
    for (std::int64_t j = 0; j < d.m * d.n; ++j) {
      ASSERT_EQ(out1[static_cast<std::size_t>(i)].get(j), ref.get(j));
      ASSERT_EQ(out2[static_cast<std::size_t>(i)].get(j), ref.get(j));
    }
  }
  be.destroy_stream(s1);
  be.destroy_stream(s2);
}

TEST(Gemm, FlopsCount) {
  GemmDesc d;
  d.m = 3;
  d.n = 5;
  d.k = 7;
  d.batch = 2;
  EXPECT_EQ(d.flops(), 2 * 3 * 5 * 7 * 2);
  d.k = 0;
  EXPECT_EQ(d.flops(), 0);
  d.m = d.n = d.k = std::int64_t{1} << 31;
  d.batch = 1 << 20;
  EXPECT_EQ(d.flops(), std::numeric_limits<std::int64_t>::max());
}

}  // namespace
}  // namespace memfit
