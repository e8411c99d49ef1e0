// CudaBackend's per-head q/k RMSNorm (Qwen3's q_norm, k_norm; nn_kernels.cu) against the CPU
// backend's (the numerical reference, same contract: core/backend.h) on random inputs: every
// dtype combination of qkv, the two weights and qk_in; GQA (H=8, G=2) at Qwen3's head size 128,
// MQA with hs 80 (off the 32-lane warp), MHA, hs = 2, T = 1; enough tokens for several chunks of
// the weight-gradient reduction (the last partial) and a partial 32-column tile; accumulation
// (+=) onto non-zero weight gradients; heads past every launch's grid limit; v columns left
// with their bits; and run-to-run determinism on both scratch paths.
//
// Outputs are poisoned with NaN first, so an element the GPU leaves unwritten fails. The
// backward runs on both sides from the CPU forward's qk_in and rstd (uploaded), so its error is
// its own.
//
// Tolerance as tests/gpu/llama_ops_gpu_test.cpp's RMSNorm: |gpu - cpu| <= 2u * |cpu| +
// a * (1 + m), a = 1e-6 * (4 + sqrt(terms)): hs terms per head (warp sums in FP32 here, doubles
// on the CPU), tokens x heads terms per weight-gradient column (chunked FP32 here).
//
// Every test starts with MEMFIT_REQUIRE_GPU(): without a device they skip with the reason.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cpu/cpu_backend.h"
#include "core/cuda/cuda_backend.h"
#include "tests/gpu/gpu_mirror.h"
#include "tests/gpu/gpu_testutil.h"

namespace memfit {
namespace {

using Gpu = testing::GpuRig;
using Buf = testing::Mirror;
using testing::combos;
using testing::expect_bits;
using testing::expect_close;
using testing::fp32_tol;
using testing::HostBuf;
using testing::names;
using testing::print_worst;
using testing::Worst;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kEps = 1e-6f;  // Qwen3's rms_norm_eps

struct QkCase {
  std::int64_t b, t, heads, kv_heads, hs;
  bool all_combos;  // every dtype combination, else the uniform ones
  std::string name() const {
    return "B=" + std::to_string(b) + " T=" + std::to_string(t) + " H=" + std::to_string(heads) +
           " G=" + std::to_string(kv_heads) + " hs=" + std::to_string(hs);
  }
  std::int64_t tokens() const { return b * t; }
  std::int64_t qk() const { return heads + kv_heads; }
  Shape qkv() const { return {b, t, (heads + 2 * kv_heads) * hs}; }
};

// clang-format off
constexpr QkCase kCases[] = {
    {2, 37, 8, 2, 128, true},    // Qwen3's head size, GQA
    {1, 45, 4, 1, 80, true},     // MQA, hs off the warp (a partial column tile)
    {3, 1, 4, 4, 64, true},      // MHA, T = 1
    {2, 13, 2, 1, 2, true},      // hs = 2
    {1, 300, 16, 8, 128, false}, // 4800 q rows: 19 weight-gradient chunks, the last partial
};
// clang-format on

// The v columns of `after` have `before`'s bits.
void expect_v_untouched(const HostBuf& after, const HostBuf& before, const QkCase& c) {
  const std::int64_t row = (c.heads + 2 * c.kv_heads) * c.hs, v0 = c.qk() * c.hs;
  int bad = 0;
  for (std::int64_t r = 0; r < c.tokens(); ++r) {
    for (std::int64_t j = v0; j < row; ++j) {
      const float x = after.get(r * row + j), y = before.get(r * row + j);
      if (std::memcmp(&x, &y, sizeof x) != 0 && ++bad <= 3) {
        ADD_FAILURE() << "v changed at row " << r << " column " << j << ": " << y << " -> " << x;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// d: qkv, weights, qk_in.
void forward_case(Gpu& g, const QkCase& c, const std::array<DType, 3>& d, std::mt19937& rng,
                  Worst& worst) {
  SCOPED_TRACE(c.name() + " " + names(d));
  Buf qkv(g, c.qkv(), d[0]), wq(g, {c.hs}, d[1]), wk(g, {c.hs}, d[1]);
  Buf in(g, {c.b, c.t, c.qk() * c.hs}, d[2]), rstd(g, {c.b, c.t, c.qk()}, DType::kF32);
  qkv.rand(rng, -2.0f, 3.0f).upload();
  wq.rand(rng, 0.5f, 1.5f).upload();
  wk.rand(rng, -1.5f, -0.5f).upload();  // a swapped q / k weight shows
  in.fill(kNaN).upload();
  rstd.fill(kNaN).upload();
  const HostBuf before = qkv.host();
  g.be.qk_norm_forward(kDefaultStream, qkv.gpu(), c.heads, c.kv_heads, wq.gpu(), wk.gpu(), kEps,
                       in.gpu(), rstd.gpu());
  g.cpu.qk_norm_forward(kDefaultStream, qkv.cpu(), c.heads, c.kv_heads, wq.cpu(), wk.cpu(), kEps,
                        in.cpu(), rstd.cpu());
  g.sync();
  const HostBuf got = qkv.download();
  expect_close(got, qkv.host(), "qkv", fp32_tol(c.hs), worst);
  expect_close(in.download(), in.host(), "qk_in", fp32_tol(1), worst);
  expect_close(rstd.download(), rstd.host(), "rstd", fp32_tol(c.hs), worst);
  expect_v_untouched(got, before, c);
}

// d: dqkv, weights, qk_in. The weight gradients start from random values: the op adds into them.
void backward_case(Gpu& g, const QkCase& c, const std::array<DType, 3>& d, std::mt19937& rng,
                   Worst& worst) {
  SCOPED_TRACE(c.name() + " " + names(d));
  Buf qkv(g, c.qkv(), d[2]), wq(g, {c.hs}, d[1]), wk(g, {c.hs}, d[1]);
  Buf in(g, {c.b, c.t, c.qk() * c.hs}, d[2]), rstd(g, {c.b, c.t, c.qk()}, DType::kF32);
  Buf dqkv(g, c.qkv(), d[0]), dwq(g, {c.hs}, DType::kF32), dwk(g, {c.hs}, DType::kF32);
  qkv.rand(rng, -2.0f, 2.0f);
  wq.rand(rng, 0.5f, 1.5f);
  wk.rand(rng, -1.5f, -0.5f);
  dqkv.rand(rng, -1.0f, 1.0f);
  dwq.rand(rng, -1.0f, 1.0f);
  dwk.rand(rng, -1.0f, 1.0f);
  g.cpu.qk_norm_forward(kDefaultStream, qkv.cpu(), c.heads, c.kv_heads, wq.cpu(), wk.cpu(), kEps,
                        in.cpu(), rstd.cpu());
  for (const Buf* b : {&wq, &wk, &in, &rstd, &dqkv, &dwq, &dwk}) b->upload();
  const HostBuf before = dqkv.host();
  g.be.qk_norm_backward(kDefaultStream, dqkv.gpu(), in.gpu(), rstd.gpu(), c.heads, c.kv_heads,
                        wq.gpu(), wk.gpu(), dwq.gpu(), dwk.gpu());
  g.cpu.qk_norm_backward(kDefaultStream, dqkv.cpu(), in.cpu(), rstd.cpu(), c.heads, c.kv_heads,
                         wq.cpu(), wk.cpu(), dwq.cpu(), dwk.cpu());
  g.sync();
  const HostBuf got = dqkv.download();
  expect_close(got, dqkv.host(), "dqkv", fp32_tol(c.hs), worst);
  expect_close(dwq.download(), dwq.host(), "dq_weight", fp32_tol(c.tokens() * c.heads), worst);
  expect_close(dwk.download(), dwk.host(), "dk_weight", fp32_tol(c.tokens() * c.kv_heads), worst);
  expect_v_untouched(got, before, c);
}

std::vector<std::array<DType, 3>> dtypes(bool all) {
  if (all) return combos<3>();
  return {{DType::kF32, DType::kF32, DType::kF32},
          {DType::kF16, DType::kF16, DType::kF16},
          {DType::kBF16, DType::kBF16, DType::kBF16}};
}

TEST(QkNormGpu, ForwardEveryDTypeCombination) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  Worst worst;
  std::mt19937 rng(11);
  for (const QkCase& c : kCases) {
    for (const auto& d : dtypes(c.all_combos)) forward_case(g, c, d, rng, worst);
  }
  print_worst("qk_norm_forward max |gpu - cpu| / tolerance", worst);
}

TEST(QkNormGpu, BackwardAccumulatesEveryDTypeCombination) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  Worst worst;
  std::mt19937 rng(12);
  for (const QkCase& c : kCases) {
    for (const auto& d : dtypes(c.all_combos)) backward_case(g, c, d, rng, worst);
  }
  print_worst("qk_norm_backward max |gpu - cpu| / tolerance", worst);
}

// 2^23 + 5 tokens of two q heads and one k head of 2: more heads than one launch's grid covers
// (its grid-stride loops run), and 2^24 + 10 q rows, more than 65535 chunks of 256 can hold,
// so chunk_plan caps the chunks and each holds more rows.
TEST(QkNormGpu, HeadsPastTheGridLimits) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  Worst worst;
  std::mt19937 rng(13);
  const QkCase c{1, (std::int64_t{1} << 23) + 5, 2, 1, 2, false};
  const std::array<DType, 3> bf16{DType::kBF16, DType::kBF16, DType::kBF16};
  forward_case(g, c, bf16, rng, worst);
  backward_case(g, c, bf16, rng, worst);
  print_worst("qk_norm past the grid limits max |gpu - cpu| / tolerance", worst);
}

// Three runs on the same inputs (two with the workspace allocator, one with cudaMallocAsync
// scratch) give identical bits; the weight gradients are the reductions that could differ.
TEST(QkNormGpu, DeterministicOnBothScratchPaths) {
  MEMFIT_REQUIRE_GPU();
  const QkCase c{2, 300, 8, 2, 128, false};
  const DType bf16 = DType::kBF16;
  std::vector<std::vector<HostBuf>> runs;
  for (bool workspace : {true, true, false}) {
    Gpu g(workspace);
    std::mt19937 r(14);  // the same inputs for every run
    Buf qkv(g, c.qkv(), bf16), wq(g, {c.hs}, bf16), wk(g, {c.hs}, bf16);
    Buf in(g, {c.b, c.t, c.qk() * c.hs}, bf16), rstd(g, {c.b, c.t, c.qk()}, DType::kF32);
    Buf dqkv(g, c.qkv(), bf16), dwq(g, {c.hs}, DType::kF32), dwk(g, {c.hs}, DType::kF32);
    qkv.rand(r, -2.0f, 2.0f).upload();
    wq.rand(r, 0.5f, 1.5f).upload();
    wk.rand(r, 0.5f, 1.5f).upload();
    dqkv.rand(r, -1.0f, 1.0f).upload();
    dwq.fill(0.0f).upload();
    dwk.fill(0.0f).upload();
    g.be.qk_norm_forward(kDefaultStream, qkv.gpu(), c.heads, c.kv_heads, wq.gpu(), wk.gpu(), kEps,
                         in.gpu(), rstd.gpu());
    g.be.qk_norm_backward(kDefaultStream, dqkv.gpu(), in.gpu(), rstd.gpu(), c.heads, c.kv_heads,
                          wq.gpu(), wk.gpu(), dwq.gpu(), dwk.gpu());
    g.sync();
    runs.push_back({qkv.download(), in.download(), rstd.download(), dqkv.download(), dwq.download(),
                    dwk.download()});
  }
  const char* what[] = {"qkv", "qk_in", "rstd", "dqkv", "dq_weight", "dk_weight"};
  for (std::size_t run = 1; run < runs.size(); ++run) {
    for (std::size_t i = 0; i < runs[0].size(); ++i) {
      expect_bits(runs[run][i], runs[0][i], "run " + std::to_string(run) + " " + what[i]);
    }
  }
}

}  // namespace
}  // namespace memfit
