// CausalSelfAttention: the attention sublayer, proj(attention(rope(qkv(x)))): GPT-2's, and the
// Llama family's (grouped-query, rotary, optional biases, an explicit head size).
//
//   CausalSelfAttention attn("h.0.attn", C, heads, /*proj_std=*/0.02f / std::sqrt(2.0f * L));
//   AttentionShape s{.heads = 32, .kv_heads = 8, .head_dim = 128, .qkv_bias = false,
//                    .proj_bias = false, .rope = true, .freqs = rope_frequencies(128, 5e5f)};
//   CausalSelfAttention llama("layers.0.self_attn", 4096, s, proj_std);
//   Act y = attn.forward(ctx, x, /*save=*/true);   // x (B,T,C) -> y (B,T,C)
//   Act dx = attn.backward(ctx, dy);
//
// With H heads of hs, G kv heads, q = H*hs and k = v = G*hs columns per token:
// parameters, in order: "<name>.qkv.weight" (q + 2k, C) (rows q, then k, then v; heads
// contiguous blocks of hs rows within each, as GPT-2's c_attn and as HuggingFace's q_proj,
// k_proj, v_proj stacked), "<name>.qkv.bias" (q + 2k) when qkv_bias, "<name>.proj.weight"
// (C, q) init N(0, proj_std) (HF's o_proj), "<name>.proj.bias" (C) when proj_bias. GPT-2:
// G = H, hs = C/H, both biases, no rotary embedding.
// With qk_norm (Qwen3), "<name>.q_norm.weight" and "<name>.k_norm.weight" (hs, init 1) follow
// the qkv parameters: each q (k) head of qkv's output is RMS-normed with them in place
// (Backend::qk_norm_forward) before the rotary embedding, as HF's Qwen3Attention; the heads
// before the norm (q and k columns, mq + mk) and one f32 rstd per head (r = (H+G)*T*4 bytes)
// are saved for the backward.
// Rotary embedding (rope): applied in place to the q and k columns of qkv's output, so what
// the attention saves is already rotated; the backward rotates dq, dk back (Backend::rope).
//
// Two implementations of the same function (causal, scale 1/sqrt(hs)), chosen per layer:
// - AttentionImpl::kFlash, the default: Backend::flash_attention_forward/backward, tiled with
//   an online softmax; nothing of size T x T exists. Per sample of T tokens, with c, mq and mk
//   = T*C, T*q and T*k elements of the activation dtype's size (GPT-2: all c) and
//   s = H*T*4 bytes (one f32 per row):
//     saved      qkv (mq + 2mk), the merged heads (mq; proj's input), lse (s); its input x is
//                held by the qkv projection (saves_input); with qk_norm also mq + mk + r
//     output     c
//     workspace  backward: dqkv (mq + 2mk) + delta (s) beside dmerged (mq), the saved state
//                and dy, less the dx slot: 2mq + 2mk + s - c; forward: none
//     flops      forward 2*T*C*(q+2k) + 2*T*(T+1)*q (q.k and p.v over the T(T+1)/2 live pairs)
//                + 2*T*q*C; backward 2 * (the two projections) + 5*T*(T+1)*q (FlashAttention-2's
//                five products, q.k recomputed). The rotary embedding's work is not counted.
// - AttentionImpl::kMaterialized (G = H only): Backend::attention_forward/backward, the whole
//   (T, T) probability matrix saved (llm.c's decomposition; the reference, and `attention:
//   materialized` in a model spec to reproduce older results). With a = H*T*T elements:
//     saved      qkvr (3mq) + att (a) + the merged heads (mq)
//     output     c
//     workspace  backward: dqkv (3mq) + dqkvr (3mq) + datt (a) + dmerged (mq) live at once,
//                less the dx slot (c) and the merged heads already released: 6mq + a - c;
//                forward: qkv (3mq) + attention's scratch (mq) beside what it saves, less the
//                output's slot: 4mq - c
//     flops      forward 2*T*C*3q + 4*T*T*q (the full T x T squares the GEMMs compute)
//                + 2*T*q*C; backward twice that.
// With save == false nothing but the output survives forward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"  // RopeFreqs
#include "core/layer.h"
#include "core/layers/attention_impl.h"
#include "core/layers/layer_util.h"
#include "core/layers/linear.h"

namespace memfit {

// The shape of an attention sublayer beyond its width C. 0 for kv_heads means heads
// (multi-head attention); 0 for head_dim means C / heads.
struct AttentionShape {
  std::int64_t heads = 1;
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  bool qkv_bias = true;
  bool proj_bias = true;
  bool rope = false;
  RopeFreqs freqs;            // with rope: core/rope.h's rope_frequencies(head_dim, theta, scaling)
  bool qk_norm = false;       // Qwen3's per-head RMSNorm of q and k, before the rotary embedding
  float qk_norm_eps = 1e-6f;  // its epsilon (the model's rms_norm_eps)
};

class CausalSelfAttention final : public Layer {
 public:
  // GPT-2's: heads of hidden / heads, both biases, no rotary embedding. InvalidArgument unless
  // heads >= 1 divides hidden.
  CausalSelfAttention(std::string name, std::int64_t hidden, std::int64_t heads,
                      float proj_std = 0.02f, AttentionImpl impl = AttentionImpl::kFlash);
  // Any shape. InvalidArgument unless heads >= 1, kv_heads divides heads, the head size is
  // 1 to Backend::kMaxAttentionHeadSize (even with rope, and freqs.half == head_dim / 2),
  // hidden divides by heads when head_dim is 0, kMaterialized has kv_heads == heads and no
  // qk_norm, and qk_norm_eps is finite and > 0 with qk_norm.
  CausalSelfAttention(std::string name, std::int64_t hidden, const AttentionShape& shape,
                      float proj_std = 0.02f, AttentionImpl impl = AttentionImpl::kFlash);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  Act backward(LayerContext& ctx, const Act& dy) override;
  void release_saved() noexcept override;
  bool has_saved() const override { return qkv_saved_ != nullptr; }
  std::vector<Parameter*> parameters() override;
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t seq_len, DType dtype) const;

  std::int64_t hidden() const { return hidden_; }
  std::int64_t heads() const { return shape_.heads; }
  std::int64_t kv_heads() const { return shape_.kv_heads; }
  std::int64_t head_dim() const { return shape_.head_dim; }
  const AttentionShape& shape() const { return shape_; }  // kv_heads and head_dim resolved
  AttentionImpl impl() const { return impl_; }
  Linear& qkv() { return qkv_; }
  Linear& proj() { return proj_; }

 private:
  // qk_norm: qkv's q and k heads RMS-normed in place; with save, what the backward reads kept.
  void norm_qk(LayerContext& ctx, const Act& qkv, bool save);
  Act forward_flash(LayerContext& ctx, Act qkv, bool save);
  Act forward_materialized(LayerContext& ctx, Act qkv, bool save);

  std::int64_t hidden_;
  AttentionShape shape_;
  AttentionImpl impl_;
  Linear qkv_, proj_;
  Parameter q_norm_, k_norm_;  // with qk_norm only (hs each)
  // Saved. qkv_saved_: qkv (B,T,3C) for kFlash, qkvr (3,B,H,T,hs) for kMaterialized;
  // softmax_: what the backward needs of the softmax, lse (B,H,T) f32 or att (B,H,T,T);
  // merged_ (kFlash only): the merged heads (B,T,C), proj's input, which delta reads.
  Act qkv_saved_, softmax_, merged_;
  // With qk_norm: the q and k heads before the norm (B,T,(H+G)*hs) and their rstd (B,T,H+G).
  Act qk_in_, qk_rstd_;
};

}  // namespace memfit
