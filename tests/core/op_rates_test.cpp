// OpRates (core/meta/op_rates.h): the GEMM curve, per-op rates, the bandwidth fallback, and
// MetaBackend adding up each call's seconds when given rates.
#include "core/meta/op_rates.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/meta/meta_backend.h"
#include "memory/null_provider.h"

namespace memfit {
namespace {

OpRates sample() {
  OpRates r;
  r.gemm[OpRates::dtype_index(DType::kF32)] = {{1e6, 1e9}, {1e8, 1e11}};
  r.gemm[OpRates::dtype_index(DType::kBF16)] = {{1e6, 4e9}};
  r.ops[static_cast<std::size_t>(MetaOp::kGeluForward)][OpRates::dtype_index(DType::kF32)] = {
      1e-5, 2e9};
  r.bandwidth = 1e10;
  return r;
}

TEST(OpRates, GemmCurveIsLogLinearAndClampedAtTheEnds) {
  const OpRates r = sample();
  EXPECT_DOUBLE_EQ(r.gemm_rate(DType::kF32, 1e5), 1e9);   // below the first point
  EXPECT_DOUBLE_EQ(r.gemm_rate(DType::kF32, 1e9), 1e11);  // above the last
  EXPECT_NEAR(r.gemm_rate(DType::kF32, 1e7), 1e10, 1e-3);  // halfway in logs
  EXPECT_DOUBLE_EQ(r.gemm_rate(DType::kBF16, 1e9), 4e9);  // one point: that rate
  EXPECT_EQ(r.gemm_rate(DType::kF16, 1e9), 0);            // nothing measured
}

TEST(OpRates, SecondsPerOpKind) {
  const OpRates r = sample();
  // GEMM: flops over the curve's rate at that call size.
  EXPECT_DOUBLE_EQ(r.seconds(MetaOp::kGemm, DType::kF32, 1e8, 0, 123), 1e8 / 1e11);
  // A measured op: per call + work / rate, work = its flops.
  EXPECT_DOUBLE_EQ(r.seconds(MetaOp::kGeluForward, DType::kF32, 0, 4e9, 8e9), 1e-5 + 2.0);
  // Not measured (this dtype, or this op): bytes over the bandwidth.
  EXPECT_DOUBLE_EQ(r.seconds(MetaOp::kGeluForward, DType::kBF16, 0, 4e9, 8e9), 0.8);
  EXPECT_DOUBLE_EQ(r.seconds(MetaOp::kRope, DType::kF32, 0, 1e6, 5e9), 0.5);
  EXPECT_DOUBLE_EQ(r.seconds(MetaOp::kGemm, DType::kF16, 1e9, 0, 2e10), 2.0);
  OpRates none;
  EXPECT_EQ(none.seconds(MetaOp::kCopy, DType::kF32, 0, 0, 1e9), 0);
  // per_op comes on top of every call, whichever way it is priced.
  OpRates p = sample();
  p.per_op = 3e-6;
  EXPECT_DOUBLE_EQ(p.seconds(MetaOp::kGemm, DType::kF32, 1e8, 0, 123), 3e-6 + 1e8 / 1e11);
  EXPECT_DOUBLE_EQ(p.seconds(MetaOp::kGeluForward, DType::kF32, 0, 4e9, 8e9), 3e-6 + 1e-5 + 2.0);
  EXPECT_DOUBLE_EQ(p.seconds(MetaOp::kRope, DType::kF32, 0, 1e6, 5e9), 3e-6 + 0.5);
  // scale multiplies the kernel's seconds, not per_op.
  p.scale = 1.25;
  EXPECT_DOUBLE_EQ(p.seconds(MetaOp::kGemm, DType::kF32, 1e8, 0, 123), 3e-6 + 1.25 * 1e-3);
  EXPECT_DOUBLE_EQ(p.seconds(MetaOp::kGeluForward, DType::kF32, 0, 4e9, 8e9),
                   3e-6 + 1.25 * (1e-5 + 2.0));
  EXPECT_DOUBLE_EQ(p.seconds(MetaOp::kRope, DType::kF32, 0, 1e6, 5e9), 3e-6 + 1.25 * 0.5);
}

TEST(OpRates, MetaBackendAddsUpTheCallsItCounts) {
  const OpRates r = sample();
  MetaBackend be;
  NullProvider null;
  void* pa = null.allocate(64 * 32 * 4);
  void* pb = null.allocate(32 * 16 * 4);
  void* pc = null.allocate(64 * 16 * 4);
  const Tensor a(pa, Shape{64, 32}, DType::kF32, Device::kMeta);
  const Tensor b(pb, Shape{32, 16}, DType::kF32, Device::kMeta);
  const Tensor c(pc, Shape{64, 16}, DType::kF32, Device::kMeta);
  GemmDesc d;
  d.m = 64, d.n = 16, d.k = 32;
  be.gemm(kDefaultStream, d, a, b, c);
  EXPECT_EQ(be.stats().seconds, 0) << "no rates: no time";
  be.set_rates(&r);
  be.reset_stats();
  be.gemm(kDefaultStream, d, a, b, c);
  const double flops = 2.0 * 64 * 16 * 32;
  EXPECT_DOUBLE_EQ(be.stats().seconds, flops / r.gemm_rate(DType::kF32, flops));
  be.gelu_forward(kDefaultStream, c, c);
  const double gelu = r.seconds(MetaOp::kGeluForward, DType::kF32, 0,
                                static_cast<double>(MetaFlops::kGeluForward) * 64 * 16,
                                2.0 * 64 * 16 * 4);
  EXPECT_DOUBLE_EQ(be.stats().seconds, flops / r.gemm_rate(DType::kF32, flops) + gelu);
  be.set_rates(nullptr);
  null.deallocate(pa, 64 * 32 * 4);
  null.deallocate(pb, 32 * 16 * 4);
  null.deallocate(pc, 64 * 16 * 4);
}

}  // namespace
}  // namespace memfit
