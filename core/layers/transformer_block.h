// TransformerBlock: GPT-2's pre-LN block, x + attn(ln1(x)) then x + mlp(ln2(x)); the unit an
// executor checkpoints (Model names them "h.<i>").
//
//   TransformerBlock blk("h.3", C, heads, /*mlp_ratio=*/4, /*n_layers=*/L);
//   Act y = blk.forward(ctx, x, /*save=*/true);   // (B,T,C) -> (B,T,C)
//   Act dx = blk.backward(ctx, dy);
//
// Parameters, in order (the GPT golden file's names, tests/core/data/gpt_golden.bin):
// h.3.ln1.{weight,bias}, h.3.attn.qkv.{weight,bias}, h.3.attn.proj.{weight,bias},
// h.3.ln2.{weight,bias}, h.3.mlp.fc.{weight,bias}, h.3.mlp.proj.{weight,bias}. The two projections
// into the residual stream are initialized N(0, 0.02/sqrt(2 * n_layers)) (GPT-2 paper, 2.3); other
// weights N(0, 0.02).
//
// Memory: the residual adds run in place over the sublayers' outputs (so the block's output
// and its middle residual stream carry the tags "<name>.mlp.proj" and "<name>.attn.proj"),
// and backward accumulates the LayerNorms' input gradients into one copy of dy, so the block
// allocates nothing beyond its sublayers but that copy. With save == false every sublayer runs
// with save == false and only the output survives. Per sample of T tokens (c = T*C elements
// of dt bytes, a = heads*T*T, f = mlp_ratio*c):
//   saved_bytes   8T + c (ln1 out) + the attention's (4c + 4*heads*T with flash, 4c + a
//                 materialized) + c (x1) + 8T + c (ln2 out) + 2f
//                 = 7c + 2f + 16T + (4*heads*T or a) (the input x excluded; saves_input)
//   output_bytes  c
//   workspace     the largest of the peaks beyond live-before + saved + output (forward) and
//                 beyond live-before + dx (backward); cost() derives it from the sublayers
//   flops         the sublayers' GEMMs (the adds and norms are not counted).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer.h"
#include "core/layers/attention.h"
#include "core/layers/gated_mlp.h"
#include "core/layers/layer_util.h"
#include "core/layers/layernorm.h"
#include "core/layers/mlp.h"
#include "core/layers/rmsnorm.h"

namespace memfit {

// The Llama family's block: the same pre-norm residual structure with RMSNorm, grouped-query
// rotary attention and a SwiGLU MLP (LlamaBlock below). Sublayers are named as HuggingFace
// names them: "<name>.input_layernorm", ".self_attn", ".post_attention_layernorm", ".mlp".
// Every weight is initialized N(0, 0.02) (HF's initializer_range; no GPT-2 residual scaling).
// Per sample (mq, mk as in attention.h, f = T*F): saved_bytes = 4T (input_layernorm's rstd)
// + c (its output) + the attention's mq + 2mk + mq + 4*H*T (with qk_norm also mq + mk +
// 4*(H+G)*T) + c (x1) + 4T + c + 3f (GatedMLP), the input excluded; workspace from the
// sublayers' peaks as for GPT-2.
// Llama's defaults: no biases, a rotary embedding (set attention.freqs with
// rope_frequencies), eps 1e-6 (HF's LlamaConfig).
struct LlamaBlockShape {
  AttentionShape attention{.qkv_bias = false, .proj_bias = false, .rope = true, .freqs = {}};
  std::int64_t inner = 0;  // the MLP's intermediate size F
  bool mlp_bias = false;
  float rms_eps = 1e-6f;
};

// x + attn(norm1(x)) then x + mlp(norm2(x)), for Norm = LayerNorm or RMSNorm and Ffn = MLP
// or GatedMLP (the two instantiations below; the memory rules above hold for both, with each
// sublayer's own figures).
template <class Norm, class Ffn>
class PreNormBlock final : public Layer {
 public:
  // GPT-2 (PreNormBlock<LayerNorm, MLP>): InvalidArgument for sizes < 1, heads not dividing
  // hidden, or (flash attention) a head size hidden / heads above
  // Backend::kMaxAttentionHeadSize.
  PreNormBlock(std::string name, std::int64_t hidden, std::int64_t heads, std::int64_t mlp_ratio,
               std::int64_t n_layers, float ln_eps = 1e-5f,
               AttentionImpl attention = AttentionImpl::kFlash);
  // Llama (PreNormBlock<RMSNorm, GatedMLP>): InvalidArgument as the sublayers say.
  PreNormBlock(std::string name, std::int64_t hidden, const LlamaBlockShape& shape,
               std::int64_t n_layers, AttentionImpl attention = AttentionImpl::kFlash);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  // Everything but the MLP's last projection and the second residual add (backward reads
  // neither's output): a recomputation costs less than the forward it repeats.
  void forward_for_backward(LayerContext& ctx, const Act& x) override;
  Act backward(LayerContext& ctx, const Act& dy) override;
  void release_saved() noexcept override;
  bool has_saved() const override;
  std::vector<Parameter*> parameters() override;
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t seq_len, DType dtype) const;

  Norm& ln1() { return ln1_; }
  CausalSelfAttention& attn() { return attn_; }
  Norm& ln2() { return ln2_; }
  Ffn& mlp() { return mlp_; }

 private:
  std::int64_t hidden_;
  Norm ln1_;
  CausalSelfAttention attn_;
  Norm ln2_;
  Ffn mlp_;
};

// Each instantiation has its own constructor (defined in transformer_block.cpp).
template <>
PreNormBlock<LayerNorm, MLP>::PreNormBlock(std::string name, std::int64_t hidden,
                                           std::int64_t heads, std::int64_t mlp_ratio,
                                           std::int64_t n_layers, float ln_eps,
                                           AttentionImpl attention);
template <>
PreNormBlock<RMSNorm, GatedMLP>::PreNormBlock(std::string name, std::int64_t hidden,
                                              const LlamaBlockShape& shape, std::int64_t n_layers,
                                              AttentionImpl attention);

using TransformerBlock = PreNormBlock<LayerNorm, MLP>;
using LlamaBlock = PreNormBlock<RMSNorm, GatedMLP>;
extern template class PreNormBlock<LayerNorm, MLP>;
extern template class PreNormBlock<RMSNorm, GatedMLP>;

// MLPBlock: x + mlp(ln(x)), the block of ModelSpec kind "mlp" (no attention). Parameters
// "<name>.ln.{weight,bias}", "<name>.mlp.fc.{weight,bias}", "<name>.mlp.proj.{weight,bias}";
// the MLP's projection initialized N(0, 0.02/sqrt(2 * n_layers)). Same memory rules as
// TransformerBlock; saved_bytes = 8T + c + 2f.
class MLPBlock final : public Layer {
 public:
  MLPBlock(std::string name, std::int64_t hidden, std::int64_t mlp_ratio, std::int64_t n_layers,
           float ln_eps = 1e-5f);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  Act backward(LayerContext& ctx, const Act& dy) override;
  void release_saved() noexcept override;
  bool has_saved() const override;
  std::vector<Parameter*> parameters() override;
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t seq_len, DType dtype) const;

  LayerNorm& ln() { return ln_; }
  MLP& mlp() { return mlp_; }

 private:
  std::int64_t hidden_;
  LayerNorm ln_;
  MLP mlp_;
};

}  // namespace memfit
