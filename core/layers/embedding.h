// TokenEmbedding: the input stage: the token embedding plus, for GPT-2, a learned position
// embedding (the Llama family has none: its positions are rotary, inside the attention).
//
//   TokenEmbedding emb("emb", vocab, max_seq_len, hidden);   // parameters "wte", "wpe"
//   TokenEmbedding llama("emb", vocab, max_seq_len, hidden, /*positions=*/false);  // "wte"
//   Act x0 = emb.forward(ctx, tokens);    // tokens (B,T) int32 -> x0 (B,T,C), kActivation
//   emb.backward(ctx, tokens, dx0);       // wte.grad, wpe.grad += (no input gradient)
//
// Not a Layer (its input is token ids, not an activation), but the same rules apply
// (core/layer.h): outputs in ctx.dtype, gradients accumulate in FP32, deterministic, no host
// reads. It saves nothing: backward needs only the tokens, which the caller keeps.
// wte is (vocab, C) and may be shared with the output head (LmHead, tied).
#pragma once

#include <cstdint>
#include <vector>

#include "core/layer.h"

namespace memfit {

class TokenEmbedding {
 public:
  TokenEmbedding(std::string name, std::int64_t vocab, std::int64_t max_seq_len,
                 std::int64_t hidden, bool positions = true);
  TokenEmbedding(const TokenEmbedding&) = delete;
  TokenEmbedding& operator=(const TokenEmbedding&) = delete;

  // tokens (B,T) with T <= max_seq_len.
  Act forward(LayerContext& ctx, const IndexTensor& tokens);
  void backward(LayerContext& ctx, const IndexTensor& tokens, const Act& dx);

  Parameter& wte() { return wte_; }
  bool has_positions() const { return positions_; }
  Parameter& wpe();  // InvalidArgument without a position table
  std::vector<Parameter*> parameters();
  void allocate(const ParamAlloc& a);
  LayerCost cost(std::int64_t seq_len, DType dtype) const;  // per sample

  std::int64_t vocab() const { return vocab_; }
  std::int64_t max_seq_len() const { return max_seq_len_; }
  std::int64_t hidden() const { return hidden_; }

 private:
  std::string name_;
  std::int64_t vocab_, max_seq_len_, hidden_;
  bool positions_;
  Parameter wte_, wpe_;
};

}  // namespace memfit
