// CPU GEMM against a naive double-precision reference: every A/B/C dtype combination, every
// transpose, batched-strided, alpha/beta, odd sizes, K = 0, poisoned outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>

#include "core/backend.h"
#include "core/cpu/cpu_backend.h"
#include "memory/error.h"
#include "tests/core/backend_testutil.h"

namespace memfit {
namespace {

using testing::HostBuf;
using testing::kAllDTypes;

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
};

std::string describe(const Case& c, DType da, DType db, DType dc) {
  return std::string("A ") + dtype_name(da) + " B " + dtype_name(db) + " C " + dtype_name(dc) +
         " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " batch=" + std::to_string(c.batch) + (c.ta ? " TA" : "") + (c.tb ? " TB" : "") +
         " alpha=" + std::to_string(c.alpha) + " beta=" + std::to_string(c.beta);
}

// Runs one case and compares every output element with the double reference computed from
// the quantized inputs (what the backend actually sees).
void run_case(const Case& c, DType da, DType db, DType dc, std::uint32_t seed) {
  SCOPED_TRACE(describe(c, da, db, dc));
  std::mt19937 rng(seed);
  const std::int64_t sa = c.m * c.k + c.pad_a;
  const std::int64_t sb = c.broadcast_b ? 0 : c.k * c.n;
  const std::int64_t sc = c.m * c.n + c.pad_c;
  HostBuf a(da, std::max<std::int64_t>(1, c.batch * sa));
  HostBuf b(db, std::max<std::int64_t>(1, c.broadcast_b ? c.k * c.n : c.batch * c.k * c.n));
  HostBuf cc(dc, std::max<std::int64_t>(1, c.batch * sc));
  a.randomize(rng);
  b.randomize(rng);
  // A's padding is NaN: reading it would poison the result.
  for (std::int64_t bi = 0; bi < c.batch; ++bi)
    for (std::int64_t p = c.m * c.k; p < sa; ++p) a.set(bi * sa + p, kNaN);
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
      ASSERT_EQ(cc.get(bi * sc + p), kSentinel) << "C padding written at batch " << bi;
    }
  }
  EXPECT_EQ(bad, 0);
}

using Combo = std::tuple<DType, DType, DType, int /* 0 NN, 1 NT, 2 TN, 3 TT */>;

class GemmCombo : public ::testing::TestWithParam<Combo> {};

TEST_P(GemmCombo, MatchesDoubleReference) {
  const auto [da, db, dc, tr] = GetParam();
  const bool ta = tr & 2, tb = tr & 1;
  const std::int64_t sizes[][3] = {{1, 1, 1}, {3, 17, 33}, {17, 3, 67}, {33, 67, 17}, {67, 1, 3}};
  std::uint32_t seed = 1;
  for (const auto& s : sizes) {
    // beta = 0 over a NaN-poisoned C, then alpha/beta both in play, batched.
    run_case({s[0], s[1], s[2], 1, ta, tb, 1.5f, 0.0f}, da, db, dc, seed++);
    run_case({s[0], s[1], s[2], 2, ta, tb, -0.5f, 0.25f}, da, db, dc, seed++);
  }
}

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  static const char* kTr[] = {"NN", "NT", "TN", "TT"};
  return std::string(dtype_name(std::get<0>(info.param))) + "_" +
         dtype_name(std::get<1>(info.param)) + "_" + dtype_name(std::get<2>(info.param)) + "_" +
         kTr[std::get<3>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAllTransposes, GemmCombo,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes),
                                            ::testing::ValuesIn(kAllDTypes),
                                            ::testing::ValuesIn(kAllDTypes),
                                            ::testing::Values(0, 1, 2, 3)),
                         combo_name);

TEST(Gemm, BatchedStridedWithPaddingAndBroadcast) {
  for (DType da : kAllDTypes) {
    for (DType dc : kAllDTypes) {
      for (int tr = 0; tr < 4; ++tr) {
        Case c{5, 7, 9, 3, bool(tr & 2), bool(tr & 1), 0.75f, -1.25f};
        c.pad_a = 5;
        c.broadcast_b = true;
        c.pad_c = 3;
        run_case(c, da, DType::kBF16, dc, 100 + tr);
        c.beta = 0.0f;
        run_case(c, da, DType::kF16, dc, 200 + tr);
      }
    }
  }
}

TEST(Gemm, LargerThanBlockingSizes) {
  // Past OpenBLAS's register and cache blocking in every dimension.
  run_case({131, 97, 259, 1, false, true, 1.0f, 0.0f}, DType::kBF16, DType::kBF16, DType::kF32, 7);
  run_case({97, 131, 259, 2, true, false, 1.0f, 1.0f}, DType::kF16, DType::kF32, DType::kBF16, 8);
}

TEST(Gemm, KZeroGivesBetaTimesC) {
  for (DType dc : kAllDTypes) {
    for (float beta : {0.0f, 2.0f, -0.5f}) {
      // A and B hold nothing: K = 0 must not read them.
      run_case({3, 17, 0, 2, false, false, 1.0f, beta}, DType::kF32, DType::kBF16, dc, 9);
      run_case({17, 3, 0, 1, true, true, 1.0f, beta}, DType::kF16, DType::kF32, dc, 10);
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
  // [[1,2],[3,4]] @ [[5,6],[7,8]] = [[19,22],[43,50]]: exact in every dtype.
  for (DType dt : kAllDTypes) {
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
