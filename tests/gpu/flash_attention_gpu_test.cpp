// CudaBackend's flash attention (attention_kernels.cu) against the CPU backend's (the
// numerical reference, same contract: core/backend.h) on random inputs: T = 1, T off the
// tiles (32/64 rows), T = 1000; hs 1, 3, 16, 33, 64, 80, 96, 128, 256 (all four kernel head-size
// instantiations, with and without padding); MHA, GQA (H=8, G=2) and MQA (H=4, G=1); f32, bf16
// and f16 operands and one mixed case; a batch * heads count past the kernels' grid limit (so
// the grid-stride loops run); then against the materialized path (Backend::attention_forward/
// backward) on the GPU itself, and run-to-run determinism (identical bits).
//
// Outputs are poisoned with NaN first, so an element the GPU leaves unwritten fails. The
// backward runs on both sides from the *CPU's* forward results (out, lse uploaded), so its
// error is its own, not the forward's carried along.
//
// Tolerance |gpu - cpu| <= 2u * |cpu| + a, per output tensor:
// - u is the output dtype's unit roundoff (2^-24 f32, 2^-11 f16, 2^-8 bf16). Both sides compute
//   in FP32 and round once (nearest even); two FP32 values a few ulp apart can round to
//   neighbouring 16-bit values, which differ by up to 2u relative.
// - a covers the FP32 differences themselves, which do not shrink with |cpu|: sums of up to T
//   terms added in other orders (tiles of 64 on the CPU, 16 to 64 and lane slices on the GPU),
//   exp by a polynomial on the CPU and expf on the GPU, the scale applied at other points.
//   Rounding errors of such sums grow like sqrt(T) * 2^-24 * (the sum of |terms|), so
//   a = 1e-6 * (4 + sqrt(T)) * (1 + m), m the tensor's largest |cpu|: small elements of a
//   gradient are judged on the tensor's scale. These kernels, emulated on the CPU against a
//   double-precision reference (T up to 1000, peaky rows), stayed under a twentieth of a; a
//   wrong mask, index or rescale gives errors of order m.
// Against the materialized path (FP32 cuBLASLt GEMMs, TF32 off, stored probabilities): 4a.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cpu/cpu_backend.h"
#include "core/cuda/cuda_backend.h"
#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_provider.h"
#include "tests/core/backend_testutil.h"
#include "tests/gpu/gpu_mirror.h"
#include "tests/gpu/gpu_testutil.h"

namespace memfit {
namespace {

using testing::HostBuf;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using Gpu = testing::GpuRig;
using Buf = testing::Mirror;
using testing::expect_bits;
using testing::expect_close;
using testing::fp32_tol;
using testing::print_worst;
using testing::unit_roundoff;
using testing::Worst;

struct Case {
  std::int64_t b, t, heads, kv_heads, hs;
  DType in;       // qkv and dout
  DType out;      // out and dqkv
  float amp = 1;  // qkv uniform in [-amp, amp): larger gives peakier softmax rows
  std::string name() const {
    return "B=" + std::to_string(b) + " T=" + std::to_string(t) + " H=" + std::to_string(heads) +
           " G=" + std::to_string(kv_heads) + " hs=" + std::to_string(hs) + " " + dtype_name(in) +
           "->" + dtype_name(out) + " amp=" + std::to_string(amp);
  }
};

// The operands of one case, on both sides.
struct Operands {
  Operands(Gpu& g, const Case& c)
      : qkv(g, {c.b, c.t, (c.heads + 2 * c.kv_heads) * c.hs}, c.in),
        dout(g, {c.b, c.t, c.heads * c.hs}, c.in),
        out(g, {c.b, c.t, c.heads * c.hs}, c.out),
        lse(g, {c.b, c.heads, c.t}, DType::kF32),
        delta(g, {c.b, c.heads, c.t}, DType::kF32),
        dqkv(g, {c.b, c.t, (c.heads + 2 * c.kv_heads) * c.hs}, c.out) {}
  Buf qkv, dout, out, lse, delta, dqkv;
};

void check_against_cpu(Gpu& g, const Case& c, std::uint32_t seed, Worst& worst) {
  SCOPED_TRACE(c.name());
  const double tol = fp32_tol(c.t);
  std::mt19937 rng(seed);
  Operands x(g, c);
  x.qkv.rand(rng, -c.amp, c.amp);
  x.dout.rand(rng, -1.0f, 1.0f);
  for (Buf* b : {&x.out, &x.lse, &x.delta, &x.dqkv}) b->fill(kNaN).upload();
  x.qkv.upload();
  x.dout.upload();

  g.be.flash_attention_forward(kDefaultStream, x.qkv.gpu(), c.heads, c.kv_heads, x.out.gpu(),
                               x.lse.gpu());
  g.cpu.flash_attention_forward(kDefaultStream, x.qkv.cpu(), c.heads, c.kv_heads, x.out.cpu(),
                                x.lse.cpu());
  g.sync();
  expect_close(x.out.download(), x.out.host(), "out", tol, worst);
  expect_close(x.lse.download(), x.lse.host(), "lse", tol, worst);

  x.out.upload();  // the backward reads the CPU's forward on both sides
  x.lse.upload();
  g.be.flash_attention_backward(kDefaultStream, x.dout.gpu(), x.qkv.gpu(), x.out.gpu(), x.lse.gpu(),
                                c.heads, c.kv_heads, x.delta.gpu(), x.dqkv.gpu());
  g.cpu.flash_attention_backward(kDefaultStream, x.dout.cpu(), x.qkv.cpu(), x.out.cpu(),
                                 x.lse.cpu(), c.heads, c.kv_heads, x.delta.cpu(), x.dqkv.cpu());
  g.sync();
  expect_close(x.delta.download(), x.delta.host(), "delta", tol, worst);
  expect_close(x.dqkv.download(), x.dqkv.host(), "dqkv", tol, worst);
}

TEST(FlashAttentionGpu, ForwardAndBackwardMatchTheCpu) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  Worst worst;
  const DType f32 = DType::kF32, bf16 = DType::kBF16, f16 = DType::kF16;
  // clang-format off
  const Case cases[] = {
      {1, 1, 2, 2, 16, f32, f32},           // T = 1: one live row and key
      {2, 67, 4, 4, 64, f32, f32},          // T off the 32-row and 64-row tiles
      {2, 67, 4, 4, 64, bf16, bf16},
      {1, 1000, 8, 2, 64, bf16, bf16},      // GQA, long T
      {1, 1000, 8, 2, 64, f32, f32, 3.0f},  // peaky rows: the running max matters
      {2, 130, 4, 1, 80, f32, f32},         // MQA, hs padded in the 128 kernel
      {2, 50, 4, 2, 96, bf16, f32},         // mixed dtypes
      {2, 45, 8, 2, 128, f32, f32},
      {1, 300, 8, 2, 128, bf16, bf16},
      {1, 77, 2, 2, 256, bf16, bf16},
      {1, 1000, 4, 1, 256, f32, f32},
      {3, 33, 3, 3, 16, f16, f16},
      {2, 40, 2, 1, 1, f32, f32, 4.0f},     // hs = 1
      {1, 129, 6, 3, 33, f32, bf16},        // hs 33: the 64 kernel on a partial chunk
  };
  // clang-format on
  std::uint32_t seed = 100;
  for (const Case& c : cases) check_against_cpu(g, c, seed++, worst);
  print_worst("flash attention max |gpu - cpu| / tolerance", worst);
}

// Runs the GPU's forward, then its backward from that forward's out and lse; returns out, lse,
// delta and dqkv.
std::vector<HostBuf> run_gpu(Gpu& g, const Case& c, Operands& x) {
  for (Buf* y : {&x.out, &x.lse, &x.delta, &x.dqkv}) y->fill(kNaN).upload();
  g.be.flash_attention_forward(kDefaultStream, x.qkv.gpu(), c.heads, c.kv_heads, x.out.gpu(),
                               x.lse.gpu());
  g.be.flash_attention_backward(kDefaultStream, x.dout.gpu(), x.qkv.gpu(), x.out.gpu(), x.lse.gpu(),
                                c.heads, c.kv_heads, x.delta.gpu(), x.dqkv.gpu());
  g.sync();
  return {x.out.download(), x.lse.download(), x.delta.download(), x.dqkv.download()};
}

// B*H and B*G past the 2^20 blocks a launch gets, so the kernels' grid-stride loops run (and
// B*H is past gridDim.y's 65535, which the kernels never use). Every batch holds the same
// data, so every batch's results must have the bits of a one-batch run (which is checked
// against the CPU on its own): the CPU reference would take too long at this size.
TEST(FlashAttentionGpu, BatchTimesHeadsPastTheGridLimit) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  const Case one{1, 2, 2, 1, 3, DType::kF32, DType::kF32, 2.0f};
  Worst worst;
  check_against_cpu(g, one, 7, worst);
  std::mt19937 rng(8);
  Operands a(g, one);
  a.qkv.rand(rng, -2.0f, 2.0f).upload();
  a.dout.rand(rng, -1.0f, 1.0f).upload();
  const std::vector<HostBuf> want = run_gpu(g, one, a);

  Case many = one;
  many.b = (std::int64_t{1} << 20) + 3;
  Operands x(g, many);
  for (auto [from, to] : {std::pair<Buf*, Buf*>{&a.qkv, &x.qkv}, {&a.dout, &x.dout}}) {
    const std::size_t n = from->bytes();
    auto* dst = static_cast<char*>(to->host().t().raw());
    for (std::int64_t bi = 0; bi < many.b; ++bi) {
      std::memcpy(dst + static_cast<std::size_t>(bi) * n, from->host().t().raw(), n);
    }
    to->upload();
  }
  const std::vector<HostBuf> got = run_gpu(g, many, x);
  const char* names[] = {"out", "lse", "delta", "dqkv"};
  for (std::size_t k = 0; k < got.size(); ++k) {
    const std::size_t n = static_cast<std::size_t>(want[k].size()) * dtype_size(want[k].dtype());
    const auto* base = static_cast<const char*>(got[k].t().raw());
    std::int64_t bad = 0, first = -1;
    for (std::int64_t bi = 0; bi < many.b; ++bi) {
      if (std::memcmp(base + static_cast<std::size_t>(bi) * n, want[k].t().raw(), n) != 0) {
        if (bad++ == 0) first = bi;
      }
    }
    EXPECT_EQ(bad, 0) << names[k] << ": " << bad << " batches differ from the one-batch run, "
                      << "the first at b = " << first;
  }
}

// The flash path against the materialized one (scores and probabilities stored, cuBLASLt
// GEMMs) on the GPU, MHA in f32: the same function by another algorithm.
TEST(FlashAttentionGpu, MatchesTheMaterializedPath) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  Worst worst;
  const DType dt = DType::kF32;
  for (const Case& c : {Case{2, 200, 4, 4, 64, dt, dt}, Case{1, 97, 3, 3, 80, dt, dt, 2.0f}}) {
    SCOPED_TRACE(c.name());
    std::mt19937 rng(11);
    const std::int64_t b = c.b, t = c.t, h = c.heads, hs = c.hs;
    Operands x(g, c);
    Buf qkvr(g, {3, b, h, t, hs}, dt), att(g, {b, h, t, t}, dt), scratch(g, {b, h, t, hs}, dt);
    Buf mout(g, {b, t, h * hs}, dt), datt(g, {b, h, t, t}, dt), dqkvr(g, {3, b, h, t, hs}, dt);
    Buf mdqkv(g, {b, t, 3 * h * hs}, dt);
    x.qkv.rand(rng, -c.amp, c.amp).upload();
    x.dout.rand(rng, -1.0f, 1.0f).upload();
    for (Buf* y : {&x.out, &x.lse, &x.delta, &x.dqkv, &mout, &mdqkv}) y->fill(kNaN).upload();
    g.be.flash_attention_forward(kDefaultStream, x.qkv.gpu(), h, h, x.out.gpu(), x.lse.gpu());
    g.be.flash_attention_backward(kDefaultStream, x.dout.gpu(), x.qkv.gpu(), x.out.gpu(),
                                  x.lse.gpu(), h, h, x.delta.gpu(), x.dqkv.gpu());
    g.be.attention_forward(kDefaultStream, x.qkv.gpu(), h, qkvr.gpu(), att.gpu(), scratch.gpu(),
                           mout.gpu());
    g.be.attention_backward(kDefaultStream, x.dout.gpu(), qkvr.gpu(), att.gpu(), h, datt.gpu(),
                            dqkvr.gpu(), mdqkv.gpu());
    g.sync();
    expect_close(x.out.download(), mout.download(), "out", 4 * fp32_tol(t), worst);
    expect_close(x.dqkv.download(), mdqkv.download(), "dqkv", 4 * fp32_tol(t), worst);
  }
  print_worst("flash attention max |flash - materialized| / tolerance (f32)", worst);
}

// Two runs on the same inputs give the same bits: forward and backward, GQA, bf16, T = 1000
// (many blocks, so a scheduling-dependent order would show).
TEST(FlashAttentionGpu, RunsAreBitwiseDeterministic) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  const Case c{2, 1000, 8, 2, 64, DType::kBF16, DType::kBF16};
  std::mt19937 rng(12);
  Operands x(g, c);
  x.qkv.rand(rng, -2.0f, 2.0f).upload();
  x.dout.rand(rng, -1.0f, 1.0f).upload();
  const std::vector<HostBuf> runs[] = {run_gpu(g, c, x), run_gpu(g, c, x)};
  const char* names[] = {"out", "lse", "delta", "dqkv"};
  for (std::size_t i = 0; i < runs[0].size(); ++i) expect_bits(runs[1][i], runs[0][i], names[i]);
}

}  // namespace
}  // namespace memfit
