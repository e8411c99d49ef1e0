// LmHead: the output stage: a final norm (GPT-2's LayerNorm or the Llama family's RMSNorm),
// the projection to the vocabulary (optionally tied to the token embedding's wte) and the
// softmax cross-entropy loss, fused.
//
//   LmHead head("head", vocab, hidden, /*tied=*/&emb.wte());   // or nullptr: own "head.weight"
//   LmHead llama("head", vocab, hidden, nullptr, HeadNorm::kRMSNorm, 1e-5f);
//   head.set_loss(LossMode::kChunked);            // the logits in chunks of rows (below)
//   Act losses = head.forward(ctx, xn, targets);  // xn (B,T,C) -> losses (B*T) f32
//   Act dxn = head.backward(ctx, targets, dloss); // dxn (B,T,C), kTemporary; grads +=
//
// dloss is the gradient of the total objective with respect to each row's loss: for a mean
// over the R rows of a global batch, times a loss scale S, dloss = S / R, the same for every
// micro-batch (so an uneven last micro-batch is weighted by its row count).
// Parameters: "lnf.weight", "lnf.bias" (LayerNorm) or "norm.weight" (RMSNorm; HF's
// model.norm), then "head.weight" (vocab, C) unless tied. No bias on the projection.
//
// Two ways to hold the logits (N = B*T rows, V the vocabulary), the same function:
// - LossMode::kWhole (the default here): forward saves the logits (N, V) in ctx.dtype with
//   the normalized input, the norm's statistics and the per-row log-sum-exp; backward computes
//   dlogits in place over them, then the projection's and the norm's gradients.
// - LossMode::kChunked: the rows in chunks of loss_chunk_rows(N): k = min(8, ceil(V / C))
//   chunks, so one chunk's logits are at most an eighth of the whole and no smaller than the
//   hidden states (N, C) (Liger-Kernel's fused linear cross-entropy sizes chunks like the
//   hidden states, torchtune's CEWithChunkedOutputLoss uses 8; chunks of the hidden states'
//   size make many short GEMMs, and each adds its share into the full (V, C) FP32 weight
//   gradient, so the cap keeps that traffic at 8 passes). Forward computes each chunk's logits
//   into a temporary, its losses and log-sum-exp, and frees it: only the normalized input,
//   the statistics and lse are saved. Backward recomputes each chunk's logits (one more
//   (N,C)x(C,V) GEMM than kWhole), turns them into dlogits in place, and adds that chunk's
//   share of dxn and the weight gradient. Nothing of size (N, V) exists. When k = 1 (V <= C)
//   the chunk is every row and kWhole is used: no memory to save, so no recompute to pay.
// The losses, lse and gradients of the two modes are the same up to the GEMMs' row blocking
// (the same bits on backends whose GEMM rows do not depend on the row count).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/layer.h"

namespace memfit {

enum class HeadNorm : std::uint8_t { kLayerNorm, kRMSNorm };
enum class LossMode : std::uint8_t { kWhole, kChunked };
// LossMode::kChunked's most chunks (torchtune's CEWithChunkedOutputLoss count).
inline constexpr std::int64_t kMaxLossChunks = 8;

const char* loss_mode_name(LossMode m);  // "whole", "chunked"
// "whole" or "chunked" into *out; false (out untouched) otherwise.
bool parse_loss_mode(std::string_view text, LossMode* out);

class LmHead {
 public:
  LmHead(std::string name, std::int64_t vocab, std::int64_t hidden, Parameter* tied_wte,
         HeadNorm norm = HeadNorm::kLayerNorm, float eps = 1e-5f);
  ~LmHead();  // out of line: Saved is defined in lm_head.cpp
  LmHead(const LmHead&) = delete;
  LmHead& operator=(const LmHead&) = delete;

  Act forward(LayerContext& ctx, const Act& x, const IndexTensor& targets);
  Act backward(LayerContext& ctx, const IndexTensor& targets, float dloss);
  void release_saved() noexcept;
  bool has_saved() const;
  // The saved logits (B*T, vocab) in ctx.dtype between forward and backward of a kWhole step
  // (tests, golden checks); nullptr otherwise (chunked: none are saved). backward overwrites
  // them with dlogits.
  const Tensor* logits() const;

  // Between steps only (InvalidArgument while holding saved state).
  void set_loss(LossMode m);
  LossMode loss() const { return loss_; }
  // Rows per chunk for n rows: n under kWhole or when V <= C, else ceil(n / k) with
  // k = min(kMaxLossChunks, ceil(V / C)).
  std::int64_t loss_chunk_rows(std::int64_t n) const;

  // The norm's parameters, then the projection's weight (the tied wte too, when tied).
  std::vector<Parameter*> parameters();
  // Allocates the parameters it owns (a tied wte is its owner's).
  void allocate(const ParamAlloc& a);
  // Per sample of seq_len rows; the loss included. Chunked: the chunk's logits are workspace,
  // per sample seq_len / k rows of them (the chunk grows with the batch as the rows do).
  LayerCost cost(std::int64_t seq_len, DType dtype) const;
  bool tied() const { return tied_ != nullptr; }
  HeadNorm norm() const { return norm_; }

 private:
  struct Saved;
  std::string name_;
  std::int64_t vocab_, hidden_;
  HeadNorm norm_;
  float eps_;
  LossMode loss_ = LossMode::kWhole;
  Parameter* tied_;
  Parameter ln_w_, ln_b_, proj_;
  std::unique_ptr<Saved> saved_;
};

}  // namespace memfit
