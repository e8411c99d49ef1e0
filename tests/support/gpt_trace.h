// make_gpt_training_trace(): a realistic GPT-2 training allocation sequence as an AllocTrace
// (memory/alloc_trace.h), for the allocator's replay and fragmentation tests and
// bench/trace_replay_bench. Test and benchmark support, not part of the library: it is built
// as memfit_test_support (tests/CMakeLists.txt).
//
//   GptTraceSpec spec;                       // gpt2-124M shapes, micro-batch 4, 3 steps
//   AllocTrace trace = make_gpt_training_trace(spec);
//   ReplayResult r = replay(trace, alloc);   // memory/trace_replay.h
#pragma once

#include <cstddef>
#include <cstdint>

#include "memory/alloc_trace.h"
#include "memory/stream.h"

namespace memfit {

// What it models (B micro_batch, T seq_len, C hidden, H heads, L layers, V vocab, a the
// activation dtype bytes; every tensor is its own allocation, as in an eager framework):
// - Parameters, allocated once before step 0, FP32, one allocation per tensor in GPT-2's
//   order: wte (V,C), wpe (max_seq_len,C), per layer ln1.{w,b} (C), attn.qkv.{w (C,3C),
//   b (3C)}, attn.proj.{w (C,C), b (C)}, ln2.{w,b} (C), mlp.fc.{w (C,4C), b (4C)},
//   mlp.proj.{w (4C,C), b (C)}; ln_f.{w,b} (C). The LM head is tied to wte. For gpt2 this is
//   124,439,808 parameters (HF GPT-2 small).
// - Per step: the batch (inputs and targets, (B,T) int64) is copied host->device on the copy
//   stream and recorded on the default stream (the prefetch pattern: allocated on the copy
//   stream, used on the compute stream, freed on the compute stream after the step).
// - Forward per block, saving what backward needs (Korthikanti et al. 2022, "Reducing
//   Activation Recomputation", count the same tensors): the block input (B,T,C), ln1 mean and
//   rstd (B,T) FP32, ln1 output (B,T,C), qkv (B,T,3C), attention probabilities (B,H,T,T),
//   attention output re-laid out (B,T,C), the residual after attention (B,T,C), ln2 mean/rstd
//   and output, MLP pre-GELU (B,T,4C) and post-GELU (B,T,4C). Temporaries, freed right after
//   their last use: attention scores (B,H,T,T) before softmax, the per-head attention output
//   (B,H,T,C/H) before re-layout, the attention projection and MLP outputs (B,T,C) before each
//   residual add. Saved bytes per block: 16*B*T*C*a + B*H*T*T*a + 16*B*T.
// - Head: ln_f, logits (B,T,V) in the activation dtype, cross-entropy in FP32 (logits cast to
//   FP32 (B,T,V) then log-softmax (B,T,V) FP32, saved), a 4-byte loss.
// - Backward: the loss gradient through log-softmax (two FP32 (B,T,V) temporaries), the LM
//   head, ln_f, then blocks in reverse. Each saved activation is freed at the point its last
//   backward use is done; gradient temporaries ((B,T,4C), (B,H,T,T), (B,T,3C), (B,T,C)) are
//   allocated and freed as the chain rule reaches them; residual-stream gradients accumulate
//   in place (autograd's input buffer). Each weight gradient is computed into a temporary of
//   the weight's size in the activation dtype (mixed precision) and accumulated into the FP32
//   gradient; without mixed precision the FP32 gradient is computed directly on step 0 and
//   into an FP32 temporary afterwards.
// - Gradients: FP32, allocated on step 0 when backward first produces them, persistent
//   (zero_grad(set_to_none=False)).
// - Optimizer (AdamW, foreach style): on step 0 exp_avg and exp_avg_sq (FP32, per parameter,
//   persistent); every step the per-parameter gradient norms for clipping (4 bytes each, a
//   stacked (n) vector and a total) and the sqrt(exp_avg_sq) denominators (one FP32
//   temporary per parameter, all alive together, as torch._foreach_sqrt makes them).
// - Mixed precision: each matmul weight is cast to the activation dtype in forward (wte for
//   the LM head, qkv/proj/fc/fcproj per block), kept for backward, freed after its backward.
// - Phases "forward", "backward", "optimizer" and a step marker per step.
// What it does not model: dropout (masks and outputs; GPT-2 pre-training in llm.c uses none),
// fused kernels (flash attention would drop the (B,H,T,T) tensors), autocast's FP32 layernorm
// and softmax outputs (activations here are all in the activation dtype, llm.c-style), cuBLAS
// workspaces, allocations by communication libraries, gradient accumulation over
// micro-batches, checkpointing, and the timing between operations.
struct GptTraceSpec {
  std::int64_t layers = 12;
  std::int64_t hidden = 768;
  std::int64_t heads = 12;
  std::int64_t seq_len = 1024;
  std::int64_t max_seq_len = 1024;  // rows of wpe; seq_len <= max_seq_len
  std::int64_t vocab = 50257;
  std::int64_t micro_batch = 4;
  std::int64_t steps = 3;
  std::int64_t act_bytes = 2;   // activation dtype: 2 (fp16/bf16) or 4 (fp32)
  bool mixed_precision = true;  // low-precision weight copies; needs act_bytes == 2
  bool use_copy_stream = true;  // batches arrive on copy_stream with record_stream
  StreamId copy_stream = 1;
  bool empty_cache_after_first_step = false;
};

// Throws InvalidArgument naming the field for a spec out of range (non-positive sizes, hidden
// not divisible by heads, seq_len > max_seq_len, act_bytes not 2 or 4, mixed precision with
// act_bytes 4, copy_stream == default stream) or whose byte counts overflow.
AllocTrace make_gpt_training_trace(const GptTraceSpec& spec);

// Closed-form byte counts of the model above, for tests and reports.
struct GptTraceBytes {
  std::size_t parameter_count = 0;
  std::size_t saved_per_block = 0;  // activations a block saves for backward
  std::size_t head_saved = 0;       // ln_f output and stats, FP32 log-softmax
};
GptTraceBytes gpt_trace_bytes(const GptTraceSpec& spec);

}  // namespace memfit
