// conv2d on the CPU backend against a naive double-precision convolution written here, whose
// backward is itself checked against central finite differences; strides, padding and odd
// sizes in every storage dtype; determinism across thread counts and worker streams; and the
// argument checks every backend shares (backend_conv.cpp).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "tests/core/conv_testutil.h"
#include "tests/core/nn_testutil.h"

namespace memfit {
namespace {

using namespace testing;  // NOLINT

constexpr StreamId s0 = kDefaultStream;

Vec ref_forward(const Conv2dDesc& d, const Vec& inp, const Vec& w) {
  return ref_conv_forward(d, inp, w);
}
RefConvGrads ref_backward(const Conv2dDesc& d, const Vec& dout, const Vec& inp, const Vec& w) {
  return ref_conv_backward(d, dout, inp, w);
}

Vec rand_vec(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Vec v(n);
  for (double& x : v) x = u(rng);
  return v;
}

TEST(ConvDesc, SizesAndFlops) {
  const Conv2dDesc d = conv(2, 7, 6, 3, 4, 3, 2, 2, 1, 1, 0);
  EXPECT_EQ(d.p(), (7 + 2 - 3) / 2 + 1);  // 4
  EXPECT_EQ(d.q(), (6 - 2) / 1 + 1);      // 5
  EXPECT_EQ(d.flops(), 2 * 2 * 4 * 5 * 4 * 3 * 2 * 3);
  EXPECT_EQ(d.invalid_reason(), "");
  EXPECT_NE(d.str().find("stride=(2,1) pad=(1,0)"), std::string::npos) << d.str();
  // Products past int64 saturate instead of wrapping; such a descriptor is never valid.
  Conv2dDesc big = conv(std::int64_t{1} << 40, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 1, 1);
  EXPECT_EQ(big.flops(), std::numeric_limits<std::int64_t>::max());
  EXPECT_NE(big.invalid_reason(), "");
  // p()/q() of sizes out of range are 0, never a negative or wrapped size.
  EXPECT_EQ(conv(1, 2, 2, 1, 1, 5, 1).p(), 0);
  EXPECT_EQ(conv(1, 2, 2, 1, 1, 1, 1, 0).p(), 0);
  Conv2dDesc huge_pad = conv(1, 2, 2, 1, 1, 1, 1);
  huge_pad.pad_h = std::numeric_limits<std::int64_t>::max() / 2;
  EXPECT_EQ(huge_pad.p(), 0);
}

// The reference's backward is the gradient of its forward: <dout, conv(inp, w)> by central
// differences in inp and w.
TEST(ConvOps, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(3);
  for (const Conv2dDesc& d :
       {conv(2, 5, 4, 2, 3, 3, 2, 2, 1, 1, 1), conv(1, 4, 5, 3, 2, 2, 3, 1, 2, 0, 2)}) {
    const Vec inp = rand_vec(static_cast<std::size_t>(d.n * d.h * d.w * d.c), rng);
    const Vec w = rand_vec(static_cast<std::size_t>(d.k * d.r * d.s * d.c), rng);
    const Vec dout = rand_vec(static_cast<std::size_t>(d.n * d.p() * d.q() * d.k), rng);
    const RefConvGrads g = ref_backward(d, dout, inp, w);
    const Vec fd_in = fd_grad([&](const Vec& x) { return dot(dout, ref_forward(d, x, w)); }, inp);
    const Vec fd_w = fd_grad([&](const Vec& x) { return dot(dout, ref_forward(d, inp, x)); }, w);
    expect_vec_near(g.dinp, fd_in, 1e-6, "dinp " + d.str());
    expect_vec_near(g.dw, fd_w, 1e-6, "dweight " + d.str());
  }
}

// Odd sizes, strides, asymmetric padding, 1x1 filters, a filter as large as the padded image,
// channel counts that are not multiples of a vector width.
const Conv2dDesc kCases[] = {
    conv(2, 5, 7, 3, 4, 3, 3, 1, 1, 1, 1),     conv(3, 9, 6, 5, 7, 3, 2, 2, 3, 1, 0),
    conv(1, 8, 8, 17, 9, 1, 1, 1, 1, 0, 0),    conv(2, 3, 4, 2, 3, 5, 6, 1, 1, 1, 1),
    conv(2, 11, 10, 4, 6, 4, 3, 3, 2, 2, 1),   conv(1, 1, 1, 1, 1, 1, 1),
    conv(4, 12, 12, 16, 32, 3, 3, 2, 2, 1, 1),  // the example's second layer (parallel paths)
};

class ConvOpsDtype : public ::testing::TestWithParam<DType> {};

TEST_P(ConvOpsDtype, ForwardAndBackwardMatchTheReference) {
  const DType dt = GetParam();
  CpuBackend be;
  std::mt19937 rng(11);
  for (const Conv2dDesc& d : kCases) {
    SCOPED_TRACE(d.str());
    HT inp(Shape{d.n, d.h * d.w, d.c}, dt), w(Shape{d.k, d.r, d.s, d.c}, dt);
    HT out(Shape{d.n, d.p() * d.q(), d.k}, dt), dout(Shape{d.n, d.p() * d.q(), d.k}, dt);
    HT dinp(Shape{d.n, d.h * d.w, d.c}, dt), dw(Shape{d.k, d.r, d.s, d.c}, DType::kF32);
    inp.rand(rng);
    w.rand(rng);
    dout.rand(rng);
    dw.rand(rng);  // dweight accumulates onto what it holds
    out.poison();
    dinp.poison();  // written, never read
    const Vec dw0 = dw.vals();

    be.conv2d_forward(s0, d, inp, w, out);
    // References on the stored (rounded) values; sums of up to R*S*C products accumulate in
    // f32, so the absolute tolerance grows with the term count.
    const double terms = static_cast<double>(d.r * d.s * d.c);
    expect_close(out, ref_forward(d, inp.vals(), w.vals()), dt, "out", 1 + terms / 8);

    const Tensor dinp_t = dinp;
    be.conv2d_backward(s0, d, dout, inp, w, &dinp_t, dw);
    const RefConvGrads g = ref_backward(d, dout.vals(), inp.vals(), w.vals());
    expect_close(dinp, g.dinp, dt, "dinp", 1 + static_cast<double>(d.r * d.s * d.k) / 8);
    Vec dw_ref = dw0;
    for (std::size_t i = 0; i < dw_ref.size(); ++i) dw_ref[i] += g.dw[i];
    // dweight is f32; its terms are products of stored values, summed over N*P*Q in f32.
    expect_close(dw, dw_ref, DType::kF32, "dweight",
                 1 + static_cast<double>(d.n * d.p() * d.q()) / 4, 4);
  }
}

TEST_P(ConvOpsDtype, WithoutDinpOnlyDweightChanges) {
  const DType dt = GetParam();
  CpuBackend be;
  std::mt19937 rng(5);
  const Conv2dDesc d = conv(2, 6, 5, 3, 4, 3, 3, 2, 1, 1, 1);
  HT inp(Shape{d.n * d.h * d.w * d.c}, dt), w(Shape{d.k * d.r * d.s * d.c}, dt);
  HT dout(Shape{d.n * d.p() * d.q() * d.k}, dt), dw(Shape{d.k * d.r * d.s * d.c}, DType::kF32);
  inp.rand(rng);
  w.rand(rng);
  dout.rand(rng);
  dw.fill(0.0f);
  const Vec inp0 = inp.vals(), w0 = w.vals(), dout0 = dout.vals();
  be.conv2d_backward(s0, d, dout, inp, w, nullptr, dw);
  expect_close(dw, ref_backward(d, dout0, inp0, w0).dw, DType::kF32, "dweight", 4, 4);
  EXPECT_EQ(inp.vals(), inp0);
  EXPECT_EQ(w.vals(), w0);
  EXPECT_EQ(dout.vals(), dout0);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, ConvOpsDtype, ::testing::ValuesIn(kAllDTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

std::vector<unsigned char> bytes_of(const HT& t) {
  const Tensor v = t;
  const auto* p = static_cast<const unsigned char*>(v.raw());
  return {p, p + v.nbytes()};
}

// Every output bit is the same with one thread, with the whole team, and on a worker stream.
TEST(ConvOps, DeterministicAcrossThreadsAndStreams) {
  const Conv2dDesc d = conv(4, 12, 12, 16, 32, 3, 3, 2, 2, 1, 1);
  ASSERT_GE(d.flops() / 2, 64 * 1024) << "large enough for the parallel paths";
  std::mt19937 rng(9);
  HT inp(Shape{d.n * d.h * d.w * d.c}, DType::kBF16), w(Shape{d.k * d.r * d.s * d.c}, DType::kBF16);
  HT dout(Shape{d.n * d.p() * d.q() * d.k}, DType::kBF16);
  inp.rand(rng);
  w.rand(rng);
  dout.rand(rng);
  struct Run {
    std::vector<unsigned char> out, dinp, dw;
  };
  auto run = [&](CpuBackend& be, StreamId s) {
    HT out(Shape{d.n * d.p() * d.q() * d.k}, DType::kBF16), dinp(Shape{inp.n()}, DType::kBF16);
    HT dw(Shape{w.n()}, DType::kF32);
    dw.fill(0.5f);
    be.conv2d_forward(s, d, inp, w, out);
    const Tensor dinp_t = dinp;
    be.conv2d_backward(s, d, dout, inp, w, &dinp_t, dw);
    be.synchronize(s);
    return Run{bytes_of(out), bytes_of(dinp), bytes_of(dw)};
  };
  CpuBackend inline_be;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(std::max(threads, 2));  // a team even on a one-core machine
  const Run team = run(inline_be, s0);
  omp_set_num_threads(1);
  const Run one = run(inline_be, s0);
  omp_set_num_threads(threads);
  CpuBackend worker_be({.worker_streams = true});
  const StreamId ws = worker_be.create_stream();
  const Run worker = run(worker_be, ws);
  for (const Run* r : {&one, &worker}) {
    EXPECT_EQ(r->out, team.out);
    EXPECT_EQ(r->dinp, team.dinp);
    EXPECT_EQ(r->dw, team.dw);
  }
}

TEST(ConvOps, EmptyBatchIsANoOp) {
  CpuBackend be;
  const Conv2dDesc d = conv(0, 4, 4, 2, 3, 3, 3);
  HT inp(Shape{0}, DType::kF32), out(Shape{0}, DType::kF32), w(Shape{3 * 9 * 2}, DType::kF32);
  HT dw(Shape{3 * 9 * 2}, DType::kF32);
  dw.fill(2.0f);
  be.conv2d_forward(s0, d, inp, w, out);
  be.conv2d_backward(s0, d, out, inp, w, nullptr, dw);
  for (double v : dw.vals()) EXPECT_EQ(v, 2.0);
}

// ---- argument checks (shared by every backend: they live in Backend) -------------------------

TEST(ConvChecks, RejectBadCallsAndWriteNothing) {
  CpuBackend be;
  const Conv2dDesc d = conv(2, 5, 5, 3, 4, 3, 3, 1, 1, 1, 1);
  const std::int64_t ni = d.n * d.h * d.w * d.c, nw = d.k * d.r * d.s * d.c;
  const std::int64_t no = d.n * d.p() * d.q() * d.k;
  HT inp(Shape{ni}, DType::kF32), w(Shape{nw}, DType::kF32), out(Shape{no}, DType::kF32);
  HT dout(Shape{no}, DType::kF32), dinp(Shape{ni}, DType::kF32), dw(Shape{nw}, DType::kF32);
  HT small(Shape{ni - 1}, DType::kF32), w16(Shape{nw}, DType::kF16), dw16(Shape{nw}, DType::kBF16);
  out.fill(7.0f);
  dinp.fill(7.0f);
  dw.fill(7.0f);
  const Tensor dinp_t = dinp, small_t = small;

  expect_invalid([&] { be.conv2d_forward(s0, d, small, w, out); },
                 {"cpu", "conv2d_forward", "inp", std::to_string(ni).c_str(), "(N,H,W,C)"});
  expect_invalid([&] { be.conv2d_forward(s0, d, inp, small, out); },
                 {"conv2d_forward", "weight", "(K,R,S,C)"});
  expect_invalid([&] { be.conv2d_forward(s0, d, inp, w, small); },
                 {"conv2d_forward", "out", std::to_string(no).c_str(), "(N,P,Q,K)"});
  expect_invalid([&] { be.conv2d_forward(s0, d, inp, w16, out); },
                 {"conv2d_forward", "weight", "f16", "same dtype as inp"});
  HostBuf shared(DType::kF32, ni + no);  // out's first element is inp's last
  expect_invalid([&] { be.conv2d_forward(s0, d, shared.at(0, ni), w, shared.at(ni - 1, no)); },
                 {"conv2d_forward", "out", "overlap"});
  expect_invalid([&] { be.conv2d_forward(StreamId{77}, d, inp, w, out); }, {"conv2d_forward"});
  const Tensor meta_inp(Tensor(inp).raw(), Shape{ni}, DType::kF32, Device::kMeta);
  expect_invalid([&] { be.conv2d_forward(s0, d, meta_inp, w, out); },
                 {"conv2d_forward", "inp", "meta"});

  // Descriptors: each rule, named.
  struct Bad {
    Conv2dDesc d;
    const char* part;
  };
  Conv2dDesc neg_pad = d, zero_stride = d, small_img = d, zero_c = d, neg_n = d, big = d;
  neg_pad.pad_w = -1;
  zero_stride.stride_h = 0;
  small_img.pad_h = 0;
  small_img.h = 2;
  zero_c.c = 0;
  neg_n.n = -1;
  big.h = std::int64_t{1} << 31;
  for (const Bad& b :
       {Bad{neg_pad, "pad_w = -1"}, Bad{zero_stride, "stride_h = 0"}, Bad{small_img, "h + 2*pad_h"},
        Bad{zero_c, "c = 0"}, Bad{neg_n, "n = -1"}, Bad{big, "2^31 - 1"}}) {
    expect_invalid([&] { be.conv2d_forward(s0, b.d, inp, w, out); },
                   {"conv2d_forward", "descriptor", b.part});
    expect_invalid([&] { be.conv2d_backward(s0, b.d, dout, inp, w, &dinp_t, dw); },
                   {"conv2d_backward", "descriptor", b.part});
  }
  // Element counts past int32 (cuDNN's int descriptors), each size itself being fine.
  Conv2dDesc many = conv(1 << 12, 1 << 10, 1 << 10, 1, 1, 1, 1);
  expect_invalid([&] { be.conv2d_forward(s0, many, inp, w, out); },
                 {"conv2d_forward", "inp (n*h*w*c)", "2^31 - 1"});

  // Backward.
  expect_invalid([&] { be.conv2d_backward(s0, d, dout, inp, w, &dinp_t, dw16); },
                 {"conv2d_backward", "dweight", "f32"});
  expect_invalid([&] { be.conv2d_backward(s0, d, dout, inp, w, &small_t, dw); },
                 {"conv2d_backward", "dinp", "(N,H,W,C)"});
  expect_invalid([&] { be.conv2d_backward(s0, d, small, inp, w, &dinp_t, dw); },
                 {"conv2d_backward", "dout"});
  expect_invalid([&] { be.conv2d_backward(s0, d, dout, inp, w16, &dinp_t, dw); },
                 {"conv2d_backward", "weight", "same dtype as inp"});
  const Tensor inp_as_dinp = inp;
  expect_invalid([&] { be.conv2d_backward(s0, d, dout, inp, w, &inp_as_dinp, dw); },
                 {"conv2d_backward", "dinp", "inp"});
  const Tensor dw_over_dinp(Tensor(dinp).raw(), Shape{nw}, DType::kF32, Device::kCpu);
  expect_invalid([&] { be.conv2d_backward(s0, d, dout, inp, w, &dinp_t, dw_over_dinp); },
                 {"conv2d_backward", "dinp", "dweight"});

  // Nothing was written by any refused call.
  for (double v : out.vals()) ASSERT_EQ(v, 7.0);
  for (double v : dinp.vals()) ASSERT_EQ(v, 7.0);
  for (double v : dw.vals()) ASSERT_EQ(v, 7.0);
}

}  // namespace
}  // namespace memfit
