// conv2d on the CPU backend against PyTorch: tests/core/data/conv_golden.bin holds
// torch.nn.functional.conv2d's output and gradients (computed in float64 from f32 inputs by
// scripts/make_conv_golden.py) for a few strided, padded, odd-sized convolutions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "tests/core/golden_testutil.h"
#include "tests/core/conv_testutil.h"
#include "tests/core/nn_testutil.h"

namespace memfit {
namespace {

using namespace testing;  // NOLINT

using testing::GoldenEntry;

Vec as_vec(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

TEST(ConvGolden, CpuMatchesPyTorch) {
  const auto g = testing::read_golden(testing::golden_data_path("conv_golden.bin"));
  ASSERT_FALSE(g.empty());
  ASSERT_EQ(g.count("cases"), 1u);
  const int cases = g.at("cases").i.at(0);
  ASSERT_GE(cases, 1);
  CpuBackend be;
  for (int i = 0; i < cases; ++i) {
    const std::string pre = "case" + std::to_string(i) + "/";
    for (const char* name : {"desc", "inp", "weight", "dout", "out", "dinp", "dweight"}) {
      ASSERT_EQ(g.count(pre + name), 1u) << pre + name;
    }
    const std::vector<std::int32_t>& v = g.at(pre + "desc").i;
    ASSERT_EQ(v.size(), 11u);
    const Conv2dDesc d = conv(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10]);
    SCOPED_TRACE(pre + " " + d.str());
    HT inp(Shape{d.n * d.h * d.w * d.c}, DType::kF32), w(Shape{d.k * d.r * d.s * d.c}, DType::kF32);
    HT dout(Shape{d.n * d.p() * d.q() * d.k}, DType::kF32);
    HT out(Shape{dout.n()}, DType::kF32), dinp(Shape{inp.n()}, DType::kF32);
    HT dw(Shape{w.n()}, DType::kF32);
    ASSERT_EQ(static_cast<std::size_t>(inp.n()), g.at(pre + "inp").f.size());
    ASSERT_EQ(static_cast<std::size_t>(w.n()), g.at(pre + "weight").f.size());
    ASSERT_EQ(static_cast<std::size_t>(dout.n()), g.at(pre + "dout").f.size());
    inp.assign(as_vec(g.at(pre + "inp").f));
    w.assign(as_vec(g.at(pre + "weight").f));
    dout.assign(as_vec(g.at(pre + "dout").f));
    out.poison();
    dinp.poison();
    dw.fill(0.0f);
    be.conv2d_forward(kDefaultStream, d, inp, w, out);
    const Tensor dinp_t = dinp;
    be.conv2d_backward(kDefaultStream, d, dout, inp, w, &dinp_t, dw);
    // PyTorch's answers are float64 rounded once; memfit's sums run in f32, so the tolerance
    // grows with the number of terms (R*S*C, R*S*K, N*P*Q).
    expect_close(out, as_vec(g.at(pre + "out").f), DType::kF32, "out",
                 1 + static_cast<double>(d.r * d.s * d.c) / 8);
    expect_close(dinp, as_vec(g.at(pre + "dinp").f), DType::kF32, "dinp",
                 1 + static_cast<double>(d.r * d.s * d.k) / 8);
    expect_close(dw, as_vec(g.at(pre + "dweight").f), DType::kF32, "dweight",
                 1 + static_cast<double>(d.n * d.p() * d.q()) / 4, 4);
    // And the naive reference agrees with PyTorch, so the two checks pin the same function.
    const Vec ref = ref_conv_forward(d, inp.vals(), w.vals());
    const std::vector<float>& torch_out = g.at(pre + "out").f;
    for (std::size_t j = 0; j < ref.size(); ++j) {
      ASSERT_NEAR(ref[j], torch_out[j], 1e-6 * (1 + std::fabs(ref[j]))) << j;
    }
  }
}

}  // namespace
}  // namespace memfit
