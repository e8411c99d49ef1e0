// CausalSelfAttention: GPT-2's attention sublayer, proj(attention(qkv(x))).
//
//   CausalSelfAttention attn("h.0.attn", C, heads, /*proj_std=*/0.02f / std::sqrt(2.0f * L));
//   Act y = attn.forward(ctx, x, /*save=*/true);   // x (B,T,C) -> y (B,T,C)
//   Act dx = attn.backward(ctx, dy);
//
// Parameters, in order: "<name>.qkv.weight" (3C, C) (rows q, k, v; heads contiguous blocks
// of hs = C/heads rows within each, as GPT-2's c_attn), "<name>.qkv.bias" (3C),
// "<name>.proj.weight" (C, C) init N(0, proj_std), "<name>.proj.bias" (C).
// Arithmetic: Backend::attention_forward/backward (causal, scale 1/sqrt(hs)).
// Per sample of T tokens, with c = T*C elements and dt the activation dtype's size:
//   saved      qkvr (3c) + att (heads*T*T) + the merged heads, proj's input (c); its input x
//              is held by the qkv projection (saves_input)
//   output     c
//   workspace  backward: dqkv (3c) + dqkvr (3c) + datt (heads*T*T) + proj's dx (c) live at
//              once, less the dx slot and the merged heads already released: 5c + heads*T*T;
//              forward: qkv (3c) + attention's scratch (c) beside what it saves: 3c
//   flops      forward 2*T*C*3C + 4*T*T*C (q@k^T and att@v, the full T x T squares the GEMMs
//              compute) + 2*T*C*C; backward twice that.
// With save == false qkvr and att are kTemporary and gone when forward returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer.h"
#include "core/layers/layer_util.h"
#include "core/layers/linear.h"

namespace memfit {

class CausalSelfAttention final : public Layer {
 public:
  // InvalidArgument unless heads >= 1 divides hidden.
  CausalSelfAttention(std::string name, std::int64_t hidden, std::int64_t heads,
                      float proj_std = 0.02f);

  Act forward(LayerContext& ctx, const Act& x, bool save) override;
  Act backward(LayerContext& ctx, const Act& dy) override;
  void release_saved() noexcept override;
  bool has_saved() const override { return qkvr_ != nullptr; }
  std::vector<Parameter*> parameters() override;
  LayerCost cost(std::int64_t seq_len, DType dtype) const override;
  PeakExcess peaks(std::int64_t seq_len, DType dtype) const;

  std::int64_t hidden() const { return hidden_; }
  std::int64_t heads() const { return heads_; }
  Linear& qkv() { return qkv_; }
  Linear& proj() { return proj_; }

 private:
  std::int64_t hidden_, heads_;
  Linear qkv_, proj_;
  Act qkvr_, att_;  // saved: (3,B,H,T,hs) and (B,H,T,T)
};

}  // namespace memfit
