// MetaBackend's conv2d: the CPU backend's checks (they live in Backend), GEMM-class flops,
// operand bytes, and no memory touched (its tensors carry NullProvider addresses).
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "core/meta/meta_backend.h"
#include "memory/error.h"
#include "memory/null_provider.h"
#include "tests/core/backend_testutil.h"

namespace memfit {
namespace {

class MetaTensors {
 public:
  Tensor make(std::int64_t n, DType dt) {
    const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dt);
    void* p = null_.allocate(bytes == 0 ? 1 : bytes);
    ptrs_.push_back({p, bytes == 0 ? 1 : bytes});
    return Tensor(p, Shape{n}, dt, Device::kMeta);
  }
  ~MetaTensors() {
    for (auto& [p, n] : ptrs_) null_.deallocate(p, n);
  }

 private:
  NullProvider null_;
  std::vector<std::pair<void*, std::size_t>> ptrs_;
};

Conv2dDesc desc() {
  Conv2dDesc d;
  d.n = 3;
  d.h = 9;
  d.w = 8;
  d.c = 5;
  d.k = 6;
  d.r = 3;
  d.s = 2;
  d.stride_h = 2;
  d.pad_h = 1;
  return d;  // P = 5, Q = 7
}

TEST(MetaConv, CountsFlopsAndBytes) {
  MetaBackend be;
  MetaTensors mt;
  const Conv2dDesc d = desc();
  ASSERT_EQ(d.p(), 5);
  ASSERT_EQ(d.q(), 7);
  const std::int64_t ni = 3 * 9 * 8 * 5, nw = 6 * 3 * 2 * 5, no = 3 * 5 * 7 * 6;
  const std::int64_t flops = 2 * 3 * 5 * 7 * 6 * 3 * 2 * 5;
  const Tensor inp = mt.make(ni, DType::kBF16), w = mt.make(nw, DType::kBF16);
  const Tensor out = mt.make(no, DType::kBF16), dout = mt.make(no, DType::kBF16);
  const Tensor dinp = mt.make(ni, DType::kBF16), dw = mt.make(nw, DType::kF32);

  be.conv2d_forward(kDefaultStream, d, inp, w, out);
  MetaStats s = be.stats();
  EXPECT_EQ(s.calls(MetaOp::kConv2dForward), 1);
  EXPECT_EQ(s.total_calls(), 1);
  EXPECT_EQ(s.gemm_flops, flops);  // a convolution is GEMM-class work
  EXPECT_EQ(s.other_flops, 0);
  EXPECT_EQ(s.bytes_read, 2 * (ni + nw));
  EXPECT_EQ(s.bytes_written, 2 * no);

  be.reset_stats();
  be.conv2d_backward(kDefaultStream, d, dout, inp, w, &dinp, dw);
  s = be.stats();
  EXPECT_EQ(s.calls(MetaOp::kConv2dBackward), 1);
  EXPECT_EQ(s.gemm_flops, 2 * flops);                    // dinp and dweight
  EXPECT_EQ(s.bytes_read, 2 * (no + ni + nw) + 4 * nw);  // dweight accumulates: read too
  EXPECT_EQ(s.bytes_written, 2 * ni + 4 * nw);

  be.reset_stats();
  be.conv2d_backward(kDefaultStream, d, dout, inp, w, nullptr, dw);
  s = be.stats();
  EXPECT_EQ(s.gemm_flops, flops);  // dweight only
  EXPECT_EQ(s.bytes_written, 4 * nw);
}

TEST(MetaConv, RejectsWhatEveryBackendRejects) {
  MetaBackend be;
  MetaTensors mt;
  const Conv2dDesc d = desc();
  const Tensor inp = mt.make(3 * 9 * 8 * 5, DType::kF32), w = mt.make(6 * 3 * 2 * 5, DType::kF32);
  const Tensor out = mt.make(3 * 5 * 7 * 6 + 1, DType::kF32);
  testing::expect_invalid([&] { be.conv2d_forward(kDefaultStream, d, inp, w, out); },
                          {"meta", "conv2d_forward", "out", "(N,P,Q,K)"});
  const Tensor dw16 = mt.make(6 * 3 * 2 * 5, DType::kF16);
  const Tensor dout = mt.make(3 * 5 * 7 * 6, DType::kF32);
  testing::expect_invalid(
      [&] { be.conv2d_backward(kDefaultStream, d, dout, inp, w, nullptr, dw16); },
      {"meta", "conv2d_backward", "dweight", "f32"});
  EXPECT_EQ(be.stats().total_calls(), 0);
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

TEST(MetaConv, OpsHaveNames) {
  EXPECT_STREQ(meta_op_name(MetaOp::kConv2dForward), "conv2d_forward");
  EXPECT_STREQ(meta_op_name(MetaOp::kConv2dBackward), "conv2d_backward");
}

}  // namespace
}  // namespace memfit
