// CudaBackend's neural-network ops against the CPU backend (the numerical reference): fresh
// random inputs, outputs poisoned with NaN before the op, every dtype combination the CPU
// accepts, dtype-aware tolerances (eps * (k + |ref|), eps = 1e-5 f32, 1e-3 f16, 1e-2 bf16, the
// output's dtype; NaN never passes), the in-place forms, accumulation (+=) onto non-zero
// gradients, and determinism (two runs, and the workspace-allocator and runtime-pool scratch
// paths, give identical bits). Where the GPU kernel performs the CPU's exact operation sequence
// (head permutes, embeddings, AdamW) the bits must match the CPU's.
//
// Every test starts with MEMFIT_REQUIRE_GPU(): without a device they skip with the reason.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/adamw.h"
#include "core/backend.h"
#include "core/cpu/cpu_backend.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/nn_kernels.h"
#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_provider.h"
#include "memory/error.h"
#include "tests/core/backend_testutil.h"
#include "tests/gpu/gpu_mirror.h"
#include "tests/gpu/gpu_testutil.h"

namespace memfit {
namespace {

using testing::HostBuf;

constexpr DType kDts[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

double eps_of(DType t) { return t == DType::kF32 ? 1e-5 : t == DType::kF16 ? 1e-3 : 1e-2; }

using Gpu = testing::GpuRig;
using Buf = testing::Mirror;
using testing::combos;
using testing::names;

// Copies every buffer's host values to the device (Mirror::upload leaves the device idle).
void upload(std::initializer_list<const Buf*> bufs) {
  for (const Buf* b : bufs) b->upload();
  MEMFIT_CUDA_CHECK(cudaDeviceSynchronize());
}

// Device ids for the index operands.
class DevIds {
 public:
  DevIds(Gpu& g, Shape s, std::vector<std::int32_t> v)
      : shape_(s),
        host_(std::move(v)),
        block_(g.alloc.allocate(std::max<std::size_t>(host_.size() * 4, 4), Category::kInput)) {
    MEMFIT_CUDA_CHECK(
        cudaMemcpy(block_.data(), host_.data(), host_.size() * 4, cudaMemcpyHostToDevice));
    MEMFIT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  IndexTensor cpu() const { return {host_.data(), shape_, Device::kCpu}; }
  IndexTensor gpu() const {
    return {static_cast<const std::int32_t*>(block_.data()), shape_, Device::kCuda};
  }

 private:
  Shape shape_;
  std::vector<std::int32_t> host_;
  Block block_;
};

// GPU result against CPU result, both stored in the same dtype.
void expect_near(const HostBuf& got, const HostBuf& ref, const std::string& what, double k = 1.0) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double eps = eps_of(ref.dtype());
  int bad = 0;
  for (std::int64_t i = 0; i < ref.size(); ++i) {
    const double g = got.get(i), r = ref.get(i);
    const double tol = eps * (k + std::fabs(r));
    if (!std::isfinite(g) || !(std::fabs(g - r) <= tol)) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << " (" << dtype_name(ref.dtype()) << ") [" << i << "]: gpu " << g
                      << ", cpu " << r << ", tolerance " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " elements off";
}

using testing::expect_bits;

// ---- layernorm -----------------------------------------------------------------------------

TEST(CudaNn, LayerNormForwardEveryDTypeCombination) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(1);
  for (auto [n, c] : {std::pair<std::int64_t, std::int64_t>{37, 67}, {3, 5}}) {
    for (const auto& d : combos<4>()) {  // inp, weight, bias, out
      SCOPED_TRACE(names(d) + " N=" + std::to_string(n) + " C=" + std::to_string(c));
      Buf inp(g, {n, c}, d[0]), w(g, {c}, d[1]), b(g, {c}, d[2]), out(g, {n, c}, d[3]);
      Buf mean(g, {n}, DType::kF32), rstd(g, {n}, DType::kF32);
      inp.rand(rng, -2.0f, 3.0f);
      w.rand(rng, 0.5f, 1.5f);
      b.rand(rng);
      out.fill(kNaN);
      mean.fill(kNaN);
      rstd.fill(kNaN);
      upload({&inp, &w, &b, &out, &mean, &rstd});
      g.be.layernorm_forward(kDefaultStream, inp.gpu(), w.gpu(), b.gpu(), 1e-5f, out.gpu(),
                             mean.gpu(), rstd.gpu());
      g.cpu.layernorm_forward(kDefaultStream, inp.cpu(), w.cpu(), b.cpu(), 1e-5f, out.cpu(),
                              mean.cpu(), rstd.cpu());
      g.sync();
      expect_near(out.download(), out.host(), "out", 2.0);
      expect_near(mean.download(), mean.host(), "mean");
      expect_near(rstd.download(), rstd.host(), "rstd");
    }
  }
}

// dinp, dweight, dbias accumulate onto random values; N = 591 spans three row chunks.
TEST(CudaNn, LayerNormBackwardAccumulatesEveryDTypeCombination) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(2);
  const std::int64_t n = 591, c = 67;
  for (const auto& d : combos<4>()) {  // dout, inp, weight, dinp
    SCOPED_TRACE(names(d));
    Buf dout(g, {n, c}, d[0]), inp(g, {n, c}, d[1]), w(g, {c}, d[2]), dinp(g, {n, c}, d[3]);
    Buf mean(g, {n}, DType::kF32), rstd(g, {n}, DType::kF32);
    Buf dw(g, {c}, DType::kF32), db(g, {c}, DType::kF32);
    dout.rand(rng);
    inp.rand(rng, -2.0f, 2.0f);
    w.rand(rng, 0.5f, 1.5f);
    dinp.rand(rng);
    dw.rand(rng);
    db.rand(rng);
    Buf out(g, {n, c}, DType::kF32), bias(g, {c}, DType::kF32);
    bias.fill(0.0f);
    g.cpu.layernorm_forward(kDefaultStream, inp.cpu(), w.cpu(), bias.cpu(), 1e-5f, out.cpu(),
                            mean.cpu(), rstd.cpu());
    upload({&dout, &inp, &w, &dinp, &mean, &rstd, &dw, &db});
    g.be.layernorm_backward(kDefaultStream, dout.gpu(), inp.gpu(), w.gpu(), mean.gpu(), rstd.gpu(),
                            dinp.gpu(), dw.gpu(), db.gpu());
    g.cpu.layernorm_backward(kDefaultStream, dout.cpu(), inp.cpu(), w.cpu(), mean.cpu(), rstd.cpu(),
                             dinp.cpu(), dw.cpu(), db.cpu());
    g.sync();
    expect_near(dinp.download(), dinp.host(), "dinp", 2.0);
    expect_near(dw.download(), dw.host(), "dweight", 4.0);
    expect_near(db.download(), db.host(), "dbias", 4.0);
  }
}

// Runs `op` on fresh copies of `state` (uploaded before each run) and returns the outputs.
std::vector<HostBuf> run_gpu(Gpu& g, const std::vector<const Buf*>& state,
                             const std::vector<const Buf*>& outputs,
                             const std::function<void()>& op) {
  for (const Buf* b : state) b->upload();
  MEMFIT_CUDA_CHECK(cudaDeviceSynchronize());
  op();
  g.sync();
  std::vector<HostBuf> r;
  for (const Buf* b : outputs) r.push_back(b->download());
  return r;
}

TEST(CudaNn, LayerNormAndBiasBackwardAreDeterministicOnBothScratchPaths) {
  MEMFIT_REQUIRE_GPU();
  std::mt19937 rng(3);
  const std::int64_t n = 4099, c = 131;  // 17 chunks, a partial column tile
  std::vector<std::vector<HostBuf>> runs;
  for (bool workspace : {true, true, false}) {
    Gpu g(workspace);
    std::mt19937 r = rng;  // the same inputs for every run
    Buf dout(g, {n, c}, DType::kBF16), inp(g, {n, c}, DType::kBF16), w(g, {c}, DType::kBF16);
    Buf dinp(g, {n, c}, DType::kBF16), mean(g, {n}, DType::kF32), rstd(g, {n}, DType::kF32);
    Buf dw(g, {c}, DType::kF32), db(g, {c}, DType::kF32), db2(g, {c}, DType::kF32);
    dout.rand(r);
    inp.rand(r);
    w.rand(r);
    dinp.rand(r);
    mean.rand(r, -0.1f, 0.1f);
    rstd.rand(r, 0.5f, 2.0f);
    dw.rand(r);
    db.rand(r);
    db2.rand(r);
    runs.push_back(run_gpu(
        g, {&dout, &inp, &w, &dinp, &mean, &rstd, &dw, &db, &db2}, {&dinp, &dw, &db, &db2}, [&] {
          g.be.layernorm_backward(kDefaultStream, dout.gpu(), inp.gpu(), w.gpu(), mean.gpu(),
                                  rstd.gpu(), dinp.gpu(), dw.gpu(), db.gpu());
          g.be.bias_backward(kDefaultStream, dout.gpu(), db2.gpu());
        }));
  }
  for (std::size_t run = 1; run < runs.size(); ++run) {
    for (std::size_t i = 0; i < runs[0].size(); ++i) {
      expect_bits(runs[run][i], runs[0][i],
                  "run " + std::to_string(run) + " output " + std::to_string(i));
    }
  }
}

// ---- elementwise ---------------------------------------------------------------------------

TEST(CudaNn, GeluForwardAndBackwardEveryDTypeCombinationAndInPlace) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(4);
  const std::int64_t n = 10007;
  for (const auto& d : combos<3>()) {  // (inp, out) for the forward; (dout, inp, dinp) backward
    SCOPED_TRACE(names(d));
    Buf inp(g, {n}, d[1]), out(g, {n}, d[2]), dout(g, {n}, d[0]), dinp(g, {n}, d[2]);
    inp.rand(rng, -6.0f, 6.0f);
    dout.rand(rng);
    out.fill(kNaN);
    dinp.fill(kNaN);
    upload({&inp, &out, &dout, &dinp});
    g.be.gelu_forward(kDefaultStream, inp.gpu(), out.gpu());
    g.be.gelu_backward(kDefaultStream, dout.gpu(), inp.gpu(), dinp.gpu());
    g.cpu.gelu_forward(kDefaultStream, inp.cpu(), out.cpu());
    g.cpu.gelu_backward(kDefaultStream, dout.cpu(), inp.cpu(), dinp.cpu());
    g.sync();
    expect_near(out.download(), out.host(), "gelu out", 2.0);
    expect_near(dinp.download(), dinp.host(), "gelu dinp", 2.0);
  }
  for (DType dt : kDts) {
    SCOPED_TRACE(dtype_name(dt));
    Buf x(g, {n}, dt), inp(g, {n}, dt), dx(g, {n}, dt);
    x.rand(rng, -6.0f, 6.0f);
    inp.rand(rng, -6.0f, 6.0f);
    dx.rand(rng);
    upload({&x, &inp, &dx});
    g.be.gelu_forward(kDefaultStream, x.gpu(), x.gpu());                // out = inp
    g.be.gelu_backward(kDefaultStream, dx.gpu(), inp.gpu(), dx.gpu());  // dinp = dout
    g.cpu.gelu_forward(kDefaultStream, x.cpu(), x.cpu());
    g.cpu.gelu_backward(kDefaultStream, dx.cpu(), inp.cpu(), dx.cpu());
    g.sync();
    expect_near(x.download(), x.host(), "gelu in place", 2.0);
    expect_near(dx.download(), dx.host(), "gelu backward in place", 2.0);
  }
}

TEST(CudaNn, AddEveryDTypeCombinationAndInPlace) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(5);
  const std::int64_t n = 5003;
  for (const auto& d : combos<3>()) {
    SCOPED_TRACE(names(d));
    Buf a(g, {n}, d[0]), b(g, {n}, d[1]), out(g, {n}, d[2]);
    a.rand(rng);
    b.rand(rng);
    out.fill(kNaN);
    upload({&a, &b, &out});
    g.be.add(kDefaultStream, a.gpu(), b.gpu(), out.gpu());
    g.cpu.add(kDefaultStream, a.cpu(), b.cpu(), out.cpu());
    g.sync();
    expect_bits(out.download(), out.host(), "add");  // one rounded f32 add on both sides
  }
  for (DType dt : kDts) {
    Buf a(g, {n}, dt), b(g, {n}, dt);
    a.rand(rng);
    b.rand(rng);
    upload({&a, &b});
    g.be.add(kDefaultStream, a.gpu(), b.gpu(), a.gpu());  // out = a
    g.be.add(kDefaultStream, a.gpu(), b.gpu(), b.gpu());  // out = b
    g.cpu.add(kDefaultStream, a.cpu(), b.cpu(), a.cpu());
    g.cpu.add(kDefaultStream, a.cpu(), b.cpu(), b.cpu());
    g.sync();
    expect_bits(a.download(), a.host(), std::string("add in place a ") + dtype_name(dt));
    expect_bits(b.download(), b.host(), std::string("add in place b ") + dtype_name(dt));
  }
}

TEST(CudaNn, AddBiasAndBiasBackwardEveryDTypeCombination) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(6);
  const std::int64_t oc = 45;          // 1000 rows: 4 row chunks
  for (const auto& d : combos<2>()) {  // bias, out
    SCOPED_TRACE(names(d));
    Buf bias(g, {oc}, d[0]), out(g, {10, 100, oc}, d[1]), dbias(g, {oc}, DType::kF32);
    bias.rand(rng);
    out.rand(rng);
    dbias.rand(rng);
    upload({&bias, &out, &dbias});
    g.be.add_bias(kDefaultStream, bias.gpu(), out.gpu());
    g.be.bias_backward(kDefaultStream, out.gpu(), dbias.gpu());  // reads the biased out
    g.cpu.add_bias(kDefaultStream, bias.cpu(), out.cpu());
    g.cpu.bias_backward(kDefaultStream, out.cpu(), dbias.cpu());
    g.sync();
    expect_bits(out.download(), out.host(), "add_bias");
    expect_near(dbias.download(), dbias.host(), "dbias", 4.0);
  }
}

// ---- causal softmax ------------------------------------------------------------------------

TEST(CudaNn, SoftmaxCausalForwardAndBackwardEveryDTypeCombinationAndInPlace) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(7);
  const float scale = 1.0f / std::sqrt(8.0f);
  for (std::int64_t t : {37, 1, 64}) {
    const std::int64_t r = 6;
    for (const auto& d : combos<3>()) {  // forward (preatt, att); backward (datt, att, dpreatt)
      SCOPED_TRACE(names(d) + " T=" + std::to_string(t));
      Buf pre(g, {r, t, t}, d[0]), att(g, {r, t, t}, d[1]), datt(g, {r, t, t}, d[0]);
      Buf dpre(g, {r, t, t}, d[2]);
      pre.rand(rng, -8.0f, 8.0f);
      datt.rand(rng);
      att.fill(kNaN);
      dpre.fill(kNaN);
      upload({&pre, &att, &datt, &dpre});
      g.be.softmax_causal_forward(kDefaultStream, pre.gpu(), scale, att.gpu());
      g.cpu.softmax_causal_forward(kDefaultStream, pre.cpu(), scale, att.cpu());
      g.sync();
      expect_near(att.download(), att.host(), "att", 1.0);
      att.upload();  // the backward reads the same att on both sides
      MEMFIT_CUDA_CHECK(cudaDeviceSynchronize());
      g.be.softmax_causal_backward(kDefaultStream, datt.gpu(), att.gpu(), scale, dpre.gpu());
      g.cpu.softmax_causal_backward(kDefaultStream, datt.cpu(), att.cpu(), scale, dpre.cpu());
      g.sync();
      expect_near(dpre.download(), dpre.host(), "dpreatt", 1.0);
    }
    for (DType dt : kDts) {
      SCOPED_TRACE(std::string("in place ") + dtype_name(dt) + " T=" + std::to_string(t));
      Buf x(g, {r, t, t}, dt), att(g, {r, t, t}, dt), dx(g, {r, t, t}, dt);
      x.rand(rng, -8.0f, 8.0f);
      dx.rand(rng);
      g.cpu.softmax_causal_forward(kDefaultStream, x.cpu(), scale, att.cpu());
      upload({&x, &att, &dx});
      g.be.softmax_causal_forward(kDefaultStream, x.gpu(), scale, x.gpu());
      g.be.softmax_causal_backward(kDefaultStream, dx.gpu(), att.gpu(), scale, dx.gpu());
      g.cpu.softmax_causal_forward(kDefaultStream, x.cpu(), scale, x.cpu());
      g.cpu.softmax_causal_backward(kDefaultStream, dx.cpu(), att.cpu(), scale, dx.cpu());
      g.sync();
      expect_near(x.download(), x.host(), "att in place");
      expect_near(dx.download(), dx.host(), "dpreatt in place");
    }
  }
}

// ---- head permutes -------------------------------------------------------------------------

// The permutes are protected primitives of attention; their launcher is tested directly
// against the layout formula of core/backend.h, every dtype pair, both directions. Pure
// conversions: the bits equal memfit::convert's.
TEST(CudaNn, SplitAndMergeHeadsFollowTheLayoutBitForBit) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(8);
  const std::int64_t b = 2, t = 5, h = 4, hs = 7;
  for (std::int64_t parts : {3, 1}) {
    for (const auto& d : combos<2>()) {
      SCOPED_TRACE(names(d) + " P=" + std::to_string(parts));
      const std::int64_t n = b * t * parts * h * hs;
      Buf packed(g, {n}, d[0]), heads(g, {n}, d[1]), back(g, {n}, d[0]);
      packed.rand(rng);
      heads.fill(kNaN);
      back.fill(kNaN);
      upload({&packed, &heads, &back});
      const cudaStream_t cs = g.be.cuda_stream(kDefaultStream);
      MEMFIT_CUDA_CHECK(cuda::launch_permute_heads(packed.gpu().raw(), static_cast<int>(d[0]),
                                                   heads.gpu().raw(), static_cast<int>(d[1]), b, t,
                                                   parts, h, hs, true, cs));
      MEMFIT_CUDA_CHECK(cuda::launch_permute_heads(heads.gpu().raw(), static_cast<int>(d[1]),
                                                   back.gpu().raw(), static_cast<int>(d[0]), b, t,
                                                   parts, h, hs, false, cs));
      g.sync();
      // src (B,T,P,H,hs) -> dst (P,B,H,T,hs)
      HostBuf want_heads(d[1], n), want_back(d[0], n);
      for (std::int64_t bb = 0; bb < b; ++bb)
        for (std::int64_t tt = 0; tt < t; ++tt)
          for (std::int64_t p = 0; p < parts; ++p)
            for (std::int64_t hh = 0; hh < h; ++hh)
              for (std::int64_t e = 0; e < hs; ++e) {
                const std::int64_t from = (((bb * t + tt) * parts + p) * h + hh) * hs + e;
                const std::int64_t to = (((p * b + bb) * h + hh) * t + tt) * hs + e;
                const float v = want_heads.set(to, packed.host().get(from));
                want_back.set(from, v);
              }
      expect_bits(heads.download(), want_heads, "split_heads");
      expect_bits(back.download(), want_back, "merge_heads");
    }
  }
}

// The attention composition (split, batched GEMMs, softmax, merge) against the CPU's.
TEST(CudaNn, AttentionForwardAndBackwardMatchTheCpu) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(9);
  const std::int64_t b = 2, t = 9, h = 3, hs = 8, c = h * hs;
  for (DType dt : kDts) {
    SCOPED_TRACE(dtype_name(dt));
    Buf qkv(g, {b, t, 3 * c}, dt), qkvr(g, {3, b, h, t, hs}, dt), att(g, {b, h, t, t}, dt);
    Buf scratch(g, {b, h, t, hs}, dt), out(g, {b, t, c}, dt), dout(g, {b, t, c}, dt);
    Buf datt(g, {b, h, t, t}, dt), dqkvr(g, {3, b, h, t, hs}, dt), dqkv(g, {b, t, 3 * c}, dt);
    qkv.rand(rng);
    dout.rand(rng);
    for (Buf* x : {&qkvr, &att, &scratch, &out, &datt, &dqkvr, &dqkv}) x->fill(kNaN);
    upload({&qkv, &qkvr, &att, &scratch, &out, &dout, &datt, &dqkvr, &dqkv});
    g.be.attention_forward(kDefaultStream, qkv.gpu(), h, qkvr.gpu(), att.gpu(), scratch.gpu(),
                           out.gpu());
    g.be.attention_backward(kDefaultStream, dout.gpu(), qkvr.gpu(), att.gpu(), h, datt.gpu(),
                            dqkvr.gpu(), dqkv.gpu());
    g.cpu.attention_forward(kDefaultStream, qkv.cpu(), h, qkvr.cpu(), att.cpu(), scratch.cpu(),
                            out.cpu());
    g.cpu.attention_backward(kDefaultStream, dout.cpu(), qkvr.cpu(), att.cpu(), h, datt.cpu(),
                             dqkvr.cpu(), dqkv.cpu());
    g.sync();
    expect_near(out.download(), out.host(), "attention out", 4.0);
    expect_near(dqkv.download(), dqkv.host(), "attention dqkv", 4.0);
  }
}

// ---- embeddings ----------------------------------------------------------------------------

// Token ids crowded into a few values, so most of them repeat many times, plus both ends.
std::vector<std::int32_t> crowded_ids(std::mt19937& rng, std::int64_t n, std::int32_t vocab) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  std::uniform_int_distribution<std::int32_t> few(0, 5), any(0, vocab - 1);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = i % 4 == 3 ? any(rng) : few(rng);
  ids.front() = vocab - 1;
  ids.back() = 0;
  return ids;
}

TEST(CudaNn, EmbeddingForwardEveryDTypeCombinationBitForBit) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(10);
  const std::int64_t b = 3, t = 17, c = 40, v = 50, max_t = 20;
  DevIds tokens(g, {b, t}, crowded_ids(rng, b * t, v));
  for (const auto& d : combos<3>()) {  // wte, wpe, out
    SCOPED_TRACE(names(d));
    Buf wte(g, {v, c}, d[0]), wpe(g, {max_t, c}, d[1]), out(g, {b, t, c}, d[2]);
    wte.rand(rng);
    wpe.rand(rng);
    out.fill(kNaN);
    upload({&wte, &wpe, &out});
    g.be.embedding_forward(kDefaultStream, tokens.gpu(), wte.gpu(), wpe.gpu(), out.gpu());
    g.cpu.embedding_forward(kDefaultStream, tokens.cpu(), wte.cpu(), wpe.cpu(), out.cpu());
    g.sync();
    expect_bits(out.download(), out.host(), "embedding out");  // one rounded f32 add
  }
}

// Without a position table (the Llama family's): out = wte[tok], dwte += alone; bit for bit.
TEST(CudaNn, EmbeddingWithoutPositionTableMatchesTheCpuBitForBit) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(13);
  const std::int64_t b = 2, t = 21, c = 300, v = 37;
  DevIds tokens(g, {b, t}, crowded_ids(rng, b * t, v));
  for (DType dt : kDts) {
    SCOPED_TRACE(dtype_name(dt));
    Buf wte(g, {v, c}, dt), out(g, {b, t, c}, dt), dout(g, {b, t, c}, dt),
        dwte(g, {v, c}, DType::kF32);
    wte.rand(rng);
    out.fill(kNaN);
    dout.rand(rng);
    dwte.rand(rng);
    upload({&wte, &out, &dout, &dwte});
    g.be.embedding_forward(kDefaultStream, tokens.gpu(), wte.gpu(), out.gpu());
    g.cpu.embedding_forward(kDefaultStream, tokens.cpu(), wte.cpu(), out.cpu());
    g.be.embedding_backward(kDefaultStream, dout.gpu(), tokens.gpu(), dwte.gpu());
    g.cpu.embedding_backward(kDefaultStream, dout.cpu(), tokens.cpu(), dwte.cpu());
    g.sync();
    expect_bits(out.download(), out.host(), "embedding out");
    expect_bits(dwte.download(), dwte.host(), "dwte");
  }
}

// dwte/dwpe += in (b,t) order, as the CPU loop: the bits equal the CPU's, on both scratch
// paths, run after run. C = 300 spans two column tiles.
TEST(CudaNn, EmbeddingBackwardMatchesTheCpuBitForBitAndIsDeterministic) {
  MEMFIT_REQUIRE_GPU();
  std::mt19937 rng(11);
  const std::int64_t b = 4, t = 33, c = 300, v = 50, max_t = 40;
  const std::vector<std::int32_t> ids = crowded_ids(rng, b * t, v);
  for (DType dt : kDts) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<HostBuf> first;
    for (bool workspace : {true, true, false}) {
      Gpu g(workspace);
      std::mt19937 r(12);
      DevIds tokens(g, {b, t}, ids);
      Buf dout(g, {b, t, c}, dt), dwte(g, {v, c}, DType::kF32), dwpe(g, {max_t, c}, DType::kF32);
      dout.rand(r);
      dwte.rand(r);
      dwpe.rand(r);
      upload({&dout, &dwte, &dwpe});
      g.be.embedding_backward(kDefaultStream, dout.gpu(), tokens.gpu(), dwte.gpu(), dwpe.gpu());
      g.cpu.embedding_backward(kDefaultStream, dout.cpu(), tokens.cpu(), dwte.cpu(), dwpe.cpu());
      g.sync();
      HostBuf gte = dwte.download(), gpe = dwpe.download();
      expect_bits(gte, dwte.host(), "dwte");
      expect_bits(gpe, dwpe.host(), "dwpe");
      if (first.empty()) {
        first = {gte, gpe};
      } else {
        expect_bits(gte, first[0], "dwte run to run");
        expect_bits(gpe, first[1], "dwpe run to run");
      }
    }
  }
}

// ---- cross-entropy -------------------------------------------------------------------------

// Logits with padding columns [V, Vp) set to NaN: a kernel that read them would spread NaN.
void fill_logits(Buf& logits, std::mt19937& rng, std::int64_t n, std::int64_t v, std::int64_t vp) {
  logits.rand(rng, -4.0f, 4.0f);
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t j = v; j < vp; ++j) logits.host().set(r * vp + j, kNaN);
  }
  logits.host().set(1 * vp + 3, 60.0f);  // a dominant logit: the max must be subtracted
}

std::vector<std::int32_t> targets_for(std::mt19937& rng, std::int64_t n, std::int32_t v) {
  std::vector<std::int32_t> y(static_cast<std::size_t>(n));
  std::uniform_int_distribution<std::int32_t> any(0, v - 1);
  for (auto& x : y) x = any(rng);
  y[0] = v - 1;  // the last live column
  y[1] = 3;      // the dominant one
  y[2] = 0;
  return y;
}

TEST(CudaNn, CrossEntropyForwardIgnoresPaddedVocabEveryDType) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(13);
  for (auto [n, v, vp] :
       {std::array<std::int64_t, 3>{7, 1000, 1024}, {5, 50257, 50304}, {3, 7, 7}}) {
    DevIds targets(g, {n}, targets_for(rng, n, static_cast<std::int32_t>(v)));
    for (DType dt : kDts) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " V=" + std::to_string(v));
      Buf logits(g, {n, vp}, dt), losses(g, {n}, DType::kF32), lse(g, {n}, DType::kF32);
      fill_logits(logits, rng, n, v, vp);
      losses.fill(kNaN);
      lse.fill(kNaN);
      upload({&logits, &losses, &lse});
      g.be.crossentropy_forward(kDefaultStream, logits.gpu(), targets.gpu(), v, losses.gpu(),
                                lse.gpu());
      g.cpu.crossentropy_forward(kDefaultStream, logits.cpu(), targets.cpu(), v, losses.cpu(),
                                 lse.cpu());
      g.sync();  // no trap: every target is in [0, V)
      expect_near(lse.download(), lse.host(), "lse", 2.0);
      expect_near(losses.download(), losses.host(), "losses", 2.0);
    }
  }
}

TEST(CudaNn, CrossEntropyBackwardEveryDTypeCombinationZeroPaddingAndInPlace) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(14);
  const std::int64_t n = 6, v = 1000, vp = 1024;
  DevIds targets(g, {n}, targets_for(rng, n, static_cast<std::int32_t>(v)));
  auto check_padding = [&](const HostBuf& got, const char* what) {
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t j = v; j < vp; ++j) {
        ASSERT_EQ(got.get(r * vp + j), 0.0f) << what << " padding [" << r << ", " << j << "]";
      }
    }
  };
  for (const auto& d : combos<2>()) {  // logits, dlogits
    for (bool per_row : {false, true}) {
      SCOPED_TRACE(names(d) + (per_row ? " dlosses" : " no dlosses"));
      Buf logits(g, {n, vp}, d[0]), lse(g, {n}, DType::kF32), losses(g, {n}, DType::kF32);
      Buf dlosses(g, {n}, DType::kF32), dlogits(g, {n, vp}, d[1]);
      fill_logits(logits, rng, n, v, vp);
      dlosses.rand(rng, 0.5f, 2.0f);
      dlogits.fill(kNaN);
      g.cpu.crossentropy_forward(kDefaultStream, logits.cpu(), targets.cpu(), v, losses.cpu(),
                                 lse.cpu());
      upload({&logits, &lse, &dlosses, &dlogits});
      const Tensor dl_gpu = dlosses.gpu(), dl_cpu = dlosses.cpu();
      g.be.crossentropy_backward(kDefaultStream, logits.gpu(), lse.gpu(), targets.gpu(), v, 0.25f,
                                 per_row ? &dl_gpu : nullptr, dlogits.gpu());
      g.cpu.crossentropy_backward(kDefaultStream, logits.cpu(), lse.cpu(), targets.cpu(), v, 0.25f,
                                  per_row ? &dl_cpu : nullptr, dlogits.cpu());
      g.sync();
      const HostBuf got = dlogits.download();
      expect_near(got, dlogits.host(), "dlogits");
      check_padding(got, "dlogits");
    }
  }
  for (DType dt : kDts) {
    SCOPED_TRACE(std::string("in place ") + dtype_name(dt));
    Buf logits(g, {n, vp}, dt), lse(g, {n}, DType::kF32), losses(g, {n}, DType::kF32);
    fill_logits(logits, rng, n, v, vp);
    g.cpu.crossentropy_forward(kDefaultStream, logits.cpu(), targets.cpu(), v, losses.cpu(),
                               lse.cpu());
    upload({&logits, &lse});
    g.be.crossentropy_backward(kDefaultStream, logits.gpu(), lse.gpu(), targets.gpu(), v, 0.25f,
                               nullptr, logits.gpu());
    g.cpu.crossentropy_backward(kDefaultStream, logits.cpu(), lse.cpu(), targets.cpu(), v, 0.25f,
                                nullptr, logits.cpu());
    g.sync();
    const HostBuf got = logits.download();
    expect_near(got, logits.host(), "dlogits in place");
    check_padding(got, "dlogits in place");
  }
}

// ---- AdamW ---------------------------------------------------------------------------------

// core/adamw.h specifies every rounding: param, moments and the copy-out equal the CPU's bit
// for bit over three steps, subnormals included (no flush to zero).
TEST(CudaNn, AdamWMatchesTheCpuBitForBit) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(15);
  const std::int64_t n = 10007;
  AdamWOptions opt;
  opt.lr = 3e-3;
  opt.weight_decay = 0.1;
  for (DType gdt : kDts) {
    for (int out_code = -1; out_code < 3; ++out_code) {  // -1: no param_out
      const DType odt = out_code < 0 ? DType::kF32 : kDts[out_code];
      SCOPED_TRACE(std::string("grad ") + dtype_name(gdt) +
                   (out_code < 0 ? " no out" : std::string(" out ") + dtype_name(odt)));
      Buf p(g, {n}, DType::kF32), grad(g, {n}, gdt), m(g, {n}, DType::kF32);
      Buf vv(g, {n}, DType::kF32), out(g, {n}, odt);
      p.rand(rng);
      m.rand(rng, -0.01f, 0.01f);
      vv.rand(rng, 0.0f, 1e-4f);
      out.fill(kNaN);
      p.host().set(0, 1e-40f);  // subnormal weight, moments and gradient
      m.host().set(0, -3e-41f);
      vv.host().set(0, 0.0f);
      p.host().set(1, -2e-39f);
      vv.host().set(1, 1e-45f);
      upload({&p, &m, &vv, &out});
      const Tensor out_gpu = out.gpu(), out_cpu = out.cpu();
      for (std::int64_t step = 1; step <= 3; ++step) {
        grad.rand(rng, -100.0f, 100.0f);
        grad.host().set(0, step == 1 ? 3e-38f : 0.0f);
        grad.host().set(2, 0.0f);
        upload({&grad});
        const AdamWConstants k = adamw_constants(opt, step, 1.0 / 1024.0);
        g.be.adamw(kDefaultStream, k, p.gpu(), grad.gpu(), m.gpu(), vv.gpu(),
                   out_code < 0 ? nullptr : &out_gpu);
        g.cpu.adamw(kDefaultStream, k, p.cpu(), grad.cpu(), m.cpu(), vv.cpu(),
                    out_code < 0 ? nullptr : &out_cpu);
        g.sync();
      }
      expect_bits(p.download(), p.host(), "param");
      expect_bits(m.download(), m.host(), "exp_avg");
      expect_bits(vv.download(), vv.host(), "exp_avg_sq");
      if (out_code >= 0) expect_bits(out.download(), out.host(), "param_out");
    }
  }
}

// ---- ids out of range trap -------------------------------------------------------------------

// A trap kills the CUDA context, so each case runs in a child process (re-executed, not
// forked: CUDA does not survive fork). The child reports the CudaError its synchronize threw.
void expect_trap(const std::function<void(Gpu&)>& op) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // Never destroyed: after a trap every CUDA call fails, and destructors must not run.
        Gpu* g = new Gpu;
        try {
          op(*g);
          g->sync();
        } catch (const CudaError& e) {
          std::fprintf(stderr, "trapped: %s\n", e.what());
          std::_Exit(3);
        }
        std::fprintf(stderr, "no error\n");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(3), "trapped");
}

TEST(CudaNnTrap, TokenOrTargetOutOfRangeTraps) {
  MEMFIT_REQUIRE_GPU();
  const std::int64_t b = 2, t = 4, c = 8, v = 10;
  auto bad_ids = [&](Gpu& g, std::int32_t bad) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(b * t), 1);
    ids[5] = bad;
    return DevIds(g, {b, t}, ids);
  };
  for (std::int32_t bad : {static_cast<std::int32_t>(v), -1}) {
    SCOPED_TRACE(bad);
    expect_trap([&](Gpu& g) {
      DevIds ids = bad_ids(g, bad);
      Buf wte(g, {v, c}, DType::kF32), wpe(g, {t, c}, DType::kF32), out(g, {b, t, c}, DType::kF32);
      g.be.embedding_forward(kDefaultStream, ids.gpu(), wte.gpu(), wpe.gpu(), out.gpu());
      g.sync();
    });
    expect_trap([&](Gpu& g) {
      DevIds ids = bad_ids(g, bad);
      Buf dout(g, {b, t, c}, DType::kF32), dwte(g, {v, c}, DType::kF32);
      Buf dwpe(g, {t, c}, DType::kF32);
      g.be.embedding_backward(kDefaultStream, dout.gpu(), ids.gpu(), dwte.gpu(), dwpe.gpu());
      g.sync();
    });
    expect_trap([&](Gpu& g) {
      DevIds ids = bad_ids(g, bad);
      Buf logits(g, {b * t, v}, DType::kF32), losses(g, {b * t}, DType::kF32);
      Buf lse(g, {b * t}, DType::kF32);
      g.be.crossentropy_forward(kDefaultStream, logits.gpu(),
                                IndexTensor{ids.gpu().data, {b * t}, Device::kCuda}, v,
                                losses.gpu(), lse.gpu());
      g.sync();
    });
    expect_trap([&](Gpu& g) {
      DevIds ids = bad_ids(g, bad);
      Buf logits(g, {b * t, v}, DType::kF32), lse(g, {b * t}, DType::kF32);
      g.be.crossentropy_backward(kDefaultStream, logits.gpu(), lse.gpu(),
                                 IndexTensor{ids.gpu().data, {b * t}, Device::kCuda}, v, 1.0f,
                                 nullptr, logits.gpu());
      g.sync();
    });
  }
}

}  // namespace
}  // namespace memfit
