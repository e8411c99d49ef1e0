#include "policies/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/cpu/cpu_backend.h"
#include "core/device_adamw.h"
#include "core/layers/transformer_block.h"
#include "core/meta/meta_backend.h"
#include "core/model.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "memory/pinned_host_provider.h"
#include "policies/offload_optimizer.h"

namespace memfit {
namespace {

constexpr DType kAll[] = {DType::kF32, DType::kF16, DType::kBF16};

std::size_t cat(Category c) { return static_cast<std::size_t>(c); }

// ---- Megatron-LM's per-layer activation memory, term by term --------------------------------
//
// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
// section 4.1: one transformer layer stores sbh(34 + 5as/h) bytes in 16-bit (s tokens, b
// samples, h hidden, a heads), with dropout. memfit's GPT block (core/layers/*.cpp) has no
// dropout. Term by term (bytes, 16-bit):
//   Megatron                                      memfit (what the layers save)
//   LayerNorm 1 input                2sbh         block input x, held by ln1           2sbh
//   QKV projection input             2sbh         ln1 output, held by qkv              2sbh
//   Q and K (for QK^T)               4sbh    }    qkvr: q, k, v split into heads       6sbh
//   V (attention over values)        2sbh    }
//   softmax output                   2as^2b       att                                  2as^2b
//   softmax dropout mask             as^2b        -                                    0
//   softmax dropout output           2as^2b       - (att is multiplied by v)           0
//   output projection input          2sbh         merged heads, held by proj           2sbh
//   attention dropout mask           sbh          -                                    0
//   LayerNorm 2 input                2sbh         x1, the middle residual stream       2sbh
//   MLP first linear input           2sbh         ln2 output, held by fc               2sbh
//   GeLU input                       8sbh         fc output                            8sbh
//   second linear input (GeLU out)   8sbh         GELU output, held by proj            8sbh
//   MLP dropout mask                 sbh          -                                    0
//   -                                             LayerNorm mean + rstd (f32), ln1+ln2 16sb
// So memfit = Megatron - 2sbh - 3as^2b + 16sb (policies/cost_model.h says the same) with
// `attention: materialized`. With flash attention (the default) no s^2 term is saved at all:
// the softmax output becomes one f32 log-sum-exp per row (4asb), so
// memfit = Megatron - 2sbh - 5as^2b + 16sb + 4asb: Megatron's sbh * 34 with flash attention.
struct Terms {
  std::int64_t s, b, h, a;
  std::int64_t sbh() const { return s * b * h; }
  std::int64_t as2b() const { return a * s * s * b; }
  std::int64_t asb() const { return a * s * b; }
  std::int64_t megatron_total() const { return sbh() * 34 + 5 * as2b(); }  // sbh(34 + 5as/h)
};

ModelSpec materialized(const char* preset) {
  ModelSpec s = ModelSpec::preset(preset);
  s.attention = AttentionImpl::kMaterialized;
  return s;
}

TEST(CostModelMegatron, Gpt2BlockTermByTerm) {
  const ModelSpec spec = materialized("gpt2");
  const Terms m{spec.seq_len, 1, spec.hidden, spec.heads};
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dt));
    TransformerBlock blk("h.0", spec.hidden, spec.heads, spec.mlp_ratio, spec.layers, 1e-5f,
                         AttentionImpl::kMaterialized);
    const std::int64_t T = m.s;
    const LayerCost ln1 = blk.ln1().cost(T, dt), attn = blk.attn().cost(T, dt),
                    ln2 = blk.ln2().cost(T, dt), mlp = blk.mlp().cost(T, dt);
    const CostModel cm = CostModel::analytic(spec, T);
    const std::int64_t input = cm.embedding(dt).output_bytes;  // x, the block's input
    // LayerNorm 1 input.
    EXPECT_EQ(input, 2 * m.sbh());
    EXPECT_TRUE(ln1.saves_input);
    // QKV projection input = ln1's output (qkv holds it: attention saves its input).
    EXPECT_EQ(ln1.output_bytes, 2 * m.sbh());
    EXPECT_TRUE(attn.saves_input);
    // Attention: Q, K, V (4sbh + 2sbh), softmax output (2as^2b), projection input (2sbh);
    // Megatron's 11sbh + 5as^2b less its QKV input (2sbh, above), its two dropout masks
    // (sbh + as^2b) and its dropout output (2as^2b).
    EXPECT_EQ(attn.saved_bytes, (4 + 2 + 2) * m.sbh() + 2 * m.as2b());
    EXPECT_EQ(attn.saved_bytes, (11 - 2 - 1) * m.sbh() + (5 - 1 - 2) * m.as2b());
    // LayerNorm 2 input = attention's output, the residual stream x1 (added in place).
    EXPECT_EQ(attn.output_bytes, 2 * m.sbh());
    // MLP first linear input = ln2's output.
    EXPECT_EQ(ln2.output_bytes, 2 * m.sbh());
    EXPECT_TRUE(mlp.saves_input);
    // GeLU input + second linear input (8sbh each): Megatron's 19sbh less its first linear
    // input (2sbh, above) and its dropout mask (sbh).
    EXPECT_EQ(mlp.saved_bytes, 8 * m.sbh() + 8 * m.sbh());
    EXPECT_EQ(mlp.saved_bytes, (19 - 2 - 1) * m.sbh());
    // The LayerNorms' f32 statistics, which Megatron does not count.
    EXPECT_EQ(ln1.saved_bytes + ln2.saved_bytes, 16 * m.s * m.b);

    // The block as the cost model reports it (input counted by its producer).
    const LayerCost k = cm.block(0, dt);
    const std::int64_t memfit_layer = input + k.saved_bytes;
    EXPECT_EQ(memfit_layer, input + ln1.saved_bytes + ln1.output_bytes + attn.saved_bytes +
                                attn.output_bytes + ln2.saved_bytes + ln2.output_bytes +
                                mlp.saved_bytes);
    EXPECT_EQ(memfit_layer, m.megatron_total() - 2 * m.sbh() - 3 * m.as2b() + 16 * m.s * m.b);
    std::printf(
        "gpt2 per-layer activations (%s, s=%lld b=1 h=%lld a=%lld): memfit %lld bytes, "
        "Megatron sbh(34+5as/h) %lld bytes (ratio %.3f)\n",
        dtype_name(dt), static_cast<long long>(m.s), static_cast<long long>(m.h),
        static_cast<long long>(m.a), static_cast<long long>(memfit_layer),
        static_cast<long long>(m.megatron_total()),
        static_cast<double>(memfit_layer) / static_cast<double>(m.megatron_total()));

    // Flash attention (the default): q, k, v (6sbh), the merged heads (2sbh), lse (4asb f32).
    ModelSpec flash = spec;
    flash.attention = AttentionImpl::kFlash;
    const CostModel cf = CostModel::analytic(flash, T);
    TransformerBlock fb("h.0", spec.hidden, spec.heads, spec.mlp_ratio, spec.layers);
    EXPECT_EQ(fb.attn().cost(T, dt).saved_bytes, (6 + 2) * m.sbh() + 4 * m.asb());
    const std::int64_t flash_layer = input + cf.block(0, dt).saved_bytes;
    EXPECT_EQ(flash_layer,
              m.megatron_total() - 2 * m.sbh() - 5 * m.as2b() + 16 * m.s * m.b + 4 * m.asb());
    std::printf(
        "gpt2 per-layer activations with flash attention (%s): %lld bytes (%.3f of "
        "materialized)\n",
        dtype_name(dt), static_cast<long long>(flash_layer),
        static_cast<double>(flash_layer) / static_cast<double>(memfit_layer));
  }
}

// The Llama family's block in the same terms (s tokens, b samples, h hidden, a query heads of
// hs, q = a*hs and k = g*hs columns for g kv heads, F the SwiGLU width; 16-bit, flash):
//   block input x (held by input_layernorm)           2sbh
//   input_layernorm rstd (f32)                        4sb
//   its output, held by the qkv projection            2sbh
//   qkv after the rotary embedding (q, k, v)          2sb(q + 2k)
//   merged heads, held by o_proj                      2sbq
//   log-sum-exp per query row (f32)                   4asb
//   x1, the middle residual stream                    2sbh
//   post_attention_layernorm rstd (f32)               4sb
//   its output, held by gate_up                       2sbh
//   gate_up's output (SwiGLU's input)                 4sbF
//   SwiGLU's output, held by down                     2sbF
// total 2sb(4h + 2q + 2k + 3F) + 8sb + 4asb. Llama-3.1-8B (h = q = 4096, k = 1024,
// F = 14336): 2sb * 69632 = 34sbh, plus 8sb + 4asb, the same 34sbh as GPT-2's with flash.
// The head's whole logits are 2sbV (V = 128256: 1.84 such layers per sample at s = 2048);
// the chunked loss saves none of them.
TEST(CostModelMegatron, LlamaBlockTermByTerm) {
  const ModelSpec spec = ModelSpec::preset("llama-3.1-8b");
  const std::int64_t s = 2048, b = 1, h = spec.hidden, a = spec.heads,
                     hs = spec.resolved_head_dim(), q = a * hs, k = spec.resolved_kv_heads() * hs,
                     f = spec.intermediate;
  const Terms m{s, b, h, a};
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const CostModel cm = CostModel::analytic(spec, s);
    const std::int64_t input = cm.embedding(dt).output_bytes;
    EXPECT_EQ(input, 2 * m.sbh());
    const std::int64_t layer = input + cm.block(0, dt).saved_bytes;
    const std::int64_t closed =
        2 * s * b * (4 * h + 2 * q + 2 * k + 3 * f) + 8 * s * b + 4 * m.asb();
    EXPECT_EQ(layer, closed);
    EXPECT_EQ(layer, 34 * m.sbh() + 8 * s * b + 4 * m.asb());  // this shape's coincidence
    // Every block alike.
    EXPECT_EQ(cm.block(static_cast<int>(spec.layers) - 1, dt).saved_bytes,
              cm.block(0, dt).saved_bytes);
    std::printf("llama-3.1-8b per-layer activations (%s, s=%lld b=1): %lld bytes = %.3f sbh\n",
                dtype_name(dt), static_cast<long long>(s), static_cast<long long>(layer),
                static_cast<double>(layer) / static_cast<double>(m.sbh()));
  }
  // The head (bf16): whole logits 2sbV saved, chunked none (one chunk of s/k rows as
  // workspace, k = min(8, ceil(V / h) = 32) = 8 chunks).
  LmHead whole("head", spec.vocab, h, nullptr, HeadNorm::kRMSNorm);
  LmHead chunked("head", spec.vocab, h, nullptr, HeadNorm::kRMSNorm);
  chunked.set_loss(LossMode::kChunked);
  const LayerCost w = whole.cost(s, DType::kBF16), c = chunked.cost(s, DType::kBF16);
  EXPECT_EQ(w.saved_bytes - c.saved_bytes, 2 * s * spec.vocab);
  EXPECT_EQ(c.workspace_bytes, 2 * (s / kMaxLossChunks) * spec.vocab);
  std::printf(
      "llama-3.1-8b head per sample (bf16, s=%lld): whole logits %.1f MiB saved, chunked "
      "%.1f MiB of workspace\n",
      static_cast<long long>(s), double(w.saved_bytes - c.saved_bytes) / 1048576.0,
      double(c.workspace_bytes) / 1048576.0);
}

// Qwen3's block: the Llama block's terms plus what its q/k norms save, q and k before the norm
// (2sb(q + k)) and one f32 per q and k head and token (4(a + g)sb). Qwen3-8B (h = q = 4096,
// k = 1024, F = 12288, a = 32, g = 8): 2sb(16384 + 8192 + 2048 + 36864) + 8sb + 4asb
// + 2sb(5120) + 160sb.
TEST(CostModelMegatron, Qwen3BlockTermByTerm) {
  const ModelSpec spec = ModelSpec::preset("qwen3-8b");
  ASSERT_TRUE(spec.qk_norm);
  const std::int64_t s = 2048, b = 1, h = spec.hidden, a = spec.heads, g = spec.resolved_kv_heads(),
                     hs = spec.resolved_head_dim(), q = a * hs, k = g * hs, f = spec.intermediate;
  const Terms m{s, b, h, a};
  const CostModel cm = CostModel::analytic(spec, s);
  const std::int64_t layer =
      cm.embedding(DType::kBF16).output_bytes + cm.block(0, DType::kBF16).saved_bytes;
  const std::int64_t llama_terms =
      2 * s * b * (4 * h + 2 * q + 2 * k + 3 * f) + 8 * s * b + 4 * m.asb();
  EXPECT_EQ(layer, llama_terms + 2 * s * b * (q + k) + 4 * (a + g) * s * b);
  std::printf("qwen3-8b per-layer activations (bf16, s=%lld b=1): %lld bytes = %.3f sbh\n",
              static_cast<long long>(s), static_cast<long long>(layer),
              static_cast<double>(layer) / static_cast<double>(m.sbh()));
}

TEST(CostModelMegatron, ScalesWithMicroBatchAndDoublesInF32) {
  const ModelSpec spec = materialized("gpt2-medium");
  const std::int64_t s = 512;
  const CostModel cm = CostModel::analytic(spec, s);
  const DeviceSpec dev = DeviceSpec::preset("a100-80g");
  for (std::int64_t b : {1, 3, 8}) {
    const Terms m{s, b, spec.hidden, spec.heads};
    const Chain c16 = cm.chain(b, DType::kBF16, dev), c32 = cm.chain(b, DType::kF32, dev);
    for (const Chain* c : {&c16, &c32}) ASSERT_EQ(c->blocks.size(), 24u);
    const ChainBlock& k16 = c16.blocks[5];
    const ChainBlock& k32 = c32.blocks[5];
    EXPECT_EQ(k16.input_bytes + k16.saved_bytes,
              m.megatron_total() - 2 * m.sbh() - 3 * m.as2b() + 16 * s * b);
    EXPECT_EQ(k32.input_bytes + k32.saved_bytes,
              2 * (m.megatron_total() - 2 * m.sbh() - 3 * m.as2b()) + 16 * s * b);
  }
}

// ---- analytic model -----------------------------------------------------------------------

TEST(CostModel, AnalyticReadsTheRealModel) {
  for (const char* name : {"gpt-micro", "gpt2", "mlp-tiny", "gpt3-6.7b"}) {
    SCOPED_TRACE(name);
    const ModelSpec spec = ModelSpec::preset(name);
    const std::int64_t T = spec.seq_len / 2;
    const CostModel cm = CostModel::analytic(spec, T);
    EXPECT_FALSE(cm.measured());
    EXPECT_EQ(cm.seq_len(), T);
    EXPECT_EQ(cm.num_blocks(), spec.layers);
    EXPECT_EQ(cm.parameter_count(), spec.parameter_count());
    MetaBackend meta;
    NullProvider null;
    CachingAllocator alloc(null, {}, &meta.stream_sync());
    LayerContext ctx{meta, alloc, kDefaultStream, DType::kBF16};
    Model m(spec, ctx);
    m.head().set_loss(LossMode::kChunked);  // what analytic() prices by default (the policy's)
    const CostModel whole = CostModel::analytic(spec, T, LossMode::kWhole);
    for (DType dt : kAll) {
      // The whole-logits head saves the logits the chunked one recomputes (gpt-micro's vocab
      // is no wider than the model: one chunk, the same head).
      if (spec.vocab > spec.hidden) {
        EXPECT_GT(whole.head(dt).saved_bytes, cm.head(dt).saved_bytes);
      } else {
        EXPECT_EQ(whole.head(dt).saved_bytes, cm.head(dt).saved_bytes);
      }
      for (int i : {0, cm.num_blocks() - 1}) {
        const LayerCost a = cm.block(i, dt), b = m.block_cost(i, T, dt);
        EXPECT_EQ(a.saved_bytes, b.saved_bytes);
        EXPECT_EQ(a.output_bytes, b.output_bytes);
        EXPECT_EQ(a.workspace_bytes, b.workspace_bytes);
        EXPECT_EQ(a.forward_flops, b.forward_flops);
        EXPECT_EQ(a.backward_flops, b.backward_flops);
      }
      EXPECT_EQ(cm.head(dt).saved_bytes, m.head_cost(T, dt).saved_bytes);
      EXPECT_EQ(cm.embedding(dt).output_bytes, m.embedding_cost(T, dt).output_bytes);
    }
  }
  EXPECT_NEAR(static_cast<double>(ModelSpec::preset("gpt3-6.7b").parameter_count()), 6.66e9,
              0.01e9);
}

TEST(CostModel, BadArguments) {
  const ModelSpec spec = ModelSpec::preset("gpt-micro");
  EXPECT_THROW(CostModel::analytic(spec, 0), InvalidArgument);
  EXPECT_THROW(CostModel::analytic(spec, spec.seq_len + 1), InvalidArgument);
  const CostModel cm = CostModel::analytic(spec, spec.seq_len);
  const DeviceSpec dev = DeviceSpec::preset("cpu");
  EXPECT_THROW(cm.chain(0, DType::kF32, dev), InvalidArgument);
  EXPECT_THROW(cm.block(cm.num_blocks(), DType::kF32), InvalidArgument);
  EXPECT_THROW(cm.step_seconds({}, Schedule::none(cm.num_blocks()), 1, 0, dev), InvalidArgument);
  EXPECT_THROW(cm.step_seconds({}, Schedule::none(cm.num_blocks() + 1), 1, 1, dev),
               InvalidArgument);
  DeviceSpec slow = dev;
  slow.flops_bf16 = 0;
  EXPECT_THROW(cm.chain(1, DType::kBF16, slow), InvalidArgument);
  EXPECT_THROW(CostModel::calibrate(spec, spec.seq_len, 2, 2), InvalidArgument);
  EXPECT_THROW(CostModel::calibrate(spec, spec.seq_len, 0, 2), InvalidArgument);
}

// ---- static bytes -------------------------------------------------------------------------

TEST(CostModel, StaticBytesPerParameterMatchTheHeadersTable) {
  const CostModel cm = CostModel::analytic(ModelSpec::preset("gpt2"), 1024);
  const std::int64_t n = cm.parameter_count();
  struct Row {
    DType dt;
    bool offload;
    std::int64_t weights, grads, optimizer, host_min;
  };
  // policies/cost_model.h: weights, grads, masters + moments (device), pinned host.
  const Row rows[] = {{DType::kF32, false, 4, 4, 8, 0},
                      {DType::kBF16, false, 2, 4, 12, 0},
                      {DType::kF16, false, 2, 4, 12, 0},
                      {DType::kBF16, true, 2, 4, 0, 18},
                      {DType::kF32, true, 4, 4, 0, 16}};
  for (const Row& r : rows) {
    const StaticBytes s = cm.static_bytes(r.dt, OffloadSwitches{.optimizer = r.offload});
    EXPECT_EQ(s.device[cat(Category::kParameter)], r.weights * n);
    EXPECT_EQ(s.device[cat(Category::kGradient)], r.grads * n);
    EXPECT_EQ(s.device[cat(Category::kOptimizerState)], r.optimizer * n);
    EXPECT_EQ(s.device_total(), (r.weights + r.grads + r.optimizer) * n);
    EXPECT_GE(s.host_pinned, r.host_min * n);
    EXPECT_LT(s.host_pinned, r.host_min * n + 5 * 64);  // five 64-byte-aligned regions at most
    std::printf(
        "gpt2 (%lld params) %-4s offload=%d: device %lld B (%.1f B/param), host pinned "
        "%lld B\n",
        static_cast<long long>(n), dtype_name(r.dt), r.offload ? 1 : 0,
        static_cast<long long>(s.device_total()),
        static_cast<double>(s.device_total()) / static_cast<double>(n),
        static_cast<long long>(s.host_pinned));
  }
}

// The table against what allocate_parameter, DeviceAdamW and OffloadOptimizer really allocate.
TEST(CostModel, StaticBytesEqualWhatTheOptimizersAllocate) {
  const ModelSpec spec = ModelSpec::preset("gpt-tiny");
  const CostModel cm = CostModel::analytic(spec, spec.seq_len);
  for (DType dt : kAll) {
    for (bool offload : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (offload ? " offload" : ""));
      CpuBackend be;
      HostProvider host;
      CachingAllocator alloc(host, {}, &be.stream_sync());
      LayerContext ctx{be, alloc, kDefaultStream, dt};
      Model m(spec, ctx);
      PinnedHostProvider pinned;
      std::unique_ptr<Optimizer> opt;
      std::size_t host_bytes = 0;
      if (offload) {
        auto o = std::make_unique<OffloadOptimizer>(m.parameters(), OffloadOptions{}, ctx, pinned);
        host_bytes = o->host_bytes();
        opt = std::move(o);
      } else {
        opt = std::make_unique<DeviceAdamW>(m.parameters(), AdamWOptions{}, ctx);
      }
      const AllocatorStats st = alloc.stats();
      const StaticBytes s = cm.static_bytes(dt, OffloadSwitches{.optimizer = offload});
      // Every parameter tensor's size here is a multiple of the allocator's 512-byte rounding
      // (gpt-tiny: C = 256), so the figures agree exactly.
      for (Category c : {Category::kParameter, Category::kGradient, Category::kOptimizerState}) {
        EXPECT_EQ(st.category_bytes[cat(c)].current, s.device[cat(c)]) << category_name(c);
      }
      EXPECT_EQ(static_cast<std::int64_t>(host_bytes), s.host_pinned);
    }
  }
}

// ---- chain and time -----------------------------------------------------------------------

TEST(CostModel, ChainScalesPerSampleFiguresByTheMicroBatch) {
  const ModelSpec spec = ModelSpec::preset("gpt2");
  const CostModel cm = CostModel::analytic(spec, 1024);
  const DeviceSpec dev = DeviceSpec::preset("h100-80g");
  for (DType dt : kAll) {
    const Chain c1 = cm.chain(1, dt, dev), c4 = cm.chain(4, dt, dev);
    ASSERT_EQ(c1.blocks.size(), 12u);
    EXPECT_EQ(c1.blocks[0].input_bytes, cm.embedding(dt).output_bytes);
    for (std::size_t i = 0; i < 12; ++i) {
      const LayerCost k = cm.block(static_cast<int>(i), dt);
      EXPECT_EQ(c4.blocks[i].saved_bytes, 4 * k.saved_bytes);
      EXPECT_EQ(c4.blocks[i].input_bytes, 4 * c1.blocks[i].input_bytes);
      EXPECT_TRUE(c4.blocks[i].saves_input);
      EXPECT_EQ(c4.blocks[i].fwd_workspace, 4 * c1.blocks[i].fwd_workspace);
      EXPECT_EQ(std::max(c1.blocks[i].fwd_workspace, c1.blocks[i].bwd_workspace),
                k.workspace_bytes);
      // Never faster than the flops at the dtype's rate; in f32 (67 TFLOP/s, no tensor
      // cores) gpt2's blocks are compute-bound, so exactly that. (In bf16 at 989 TFLOP/s the
      // backward's traffic may already decide.)
      EXPECT_GE(c4.blocks[i].fwd_time, 4.0 * k.forward_flops / dev.flops(dt));
      EXPECT_GE(c4.blocks[i].bwd_time, 4.0 * k.backward_flops / dev.flops(dt));
      if (dt == DType::kF32) {
        EXPECT_DOUBLE_EQ(c4.blocks[i].fwd_time, 4.0 * k.forward_flops / dev.flops(dt));
        EXPECT_DOUBLE_EQ(c4.blocks[i].bwd_time, 4.0 * k.backward_flops / dev.flops(dt));
        // Recomputed for its backward: the MLP's projection (2 x C x 4C flops a token) skipped.
        EXPECT_EQ(k.forward_flops - k.flops_for_backward(), std::int64_t{2} * 1024 * 768 * 3072);
        EXPECT_DOUBLE_EQ(c4.blocks[i].fwd_for_backward_time,
                         4.0 * k.flops_for_backward() / dev.flops(dt));
      }
      EXPECT_LT(c4.blocks[i].fwd_for_backward_time, c4.blocks[i].fwd_time);
    }
    EXPECT_EQ(c4.output_bytes, 4 * cm.block(11, dt).output_bytes);
    const LayerCost h = cm.head(dt);
    EXPECT_EQ(c4.head_bytes, 4 * (h.saved_bytes + h.output_bytes + h.workspace_bytes));
    // The head reads the whole (tied) wte whatever the batch, so its time is not linear in it.
    EXPECT_GE(c4.head_time, 4.0 * (h.forward_flops + h.backward_flops) / dev.flops(dt));
    EXPECT_GT(c4.head_time, c1.head_time);
  }
  // Bandwidth-bound where flops are cheap: on a device with absurd flops, memory decides
  // (activations in and out, saved state, the weights read).
  DeviceSpec fast = dev;
  fast.flops_bf16 = 1e30;
  const Chain c = cm.chain(2, DType::kBF16, fast);
  const double act = static_cast<double>(c.blocks[3].input_bytes + c.blocks[3].saved_bytes +
                                         c.blocks[4].input_bytes);
  const double weights =
      2.0 * static_cast<double>(12 * spec.hidden * spec.hidden + 13 * spec.hidden);
  EXPECT_DOUBLE_EQ(c.blocks[3].fwd_time, (act + weights) / fast.mem_bandwidth);
}

TEST(CostModel, StepSecondsAddsRecomputationAccumulationAndTheOptimizer) {
  const ModelSpec spec = ModelSpec::preset("gpt2");
  const CostModel cm = CostModel::analytic(spec, 1024);
  DeviceSpec dev = DeviceSpec::preset("a100-80g");
  dev.cpu_adamw = 1e9;  // fixed, so the figures below do not depend on this machine
  const int n = cm.num_blocks();
  MemoryPolicy p;
  p.dtype = DType::kBF16;
  const Chain c = cm.chain(8, DType::kBF16, dev);
  double fwd = 0, for_backward = 0;
  for (const ChainBlock& b : c.blocks) {
    fwd += b.fwd_time;
    for_backward += b.for_backward_time();
  }
  const double none1 = cm.step_seconds(p, Schedule::none(n), 8, 1, dev);
  const double all1 = cm.step_seconds(p, Schedule::all(n), 8, 1, dev);
  const double none4 = cm.step_seconds(p, Schedule::none(n), 8, 4, dev);
  // Checkpointing every block recomputes every forward once, each right before its backward:
  // what that backward reads (one GEMM less than the forward), as the executor runs it.
  EXPECT_NEAR(all1 - none1, for_backward, 1e-9 * none1);
  EXPECT_LT(for_backward, fwd);
  // Accumulation repeats the micro-batch, not the optimizer: 30 B/param of AdamW (bf16
  // copy-out) over bandwidth once.
  const double opt = 30.0 * static_cast<double>(cm.parameter_count()) / dev.mem_bandwidth;
  EXPECT_NEAR(none4 - opt, 4 * (none1 - opt), 1e-9 * none4);
  EXPECT_GT(none1, opt);
  // Offload, at a micro-batch whose backward outlasts each block's gradient copy: CPU AdamW
  // (1e9 params/s) and the weight copies back are exposed, and of the gradient copies only
  // those that wait for the end of the backward: block 0's (partly) and the embedding's.
  const double nparams = static_cast<double>(cm.parameter_count());
  const double big = cm.step_seconds(p, Schedule::none(n), 32, 1, dev);
  p.offload.optimizer = true;
  const double off = cm.step_seconds(p, Schedule::none(n), 32, 1, dev);
  const double floor = big - opt + nparams / dev.cpu_adamw + 2 * nparams / dev.host_link;
  const double emb = static_cast<double>((spec.vocab + spec.seq_len) * spec.hidden);
  const double block = static_cast<double>(12 * spec.hidden * spec.hidden + 13 * spec.hidden);
  EXPECT_GE(off, floor + 4 * emb / dev.host_link * (1 - 1e-9));
  EXPECT_LE(off, floor + 4 * (emb + block) / dev.host_link);
  // A faster CPU AdamW shortens the step by exactly its time.
  DeviceSpec fast = dev;
  fast.cpu_adamw = 1e10;
  EXPECT_NEAR(off - cm.step_seconds(p, Schedule::none(n), 32, 1, fast),
              nparams / 1e9 - nparams / 1e10, 1e-9 * off);
}

// Activation offload costs nothing without checkpoints, and under checkpoint all only what its
// copies do not hide: with the link so fast the copies take no time, nothing; with a link
// slower than a block's forward, at least each checkpoint's copy out beyond that forward.
TEST(CostModel, ActivationOffloadAddsOnlyTheCopiesItCannotHide) {
  const CostModel cm = CostModel::analytic(ModelSpec::preset("gpt2"), 1024);
  DeviceSpec dev = DeviceSpec::preset("a100-80g");
  dev.cpu_adamw = 1e9;
  const int n = cm.num_blocks();
  MemoryPolicy p;
  p.dtype = DType::kBF16;
  MemoryPolicy a = p;
  a.offload.activations = true;
  EXPECT_EQ(cm.step_seconds(a, Schedule::none(n), 8, 2, dev),
            cm.step_seconds(p, Schedule::none(n), 8, 2, dev));
  DeviceSpec fast = dev;
  fast.host_link = 1e18;
  EXPECT_NEAR(cm.step_seconds(a, Schedule::all(n), 8, 2, fast),
              cm.step_seconds(p, Schedule::all(n), 8, 2, fast), 1e-9);
  const Chain c = cm.chain(8, DType::kBF16, dev);
  const double copy = static_cast<double>(c.blocks[0].input_bytes) / dev.host_link;
  const double plain = cm.step_seconds(p, Schedule::all(n), 8, 1, dev);
  const double acts = cm.step_seconds(a, Schedule::all(n), 8, 1, dev);
  EXPECT_GE(acts, plain);
  if (copy > c.blocks[1].fwd_time) {
    EXPECT_GE(acts - plain, (n - 1) * (copy - c.blocks[1].fwd_time) * (1 - 1e-9));
  }
  DeviceSpec slow = dev;
  slow.host_link = dev.host_link / 100;
  EXPECT_GT(cm.step_seconds(a, Schedule::all(n), 8, 1, slow), acts);
  // Accumulation repeats the waits per micro-batch.
  const double acts4 = cm.step_seconds(a, Schedule::all(n), 8, 4, slow);
  const double plain4 = cm.step_seconds(p, Schedule::all(n), 8, 4, slow);
  const double one = cm.step_seconds(a, Schedule::all(n), 8, 1, slow) -
                     cm.step_seconds(p, Schedule::all(n), 8, 1, slow);
  EXPECT_NEAR(acts4 - plain4, 4 * one, 1e-9 * acts4);
}

TEST(CostModel, CpuAdamWRateIsMeasuredOnce) {
  const double r = CostModel::cpu_adamw_rate();
  EXPECT_GT(r, 1e6);  // a million parameters per second even on a loaded 2-core VM
  EXPECT_EQ(CostModel::cpu_adamw_rate(), r);
  std::printf("CPU AdamW on this machine: %.3g params/s\n", r);
  const CostModel cm = CostModel::analytic(ModelSpec::preset("gpt-tiny"), 128);
  const DeviceSpec dev = DeviceSpec::preset("cpu");  // cpu_adamw 0: the measured rate
  ASSERT_EQ(dev.cpu_adamw, 0.0);
  MemoryPolicy p;
  p.offload.optimizer = true;
  DeviceSpec given = dev;
  given.cpu_adamw = r;
  EXPECT_DOUBLE_EQ(cm.step_seconds(p, Schedule::none(6), 2, 1, dev),
                   cm.step_seconds(p, Schedule::none(6), 2, 1, given));
}

// ---- calibration --------------------------------------------------------------------------

TEST(CostModelCalibrate, MeasuredPerSampleBytesEqualTheAnalyticOnes) {
  const ModelSpec spec = ModelSpec::preset("gpt-micro");
  const CostModel an = CostModel::analytic(spec, spec.seq_len);
  const CostModel cal = CostModel::calibrate(spec, spec.seq_len, 8, 16);
  EXPECT_TRUE(cal.measured());
  EXPECT_EQ(cal.parameter_count(), an.parameter_count());
  ASSERT_EQ(cal.num_blocks(), an.num_blocks());
  for (DType dt : kAll) {
    SCOPED_TRACE(dtype_name(dt));
    for (int i = 0; i < an.num_blocks(); ++i) {
      const LayerCost a = an.block(i, dt), m = cal.block(i, dt);
      // The allocator rounds each tensor to 512 bytes; at micro-batches 8 and 16 gpt-micro's
      // tensors (the f32 statistics included) are multiples of it: the slopes are exact then.
      EXPECT_NEAR(static_cast<double>(m.saved_bytes), static_cast<double>(a.saved_bytes),
                  0.02 * static_cast<double>(a.saved_bytes));
      EXPECT_EQ(m.output_bytes, a.output_bytes);
      EXPECT_NEAR(static_cast<double>(m.workspace_bytes), static_cast<double>(a.workspace_bytes),
                  0.02 * static_cast<double>(a.workspace_bytes) + 512);
      EXPECT_EQ(m.saves_input, a.saves_input);
      EXPECT_GT(m.forward_flops, 0);
      EXPECT_GT(m.backward_flops, 0);
    }
    EXPECT_NEAR(static_cast<double>(cal.head(dt).saved_bytes),
                static_cast<double>(an.head(dt).saved_bytes),
                0.02 * static_cast<double>(an.head(dt).saved_bytes));
    EXPECT_EQ(cal.embedding(dt).output_bytes, an.embedding(dt).output_bytes);
    // Megatron's terms (16-bit) hold for the measurement too.
    if (dt != DType::kF32) {
      const Terms t{spec.seq_len, 1, spec.hidden, spec.heads};
      const double want = static_cast<double>(t.megatron_total() - 2 * t.sbh() - 5 * t.as2b() +
                                              16 * t.s * t.b + 4 * t.asb());  // flash
      EXPECT_NEAR(
          static_cast<double>(cal.embedding(dt).output_bytes + cal.block(0, dt).saved_bytes), want,
          0.02 * want);
    }
  }
  // The measured model feeds the same arithmetic.
  const DeviceSpec dev = DeviceSpec::preset("cpu");
  const Chain c = cal.chain(3, DType::kBF16, dev);
  EXPECT_EQ(c.blocks[1].saved_bytes, 3 * cal.block(1, DType::kBF16).saved_bytes);
  EXPECT_GT(cal.step_seconds({}, Schedule::all(cal.num_blocks()), 3, 2, dev), 0.0);
}

}  // namespace
}  // namespace memfit
