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
#include "tests/core/conv_testutil.h"
#include "tests/core/nn_testutil.h"

namespace memfit {
namespace {

using namespace testing;  // NOLINT

struct Entry {
  std::uint32_t dtype = 0;  // 0 f32, 1 i32
  std::vector<std::int64_t> dims;
  std::vector<float> f;
  std::vector<std::int32_t> i;
};

std::string golden_path() {
  const char* dir = std::getenv("MEMFIT_SOURCE_DIR");
  return std::string(dir ? dir : MEMFIT_TEST_SOURCE_DIR) + "/tests/core/data/conv_golden.bin";
}

// The MFGOLDEN layout (scripts/make_conv_golden.py); ADD_FAILURE and an empty map when the
// file is missing or any byte is malformed.
std::map<std::string, Entry> read_golden(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::vector<char> data((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
  std::size_t off = 0;
  bool ok = true;
  const auto take = [&](void* dst, std::size_t n) {
    if (!ok || n > data.size() - off) {
      ok = false;
      return;
    }
    std::memcpy(dst, data.data() + off, n);
    off += n;
  };
  char magic[8] = {};
  std::uint32_t version = 0, count = 0;
  take(magic, 8);
  take(&version, 4);
  take(&count, 4);
  if (!ok || std::memcmp(magic, "MFGOLDEN", 8) != 0 || version != 1) {
    ADD_FAILURE() << path << ": missing, or not a version 1 MFGOLDEN file";
    return {};
  }
  std::map<std::string, Entry> out;
  for (std::uint32_t e = 0; e < count && ok; ++e) {
    std::uint32_t len = 0, ndim = 0;
    take(&len, 4);
    if (!ok || len > 256) break;
    std::string name(len, '\0');
    take(name.data(), len);
    Entry en;
    take(&en.dtype, 4);
    take(&ndim, 4);
    if (!ok || ndim > 8 || en.dtype > 1) {
      ok = false;
      break;
    }
    en.dims.resize(ndim);
    take(en.dims.data(), 8 * ndim);
    std::int64_t numel = 1;
    for (std::int64_t d : en.dims) numel = (d < 0 || d > (1 << 20) || numel < 0) ? -1 : numel * d;
    if (!ok || numel < 0 || numel > (1 << 20)) {
      ok = false;
      break;
    }
    if (en.dtype == 0) {
      en.f.resize(static_cast<std::size_t>(numel));
      take(en.f.data(), 4 * en.f.size());
    } else {
      en.i.resize(static_cast<std::size_t>(numel));
      take(en.i.data(), 4 * en.i.size());
    }
    ok = ok && out.emplace(name, std::move(en)).second;
  }
  if (!ok || off != data.size()) {
    ADD_FAILURE() << path << ": malformed at byte " << off;
    return {};
  }
  return out;
}

Vec as_vec(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

TEST(ConvGolden, CpuMatchesPyTorch) {
  const auto g = read_golden(golden_path());
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
