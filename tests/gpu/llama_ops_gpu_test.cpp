// CudaBackend's Llama-family ops (RMSNorm, RoPE, SwiGLU; nn_kernels.cu) against the CPU
// backend's (the numerical reference, same contract: core/backend.h) on random inputs: every
// dtype combination the ops take (mixed included), C = 1, C off the 32-lane warp (67), C = 4096;
// N off the 256-row chunks of the dweight reduction; RoPE on GQA (H=8, G=2), MHA and MQA shapes,
// hs 2, 64, 80 (a half of 40, off the warp) and 128, T = 1, 37 and 1000, plain and Llama 3
// scaled frequencies, the inverse undoing the forward; accumulation (+=) onto non-zero dinp and
// dweight; sizes past every launch's grid limit (so the grid-stride loops run); and run-to-run
// determinism on both scratch paths (identical bits).
//
// Outputs are poisoned with NaN first, so an element the GPU leaves unwritten fails. Each
// backward runs on both sides from the same inputs (RMSNorm's rstd is the CPU's forward's,
// uploaded), so its error is its own.
//
// Tolerance |gpu - cpu| <= 2u * |cpu| + a * (1 + m), per output tensor, as the flash attention
// test (tests/gpu/flash_attention_gpu_test.cpp):
// - u is the output dtype's unit roundoff (2^-24 f32, 2^-11 f16, 2^-8 bf16). Both sides compute
//   in FP32 and round once (nearest even); two FP32 values a few ulp apart can round to
//   neighbouring 16-bit values, up to 2u apart relative.
// - a covers the FP32 differences, m is the tensor's largest |cpu| (small elements are judged on
//   the tensor's scale). RMSNorm reduces C terms per row (warp shuffles in FP32 here, doubles
//   on the CPU) and dweight N terms per column (chunked FP32 here): rounding errors of such sums
//   grow like sqrt(terms) * 2^-24 * (their magnitude), so a = 1e-6 * (4 + sqrt(terms)). RoPE
//   and SwiGLU have no sums: each output is a few FP32 operations on the same rounded inputs,
//   differing only by cosf / sinf / expf (<= 2 ulp on the GPU, <= 1 ulp in glibc) and nvcc's
//   FMA contraction, a handful of ulp of values of order 1: a = 1e-6 (some 16 ulp at 1).
// A wrong index, mask or formula gives errors of order m.
//
// Every test starts with MEMFIT_REQUIRE_GPU(): without a device they skip with the reason.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
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
#include "core/rope.h"
#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_provider.h"
#include "tests/core/backend_testutil.h"
#include "tests/gpu/gpu_mirror.h"
#include "tests/gpu/gpu_testutil.h"

namespace memfit {
namespace {

using testing::HostBuf;

constexpr DType kDts[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using Gpu = testing::GpuRig;
using Buf = testing::Mirror;
using testing::combos;
using testing::expect_bits;
using testing::expect_close;
using testing::fp32_tol;
using testing::names;
using testing::print_worst;
using testing::unit_roundoff;
using testing::Worst;

// a for elementwise ops without sums (RoPE, SwiGLU): libm-vs-CUDA transcendentals, FMA.
constexpr double kNoSums = 1e-6;

// The uniform K-tuples only: for the large shapes, where every combination would be slow on
// the CPU and adds nothing the small shapes do not check.
template <int K>
std::vector<std::array<DType, K>> uniform() {
  std::vector<std::array<DType, K>> out;
  for (DType t : kDts) {
    std::array<DType, K> d{};
    d.fill(t);
    out.push_back(d);
  }
  return out;
}

std::string nc(std::int64_t n, std::int64_t c) {
  return " N=" + std::to_string(n) + " C=" + std::to_string(c);
}

// ---- RMSNorm -------------------------------------------------------------------------------

constexpr float kEps = 1e-5f;

struct RowsCols {
  std::int64_t n, c;
  bool all_combos;  // every dtype combination, else the uniform ones
};

// (N,C): C off the warp, C = 1, C a warp, C = 4096 (Llama's), N = 0 (a no-op), N = 591 (three
// dweight chunks, the last partial).
constexpr RowsCols kRmsShapes[] = {{37, 67, true},    {5, 1, true},      {3, 32, true},
                                   {591, 67, true},   {64, 4096, false}, {0, 8, true},
                                   {300, 4096, false}};

void rmsnorm_forward_case(Gpu& g, std::int64_t n, std::int64_t c, const std::array<DType, 3>& d,
                          std::mt19937& rng, Worst& worst) {
  SCOPED_TRACE(names(d) + nc(n, c));
  Buf inp(g, {n, c}, d[0]), w(g, {c}, d[1]), out(g, {n, c}, d[2]), rstd(g, {n}, DType::kF32);
  inp.rand(rng, -2.0f, 3.0f).upload();
  w.rand(rng, 0.5f, 1.5f).upload();
  out.fill(kNaN).upload();
  rstd.fill(kNaN).upload();
  g.be.rmsnorm_forward(kDefaultStream, inp.gpu(), w.gpu(), kEps, out.gpu(), rstd.gpu());
  g.cpu.rmsnorm_forward(kDefaultStream, inp.cpu(), w.cpu(), kEps, out.cpu(), rstd.cpu());
  g.sync();
  expect_close(out.download(), out.host(), "out", fp32_tol(c), worst);
  expect_close(rstd.download(), rstd.host(), "rstd", fp32_tol(c), worst);
}

TEST(LlamaOpsGpu, RmsNormForwardEveryDTypeCombination) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  Worst worst;
  std::mt19937 rng(1);
  for (const RowsCols& s : kRmsShapes) {
    for (const auto& d : s.all_combos ? combos<3>() : uniform<3>()) {  // inp, weight, out
      rmsnorm_forward_case(g, s.n, s.c, d, rng, worst);
    }
  }
  // Leading dimensions (B,T,C) flatten into rows.
  {
    SCOPED_TRACE("(2,7,96) bf16");
    Buf inp(g, {2, 7, 96}, DType::kBF16), w(g, {96}, DType::kBF16);
    Buf out(g, {2, 7, 96}, DType::kBF16), rstd(g, {2, 7}, DType::kF32);
    inp.rand(rng, -2.0f, 2.0f).upload();
    w.rand(rng, 0.5f, 1.5f).upload();
    out.fill(kNaN).upload();
    rstd.fill(kNaN).upload();
    g.be.rmsnorm_forward(kDefaultStream, inp.gpu(), w.gpu(), kEps, out.gpu(), rstd.gpu());
    g.cpu.rmsnorm_forward(kDefaultStream, inp.cpu(), w.cpu(), kEps, out.cpu(), rstd.cpu());
    g.sync();
    expect_close(out.download(), out.host(), "out", fp32_tol(96), worst);
    expect_close(rstd.download(), rstd.host(), "rstd", fp32_tol(96), worst);
  }
  print_worst("rmsnorm_forward max |gpu - cpu| / tolerance", worst);
}

// dinp and dweight start from random values: the op adds into them.
void rmsnorm_backward_case(Gpu& g, std::int64_t n, std::int64_t c, const std::array<DType, 4>& d,
                           std::mt19937& rng, Worst& worst) {
  SCOPED_TRACE(names(d) + nc(n, c));
  Buf dout(g, {n, c}, d[0]), inp(g, {n, c}, d[1]), w(g, {c}, d[2]), dinp(g, {n, c}, d[3]);
  Buf rstd(g, {n}, DType::kF32), dw(g, {c}, DType::kF32), out(g, {n, c}, DType::kF32);
  dout.rand(rng, -1.0f, 1.0f);
  inp.rand(rng, -2.0f, 2.0f);
  w.rand(rng, 0.5f, 1.5f);
  dinp.rand(rng, -1.0f, 1.0f);
  dw.rand(rng, -1.0f, 1.0f);
  g.cpu.rmsnorm_forward(kDefaultStream, inp.cpu(), w.cpu(), kEps, out.cpu(), rstd.cpu());
  for (const Buf* b : {&dout, &inp, &w, &dinp, &rstd, &dw}) b->upload();
  g.be.rmsnorm_backward(kDefaultStream, dout.gpu(), inp.gpu(), w.gpu(), rstd.gpu(), dinp.gpu(),
                        dw.gpu());
  g.cpu.rmsnorm_backward(kDefaultStream, dout.cpu(), inp.cpu(), w.cpu(), rstd.cpu(), dinp.cpu(),
                         dw.cpu());
  g.sync();
  expect_close(dinp.download(), dinp.host(), "dinp", fp32_tol(c), worst);
  expect_close(dw.download(), dw.host(), "dweight", fp32_tol(n), worst);
}

TEST(LlamaOpsGpu, RmsNormBackwardAccumulatesEveryDTypeCombination) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  Worst worst;
  std::mt19937 rng(2);
  for (const RowsCols& s : kRmsShapes) {
    for (const auto& d : s.all_combos ? combos<4>() : uniform<4>()) {  // dout, inp, weight, dinp
      rmsnorm_backward_case(g, s.n, s.c, d, rng, worst);
    }
  }
  print_worst("rmsnorm_backward max |gpu - cpu| / tolerance", worst);
}

// ---- RoPE ----------------------------------------------------------------------------------

struct RopeCase {
  std::int64_t b, t, heads, kv_heads, hs;
  float theta;
  bool llama3;  // Llama 3.1's scaled frequencies
  std::string name() const {
    return "B=" + std::to_string(b) + " T=" + std::to_string(t) + " H=" + std::to_string(heads) +
           " G=" + std::to_string(kv_heads) + " hs=" + std::to_string(hs) +
           (llama3 ? " llama3" : "");
  }
  Shape shape() const { return {b, t, (heads + 2 * kv_heads) * hs}; }
  RopeFreqs freqs() const {
    RopeScaling s;
    if (llama3) s.kind = RopeScaling::Kind::kLlama3;
    return rope_frequencies(hs, theta, s);
  }
};

// clang-format off
constexpr RopeCase kRopeCases[] = {
    {2, 37, 8, 2, 64, 10000.0f, false},    // GQA, T off every tile
    {2, 37, 8, 2, 128, 500000.0f, true},   // Llama 3's head size and scaling
    {1, 1000, 8, 2, 128, 500000.0f, false}, // long T: angles up to ~1000 rad
    {3, 1, 4, 4, 64, 10000.0f, false},     // MHA, T = 1 (angle 0: the identity)
    {1, 45, 4, 1, 80, 10000.0f, false},    // MQA, half = 40 off the warp
    {2, 13, 2, 1, 2, 10000.0f, false},     // hs = 2: one pair per head
};
// clang-format on

// The v heads (columns (H+G)*hs onwards of each row) of `after` have the bits of `before`'s.
void expect_v_untouched(const HostBuf& after, const HostBuf& before, const RopeCase& c) {
  const std::int64_t row = (c.heads + 2 * c.kv_heads) * c.hs, v0 = (c.heads + c.kv_heads) * c.hs;
  int bad = 0;
  for (std::int64_t r = 0; r < c.b * c.t; ++r) {
    for (std::int64_t j = v0; j < row; ++j) {
      const float x = after.get(r * row + j), y = before.get(r * row + j);
      if (std::memcmp(&x, &y, sizeof x) != 0 && ++bad <= 3) {
        ADD_FAILURE() << "v changed at row " << r << " column " << j << ": " << y << " -> " << x;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(LlamaOpsGpu, RopeMatchesTheCpuForwardAndInverseEveryDType) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  Worst worst;
  std::mt19937 rng(3);
  for (const RopeCase& c : kRopeCases) {
    const RopeFreqs f = c.freqs();
    for (DType dt : kDts) {  // one operand: rope is in place
      for (bool inverse : {false, true}) {
        SCOPED_TRACE(c.name() + " " + dtype_name(dt) + (inverse ? " inverse" : ""));
        Buf qkv(g, c.shape(), dt);
        qkv.rand(rng, -1.0f, 1.0f).upload();
        const HostBuf before = qkv.host();  // a copy
        g.be.rope(kDefaultStream, qkv.gpu(), c.heads, c.kv_heads, f, inverse);
        g.cpu.rope(kDefaultStream, qkv.cpu(), c.heads, c.kv_heads, f, inverse);
        g.sync();
        const HostBuf got = qkv.download();
        expect_close(got, qkv.host(), inverse ? "inverse" : "forward", kNoSums, worst);
        expect_v_untouched(got, before, c);
      }
    }
  }
  print_worst("rope max |gpu - cpu| / tolerance", worst);
}

// inverse = true after inverse = false gives the input back to within rounding: each step is
// an FP32 rotation (orthogonal up to a few ulp of cos / sin), so in f32 the pair comes back to
// within a few 2^-24 of its norm r = |(x, y)| <= sqrt(2) (a = 1e-6 * (1 + r)). A 16-bit qkv is
// rounded between the steps: that error (at most u * r as a vector) the inverse rotates, not
// grows, and the final rounding adds u |x|: tolerance u (r + |x|) + 1e-6 (1 + r).
TEST(LlamaOpsGpu, RopeInverseUndoesTheForward) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(4);
  double worst = 0;
  for (const RopeCase& c : kRopeCases) {
    const RopeFreqs f = c.freqs();
    for (DType dt : kDts) {
      SCOPED_TRACE(c.name() + " " + dtype_name(dt));
      Buf qkv(g, c.shape(), dt);
      qkv.rand(rng, -1.0f, 1.0f).upload();
      g.be.rope(kDefaultStream, qkv.gpu(), c.heads, c.kv_heads, f, false);
      g.be.rope(kDefaultStream, qkv.gpu(), c.heads, c.kv_heads, f, true);
      g.sync();
      const HostBuf got = qkv.download();
      const HostBuf& x0 = qkv.host();
      const double u = dt == DType::kF32 ? 0.0 : unit_roundoff(dt);
      const std::int64_t row = (c.heads + 2 * c.kv_heads) * c.hs, half = c.hs / 2;
      int bad = 0;
      for (std::int64_t r = 0; r < c.b * c.t; ++r) {
        for (std::int64_t h = 0; h < c.heads + c.kv_heads; ++h) {
          for (std::int64_t i = 0; i < half; ++i) {
            const std::int64_t lo = r * row + h * c.hs + i, hi = lo + half;
            const double norm = std::hypot(double{x0.get(lo)}, double{x0.get(hi)});
            for (std::int64_t k : {lo, hi}) {
              const double err = std::fabs(double{got.get(k)} - x0.get(k));
              const double tol = u * (norm + std::fabs(x0.get(k))) + 1e-6 * (1 + norm);
              worst = std::max(worst, err / tol);
              if (!(err <= tol) && ++bad <= 5) {
                ADD_FAILURE() << "[" << k << "]: " << got.get(k) << ", was " << x0.get(k)
                              << ", tolerance " << tol;
              }
            }
          }
        }
      }
      EXPECT_EQ(bad, 0);
      expect_v_untouched(got, x0, c);
    }
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", worst);
  testing::print_figure("rope inverse(forward(x)) max |err| / tolerance", buf);
}

// ---- SwiGLU --------------------------------------------------------------------------------

// (N,F): F off the warp, F = 1, Llama-sized F, N = 0.
constexpr RowsCols kSwigluShapes[] = {
    {37, 67, true}, {3, 1, true}, {16, 4096, false}, {0, 4, true}, {5, 300, true}};

TEST(LlamaOpsGpu, SwigluForwardAndBackwardEveryDTypeCombination) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  Worst worst;
  std::mt19937 rng(5);
  for (const RowsCols& s : kSwigluShapes) {
    const std::int64_t n = s.n, f = s.c;
    // forward (gate_up, out); backward (dout, gate_up, dgate_up)
    for (const auto& d : s.all_combos ? combos<3>() : uniform<3>()) {
      SCOPED_TRACE(names(d) + " N=" + std::to_string(n) + " F=" + std::to_string(f));
      Buf gu(g, {n, 2 * f}, d[1]), out(g, {n, f}, d[2]), dout(g, {n, f}, d[0]);
      Buf dgu(g, {n, 2 * f}, d[2]);
      gu.rand(rng, -8.0f, 8.0f).upload();  // the sigmoid's tails on both sides
      dout.rand(rng, -1.0f, 1.0f).upload();
      out.fill(kNaN).upload();
      dgu.fill(kNaN).upload();  // written, not accumulated: no NaN may survive
      g.be.swiglu_forward(kDefaultStream, gu.gpu(), out.gpu());
      g.be.swiglu_backward(kDefaultStream, dout.gpu(), gu.gpu(), dgu.gpu());
      g.cpu.swiglu_forward(kDefaultStream, gu.cpu(), out.cpu());
      g.cpu.swiglu_backward(kDefaultStream, dout.cpu(), gu.cpu(), dgu.cpu());
      g.sync();
      expect_close(out.download(), out.host(), "out", kNoSums, worst);
      expect_close(dgu.download(), dgu.host(), "dgate_up", kNoSums, worst);
    }
  }
  print_worst("swiglu max |gpu - cpu| / tolerance", worst);
}

// ---- grid limits ---------------------------------------------------------------------------

// Rows past what one launch covers, so every kernel's grid-stride loop runs: RMSNorm's 2^20
// blocks of 8 warp-rows (and 32769 dweight chunks), RoPE's 2^20 row blocks, SwiGLU's 65535
// row blocks. Narrow rows keep the CPU reference quick.
TEST(LlamaOpsGpu, RowsPastTheGridLimits) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  Worst worst;
  std::mt19937 rng(6);
  {
    const std::int64_t n = (std::int64_t{1} << 23) + 7, c = 1;
    rmsnorm_forward_case(g, n, c, {DType::kF32, DType::kF32, DType::kF32}, rng, worst);
    rmsnorm_backward_case(g, n, c, {DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16}, rng,
                          worst);
  }
  {
    const RopeCase c{1, (std::int64_t{1} << 20) + 5, 1, 1, 2, 10000.0f, false};
    SCOPED_TRACE(c.name());
    const RopeFreqs f = c.freqs();
    Buf qkv(g, c.shape(), DType::kF32);
    qkv.rand(rng, -1.0f, 1.0f).upload();
    g.be.rope(kDefaultStream, qkv.gpu(), c.heads, c.kv_heads, f, false);
    g.cpu.rope(kDefaultStream, qkv.cpu(), c.heads, c.kv_heads, f, false);
    g.sync();
    expect_close(qkv.download(), qkv.host(), "rope", kNoSums, worst);
  }
  {
    const std::int64_t n = 70001, f = 3;
    Buf gu(g, {n, 2 * f}, DType::kF16), out(g, {n, f}, DType::kF16);
    Buf dout(g, {n, f}, DType::kF16), dgu(g, {n, 2 * f}, DType::kF16);
    gu.rand(rng, -8.0f, 8.0f).upload();
    dout.rand(rng, -1.0f, 1.0f).upload();
    out.fill(kNaN).upload();
    dgu.fill(kNaN).upload();
    g.be.swiglu_forward(kDefaultStream, gu.gpu(), out.gpu());
    g.be.swiglu_backward(kDefaultStream, dout.gpu(), gu.gpu(), dgu.gpu());
    g.cpu.swiglu_forward(kDefaultStream, gu.cpu(), out.cpu());
    g.cpu.swiglu_backward(kDefaultStream, dout.cpu(), gu.cpu(), dgu.cpu());
    g.sync();
    expect_close(out.download(), out.host(), "swiglu out", kNoSums, worst);
    expect_close(dgu.download(), dgu.host(), "swiglu dgate_up", kNoSums, worst);
  }
  print_worst("llama ops past the grid limits max |gpu - cpu| / tolerance", worst);
}

// ---- determinism ---------------------------------------------------------------------------

// Three runs of every op on the same inputs (two with the workspace allocator, one with
// cudaMallocAsync scratch) give identical bits. RMSNorm's dweight is the reduction that could
// differ; N = 4099 spans 17 chunks, C = 131 a partial column tile.
TEST(LlamaOpsGpu, EveryOpIsDeterministicOnBothScratchPaths) {
  MEMFIT_REQUIRE_GPU();
  const std::int64_t n = 4099, c = 131;
  const RopeCase rc{2, 37, 8, 2, 64, 10000.0f, false};
  const RopeFreqs f = rc.freqs();
  const DType bf16 = DType::kBF16;
  std::vector<std::vector<HostBuf>> runs;
  for (bool workspace : {true, true, false}) {
    Gpu g(workspace);
    std::mt19937 r(7);  // the same inputs for every run
    Buf inp(g, {n, c}, bf16), w(g, {c}, bf16), out(g, {n, c}, bf16), rstd(g, {n}, DType::kF32);
    Buf dout(g, {n, c}, bf16), dinp(g, {n, c}, bf16), dw(g, {c}, DType::kF32);
    Buf qkv(g, rc.shape(), bf16), gu(g, {n, 2 * c}, bf16), sout(g, {n, c}, bf16);
    Buf dgu(g, {n, 2 * c}, bf16);
    inp.rand(r, -2.0f, 2.0f).upload();
    w.rand(r, 0.5f, 1.5f).upload();
    dout.rand(r, -1.0f, 1.0f).upload();
    dinp.rand(r, -1.0f, 1.0f).upload();
    dw.rand(r, -1.0f, 1.0f).upload();
    qkv.rand(r, -1.0f, 1.0f).upload();
    gu.rand(r, -8.0f, 8.0f).upload();
    g.be.rmsnorm_forward(kDefaultStream, inp.gpu(), w.gpu(), kEps, out.gpu(), rstd.gpu());
    g.be.rmsnorm_backward(kDefaultStream, dout.gpu(), inp.gpu(), w.gpu(), rstd.gpu(), dinp.gpu(),
                          dw.gpu());
    g.be.rope(kDefaultStream, qkv.gpu(), rc.heads, rc.kv_heads, f, false);
    g.be.swiglu_forward(kDefaultStream, gu.gpu(), sout.gpu());
    g.be.swiglu_backward(kDefaultStream, dout.gpu(), gu.gpu(), dgu.gpu());
    g.sync();
    runs.push_back({out.download(), rstd.download(), dinp.download(), dw.download(), qkv.download(),
                    sout.download(), dgu.download()});
  }
  const char* what[] = {"rmsnorm out", "rstd",       "dinp",    "dweight",
                        "rope qkv",    "swiglu out", "dgate_up"};
  for (std::size_t run = 1; run < runs.size(); ++run) {
    for (std::size_t i = 0; i < runs[0].size(); ++i) {
      expect_bits(runs[run][i], runs[0][i], "run " + std::to_string(run) + " " + what[i]);
    }
  }
}

}  // namespace
}  // namespace memfit
