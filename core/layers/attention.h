// CausalSelfAttention: GPT-2's attention sublayer, proj(attention(qkv(x))).
//
//   CausalSelfAttention attn("h.0.attn", C, heads, /*proj_std=*/0.02f / std::sqrt(2.0f * L));
//   Act y = attn.forward(ctx, x, /*save=*/true);   // x (B,T,C) -> y (B,T,C)
//   Act dx = attn.backward(ctx, dy);
//
// Parameters, in order: "<name>.qkv.weight" (3C, C) (rows q, k, v; heads contiguous blocks
// of hs = C/heads rows within each, as GPT-2's c_attn), "<name>.qkv.bias" (3C),
// "<name>.proj.weight" (C, C) init N(0, proj_std), "<name>.proj.bias" (C).
//
// Two implementations of the same function (causal, scale 1/sqrt(hs)), chosen per layer:
// - AttentionImpl::kFlash, the default: Backend::flash_attention_forward/backward, tiled with
//   an online softmax; nothing of size T x T exists. Per sample of T tokens, with c = T*C
//   elements of the activation dtype's size and s = heads*T*4 bytes (one f32 per row):
//     saved      qkv (3c), the merged heads (c; proj's input), lse (s); its input x is held
//                by the qkv projection (saves_input)
//     output     c
//     workspace  backward: dqkv (3c) + delta (s) beside dmerged, the saved state and dy,
//                less the dx slot: 3c + s; forward: none
//     flops      forward 2*T*C*3C + 2*T*(T+1)*C (q.k and p.v over the T(T+1)/2 live pairs)
//                + 2*T*C*C; backward 2 * (the two projections) + 5*T*(T+1)*C (FlashAttention-2's
//                five products, q.k recomputed)
// - AttentionImpl::kMaterialized: Backend::attention_forward/backward, the whole (T, T)
//   probability matrix saved (llm.c's decomposition; the reference, and `attention:
//   materialized` in a model spec to reproduce older results). With a = heads*T*T elements:
//     saved      qkvr (3c) + att (a) + the merged heads (c)
//     output     c
//     workspace  backward: dqkv (3c) + dqkvr (3c) + datt (a) + proj's dx (c) live at once,
//                less the dx slot and the merged heads already released: 5c + a;
//                forward: qkv (3c) + attention's scratch (c) beside what it saves: 3c
//     flops      forward 2*T*C*3C + 4*T*T*C (the full T x T squares the GEMMs compute)
//                + 2*T*C*C; backward twice that.
// With save == false nothing but the output survives forward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer.h"
#include "core/layers/layer_util.h"
#include "core/layers/linear.h"

namespace memfit {

enum class AttentionImpl : std::uint8_t { kFlash, kMaterialized };
const char* attention_impl_name(AttentionImpl impl);  // "flash", "materialized"

class CausalSelfAttention final : public Layer {
 public:
  // InvalidArgument unless heads >= 1 divides hidden (and, for kFlash, the head size
  // hidden/heads is at most Backend::kMaxAttentionHeadSize).
  CausalSelfAttention(std::string name, std::int64_t hidden, std::int64_t heads,
                      float proj_std = 0.02f, AttentionImpl impl = AttentionImpl::kFlash);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  Act backward(LayerContext& ctx, const Act& dy) override;
  void release_saved() noexcept override;
  bool has_saved() const override { return qkv_saved_ != nullptr; }
  std::vector<Parameter*> parameters() override;
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t seq_len, DType dtype) const;

  std::int64_t hidden() const { return hidden_; }
  std::int64_t heads() const { return heads_; }
  AttentionImpl impl() const { return impl_; }
  Linear& qkv() { return qkv_; }
  Linear& proj() { return proj_; }

 private:
  Act forward_flash(LayerContext& ctx, Act qkv, bool save);
  Act forward_materialized(LayerContext& ctx, Act qkv, bool save);

  std::int64_t hidden_, heads_;
  AttentionImpl impl_;
  Linear qkv_, proj_;
  // Saved. qkv_saved_: qkv (B,T,3C) for kFlash, qkvr (3,B,H,T,hs) for kMaterialized;
  // softmax_: what the backward needs of the softmax, lse (B,H,T) f32 or att (B,H,T,T);
  // merged_ (kFlash only): the merged heads (B,T,C), proj's input, which delta reads.
  Act qkv_saved_, softmax_, merged_;
};

}  // namespace memfit
