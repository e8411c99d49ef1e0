// LmHead: GPT-2's output stage: final LayerNorm, projection to the vocabulary (optionally tied
// to the token embedding's wte) and the softmax cross-entropy loss, fused.
//
//   LmHead head("head", vocab, hidden, /*tied=*/&emb.wte());   // or nullptr: own "head.weight"
//   Act losses = head.forward(ctx, xn, targets);  // xn (B,T,C) -> losses (B*T) f32, saves all
//   Act dxn = head.backward(ctx, targets, dloss); // dxn (B,T,C), kTemporary; grads +=
//
// forward always saves what backward needs (the normalized input, LayerNorm statistics, the
// logits (B*T, vocab) in ctx.dtype and the per-row log-sum-exp). backward computes dlogits in
// place over the saved logits (the largest activation of a small-vocabulary GPT is not
// duplicated), then the projection's and the LayerNorm's gradients, and releases everything.
// dloss is the gradient of the total objective with respect to each row's loss: for a mean
// over the R rows of a global batch, times a loss scale S, dloss = S / R, the same for every
// micro-batch (so an uneven last micro-batch is weighted by its row count).
// Parameters: "lnf.weight", "lnf.bias", and "head.weight" (vocab, C) unless tied. No bias on
// the projection (GPT-2 has none).
#pragma once

#include <cstdint>
#include <vector>

#include "core/layer.h"

namespace memfit {

class LmHead {
 public:
  LmHead(std::string name, std::int64_t vocab, std::int64_t hidden, Parameter* tied_wte,
         float ln_eps = 1e-5f);
  ~LmHead();  // out of line: Saved is defined in lm_head.cpp
  LmHead(const LmHead&) = delete;
  LmHead& operator=(const LmHead&) = delete;

  Act forward(LayerContext& ctx, const Act& x, const IndexTensor& targets);
  Act backward(LayerContext& ctx, const IndexTensor& targets, float dloss);
  void release_saved() noexcept;
  bool has_saved() const;
  // The saved logits (B*T, vocab) in ctx.dtype between forward and backward (tests, golden
  // checks); nullptr otherwise. backward overwrites them with dlogits.
  const Tensor* logits() const;

  // lnf.weight, lnf.bias, then the projection's weight (the tied wte too, when tied).
  std::vector<Parameter*> parameters();
  // Allocates the parameters it owns (a tied wte is its owner's).
  void allocate(const ParamAlloc& a);
  LayerCost cost(std::int64_t seq_len, DType dtype) const;  // per sample; the loss included
  bool tied() const { return tied_ != nullptr; }

 private:
  struct Saved;
  std::string name_;
  std::int64_t vocab_, hidden_;
  float eps_;
  Parameter* tied_;
  Parameter ln_w_, ln_b_, proj_;
  std::unique_ptr<Saved> saved_;
};

}  // namespace memfit
