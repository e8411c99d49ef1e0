// Backend: the stream-ordered compute interface every kernel in memfit goes through.
//
//   CpuBackend be;                                   // or CudaBackend, MetaBackend
//   CachingAllocator alloc(provider, conf, &be.stream_sync());
//   StreamId s = be.create_stream();
//   GemmDesc d;                                      // C = A @ B^T, the Linear layer
//   d.m = B * T; d.n = OC; d.k = C; d.trans_b = true;
//   be.gemm(s, d, inp, weight, out);                 // inp (BT,C) weight (OC,C) -> out (BT,OC)
//   be.fill(s, norm, 0.0f);                          // norm: f32 (2,) on be.device()
//   be.sumsq(s, grad, norm);                         // norm[0] += sum g^2, norm[1] += #non-finite
//   be.copy(s, norm, norm_host);                     // to a host tensor
//   be.synchronize(s);
//   SumSqResult r = read_sumsq(norm_host);
//
// Contract, for every implementation (CPU, meta, CUDA):
// - Work is ordered per stream, as on CUDA: an op returns once it is queued; its effects are
//   visible to later ops on the same stream, and to the host after synchronize(stream) or
//   after an event recorded behind it has completed. Work on different streams is unordered
//   unless wait_event() orders it. kDefaultStream always exists; other streams come from
//   create_stream(). The meta backend runs every op inline on the calling thread, so its
//   streams are always idle and its events complete when recorded; so does the CPU backend by
//   default, and with CpuBackendOptions::worker_streams each created stream runs its ops on a
//   thread of its own (kDefaultStream stays inline), so copy/compute overlap is real.
// - Tensors are views (core/tensor.h) of contiguous row-major memory on device() (copy() also
//   takes host tensors, Device::kCpu). They must stay alive until the op has run on its stream.
// - Every op validates before queueing anything: stream, devices, dtypes, element counts,
//   overlap of inputs and outputs, and 32-bit limits where a library needs them. A violation
//   throws InvalidArgument naming the backend, the op, the operand and what would be valid;
//   nothing has been written then. The checks live in this class (backend.cpp) so every
//   backend accepts and rejects exactly the same calls; implementations see valid calls only.
// - Arithmetic is FP32 whatever the storage dtype: inputs widen exactly to f32, results round
//   to the output dtype (nearest even, as memfit::convert). Reductions accumulate wider.
// - The neural-network ops (layernorm, GELU, attention, embeddings, cross-entropy, AdamW; see
//   "neural-network ops" below) follow the same rules; their checks live in backend_nn.cpp.
//   Index values (token ids, targets) are data, not arguments: see embedding_forward.
// - Thread safety: stream and event calls may come from any thread (the caching allocator
//   calls the StreamSync from its own lock). Ops may be issued from several threads as long as
//   no two threads use one stream at the same time (as CUDA streams).
#pragma once

#include <cstdint>
#include <string>

#include "core/adamw.h"  // AdamWConstants: plain data shared by every backend's AdamW
#include "core/dtype.h"
#include "core/tensor.h"
#include "memory/stream.h"

namespace memfit {

class CachingAllocator;  // memory/caching_allocator.h

// C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]   for b in [0, batch), row-major, where
//   op(A[b]) is (m, k): A[b] is stored (m, k), or (k, m) when trans_a;
//   op(B[b]) is (k, n): B[b] is stored (k, n), or (n, k) when trans_b;
//   C[b] is stored (m, n);
//   X[b] starts at element b * stride_x of X's tensor (kPacked: the matrix size, i.e. m*k for
//   A, k*n for B, m*n for C; 0 for A or B broadcasts one matrix to every batch entry).
// Every matrix is dense: its leading dimension is its stored column count.
// A, B and C may each be f32, f16 or bf16 (A and B may differ); products accumulate in FP32.
// beta == 0 means C is write-only: what C held (NaN included) does not reach the result.
// k == 0 gives C = beta * C. m, n or batch == 0 is a valid no-op.
// Tensors need numel >= (batch - 1) * stride + matrix size; shapes beyond that are not read,
// so callers pass (B, T, C) activations as m = B*T without reshaping. C's matrices must not
// overlap one another (stride_c >= m*n when batch > 1), and C's extent (from its first
// element to the end of its last matrix, gaps between strided matrices included) must not
// overlap A's or B's extent.
struct GemmDesc {
  static constexpr std::int64_t kPacked = -1;

  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
  std::int64_t batch = 1;
  std::int64_t stride_a = kPacked;  // in elements
  std::int64_t stride_b = kPacked;
  std::int64_t stride_c = kPacked;

  std::int64_t flops() const;  // 2*m*n*k*batch, saturating at INT64_MAX
};

// sumsq()'s output is an f32 tensor of kSumSqSlots elements on the device:
//   [0] sum of x^2 over finite elements; becomes +inf if the f32 total overflows.
//   [1] count of non-finite elements (NaN, +-inf); exact to 2^24, and > 0 whenever one was seen.
// Results accumulate (+=), so one slot pair can gather a whole model's gradient norm with no
// host round trip: fill(s, out, 0), sumsq() per tensor, one copy() to a host tensor, one sync.
// Deterministic on every backend: the same x and out give the same bits whatever the thread
// count or launch configuration (partials are combined in a fixed order, never by float
// atomics), so a loss-scale or clipping decision replays exactly.
inline constexpr std::int64_t kSumSqSlots = 2;

struct SumSqResult {
  double sum_sq = 0.0;
  bool nonfinite = false;
};
// Reads a sumsq() output that lives on the host (Device::kCpu): after synchronize(stream).
SumSqResult read_sumsq(const Tensor& host_out);

// A non-owning view of int32 indices (token ids, targets) on a device. Tensor holds floating
// dtypes only (core/dtype.h), so indices get their own view; the caller owns the memory (a
// Block from the caching allocator, 4-byte aligned) as for a Tensor.
struct IndexTensor {
  const std::int32_t* data = nullptr;
  Shape shape;
  Device device = Device::kCpu;
  std::int64_t numel() const { return shape.numel(); }
};

// Sizes of attention's head permutes (Backend::do_split_heads / do_merge_heads).
struct HeadDims {
  std::int64_t b, t, parts, heads, hs;
};

// Sizes of flash_attention_forward/backward, resolved from validated operands: B, T, H query
// heads, G key/value heads (G divides H), hs the head size. B or T may be 0 (a no-op).
struct AttentionDims {
  std::int64_t b, t, heads, kv_heads, hs;
  std::int64_t group() const { return heads / kv_heads; }           // query heads per kv head
  std::int64_t row() const { return (heads + 2 * kv_heads) * hs; }  // qkv's last dimension
};

// Rotary embedding frequencies, one per pair of a head's dimensions (core/rope.h computes them
// from a model's theta and scaling): plain data, passed by value to every backend's kernel.
struct RopeFreqs {
  std::int64_t half = 0;  // hs / 2, at most 128
  float inv_freq[128] = {};
};

// ---- conv2d: descriptor (conv helper's section; ops below, checks in backend_conv.cpp) ----
// A 2-D convolution (cross-correlation, as torch.nn.functional.conv2d and cuDNN's
// CUDNN_CROSS_CORRELATION), channels-last so activations stay (B, T, C) with T = H*W:
//   inp (N,H,W,C), weight (K,R,S,C) -> out (N,P,Q,K)
//   out[n,p,q,k] = sum_{r,s,c} inp[n, p*stride_h - pad_h + r, q*stride_w - pad_w + s, c]
//                              * weight[k,r,s,c]      (positions outside the image read 0)
//   P = (H + 2*pad_h - R) / stride_h + 1,  Q = (W + 2*pad_w - S) / stride_w + 1.
// No bias (add_bias adds one over out's last dimension), no dilation, one group.
// Valid: N >= 0 (0 is a no-op); H, W, C, K, R, S >= 1; strides >= 1; pads >= 0;
// H + 2*pad_h >= R and W + 2*pad_w >= S; every size and every operand's element count fits
// in int32 (cuDNN's descriptors take int). invalid_reason() names the first rule broken; the
// backend's checks report it. p() and q() are 0 when their own sizes are out of range, and the
// sums and products they and flops() form are checked, so an absurd descriptor never wraps.
struct Conv2dDesc {
  std::int64_t n = 0, h = 0, w = 0, c = 0;  // input
  std::int64_t k = 0, r = 0, s = 0;         // filters: K of R x S x C
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;

  std::int64_t p() const;      // output height
  std::int64_t q() const;      // output width
  std::int64_t flops() const;  // 2*N*P*Q*K*R*S*C, saturating at INT64_MAX
  // Why the descriptor is not valid ("" when it is): the first rule above it breaks.
  std::string invalid_reason() const;
  std::string str() const;  // "n=2 h=5 w=7 c=3 k=4 r=3 s=3 stride=(1,2) pad=(1,0)"
};
// ---- end conv2d ----

class Backend {
 public:
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual Device device() const = 0;
  virtual const char* name() const = 0;  // "cpu", "meta", "cuda"

  // ---- streams and events ----------------------------------------------------------------
  StreamId create_stream();
  // Waits for the stream's work, then forgets it. kDefaultStream cannot be destroyed.
  void destroy_stream(StreamId stream);
  bool has_stream(StreamId stream) const;
  // Blocks until all work queued on `stream` so far has finished.
  void synchronize(StreamId stream);

  // An event marks the work queued on a stream so far; handles are never 0.
  EventHandle record_event(StreamId stream);
  bool query_event(EventHandle event);                  // true once complete; never blocks
  void synchronize_event(EventHandle event);            // blocks until complete
  void wait_event(StreamId stream, EventHandle event);  // later work on `stream` waits for it
  void release_event(EventHandle event);                // the handle is dead afterwards

  // The allocator's view of the events above (memory/stream.h); lives as long as the backend.
  StreamSync& stream_sync() { return sync_; }

  // Where GEMM (and conv) workspace or scratch comes from from now on: `alloc`, as
  // Category::kWorkspace blocks that count against its budget, or nullptr for the backend's
  // own (the CPU backend's scratch pool; none on CUDA). `alloc` must outlive its use; call
  // with nullptr before it dies. Each backend says what it takes (cpu: the 16-bit widening
  // scratch; cuda: cuBLASLt's workspace; meta: the same allocations as the backend it models).
  // The base backend takes no workspace: a no-op.
  virtual void set_workspace_allocator(CachingAllocator* alloc) { (void)alloc; }

  // ---- ops: each validates, then queues on `stream` ----------------------------------------
  void gemm(StreamId stream, const GemmDesc& d, const Tensor& a, const Tensor& b, const Tensor& c);
  // x[i] = value rounded to x's dtype.
  void fill(StreamId stream, const Tensor& x, float value);
  // dst = src, same dtype and numel (shapes may differ); each side on device() or the host.
  // src == dst is a no-op; other overlap is rejected.
  void copy(StreamId stream, const Tensor& src, const Tensor& dst);
  // dst = convert(src), any dtypes, same numel, both on device(), no overlap.
  void cast(StreamId stream, const Tensor& src, const Tensor& dst);
  // y += a * x, any dtypes, same numel; x and y must not overlap (x == y is allowed).
  void axpy(StreamId stream, float a, const Tensor& x, const Tensor& y);
  // x *= a.
  void scale(StreamId stream, float a, const Tensor& x);
  // out (f32, kSumSqSlots elements) += {sum of x^2, non-finite count}; see kSumSqSlots.
  void sumsq(StreamId stream, const Tensor& x, const Tensor& out);

  // ---- neural-network ops (GPT-2's layers; see backend_nn.cpp for the checks) --------------
  // Shapes are written llm.c-style; a "row" is the last dimension, and N is the product of the
  // others, so (B,T,C) activations pass as they are. Tensors other than the ones marked f32
  // may be f32, f16 or bf16 each. Statistics (mean, rstd, lse, losses) and the gradients of
  // parameters (dweight, dbias, dwte, dwpe) are f32: parameter gradients accumulate (+=) in
  // FP32 across micro-batches and layers. Activation gradients are written (=) unless marked
  // +=. An op that says "in place" accepts that output being exactly that input (same address
  // and dtype); any other overlap of an output with an operand is rejected. Reductions over
  // rows or over the batch are deterministic: a fixed order, no float atomics.

  // inp (N,C), weight (C), bias (C) -> out (N,C), mean (N) f32, rstd (N) f32
  //   out = (inp - mean) * rstd * weight + bias, rstd = 1/sqrt(var + eps) (biased variance).
  void layernorm_forward(StreamId stream, const Tensor& inp, const Tensor& weight,
                         const Tensor& bias, float eps, const Tensor& out, const Tensor& mean,
                         const Tensor& rstd);
  // dout (N,C), inp (N,C), weight (C), mean (N) f32, rstd (N) f32
  //   -> dinp (N,C) +=, dweight (C) f32 +=, dbias (C) f32 +=
  // dinp accumulates because GPT-2's layernorms read the residual stream, whose gradient
  // already holds the skip connection's share.
  void layernorm_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                          const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                          const Tensor& dinp, const Tensor& dweight, const Tensor& dbias);

  // inp (N) -> out (N): GPT-2's tanh approximation
  //   out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). In place allowed (out = inp).
  void gelu_forward(StreamId stream, const Tensor& inp, const Tensor& out);
  // dout (N), inp (N) -> dinp (N) = gelu'(inp) * dout. In place allowed (dinp = dout).
  void gelu_backward(StreamId stream, const Tensor& dout, const Tensor& inp, const Tensor& dinp);

  // a (N), b (N) -> out (N) = a + b (the residual add). In place allowed (out = a or b).
  void add(StreamId stream, const Tensor& a, const Tensor& b, const Tensor& out);
  // bias (OC), out (N,OC): out += bias on every row (gemm() has no bias term).
  void add_bias(StreamId stream, const Tensor& bias, const Tensor& out);
  // dout (N,OC) -> dbias (OC) f32 += sum over rows of dout.
  void bias_backward(StreamId stream, const Tensor& dout, const Tensor& dbias);

  // Causal softmax over the last dimension of (..., T, T) score matrices:
  //   preatt (R,T,T) -> att (R,T,T), att[r,i,j] = exp(s_ij - max) / sum_{k<=i} exp(s_ik - max)
  //   with s_ij = scale * preatt[r,i,j] for j <= i, and exactly 0 for j > i.
  // In place allowed (att = preatt).
  void softmax_causal_forward(StreamId stream, const Tensor& preatt, float scale,
                              const Tensor& att);
  // datt (R,T,T), att (R,T,T) -> dpreatt (R,T,T)
  //   dpreatt[i,j] = scale * att[i,j] * (datt[i,j] - sum_{k<=i} att[i,k] datt[i,k]), 0 for j > i.
  // In place allowed (dpreatt = datt).
  void softmax_causal_backward(StreamId stream, const Tensor& datt, const Tensor& att, float scale,
                               const Tensor& dpreatt);

  // Causal multi-head self-attention, C = heads * hs, scale = 1/sqrt(hs). Composed here, in
  // the base class, from gemm(), softmax_causal_*() and the head permutes below, so a backend
  // implements those primitives and gets attention with the same arithmetic (llm.c's CUDA
  // decomposition, where cuBLAS does the products):
  //   qkv (B,T,3C) -> split heads -> qkvr (3,B,H,T,hs)       saved for backward
  //   att = q @ k^T                 (B*H batched GEMM)        scores rounded to att's dtype
  //   att = softmax_causal(att, scale)  in place              saved for backward
  //   scratch (B,H,T,hs) = att @ v  (B*H batched GEMM)
  //   scratch -> merge heads -> out (B,T,C)
  // qkv must be 3-D (B,T,3C); the others need only the right element counts. qkvr, att and
  // scratch are the caller's so the allocator (and the planner's dry run) sees them.
  void attention_forward(StreamId stream, const Tensor& qkv, std::int64_t heads, const Tensor& qkvr,
                         const Tensor& att, const Tensor& scratch, const Tensor& out);
  // dout (B,T,C), qkvr (3,B,H,T,hs), att (B,H,T,T) -> dqkv (B,T,3C), written.
  //   dy (B,H,T,hs) = split heads(dout)     held in dqkv's memory until the last step
  //   dv = att^T @ dy;  datt = dy @ v^T;  datt = softmax_causal_backward(datt, att) in place
  //   dq = datt @ k;  dk = datt^T @ q       (into dqkvr (3,B,H,T,hs))
  //   dqkvr -> merge heads -> dqkv
  // datt (B,H,T,T) and dqkvr (3,B,H,T,hs) are scratch; dout must be 3-D (B,T,C).
  void attention_backward(StreamId stream, const Tensor& dout, const Tensor& qkvr,
                          const Tensor& att, std::int64_t heads, const Tensor& datt,
                          const Tensor& dqkvr, const Tensor& dqkv);

  // Causal self-attention in O(T) memory: the FlashAttention-2 algorithm (Dao, 2023). Queries
  // go in tiles against tiles of keys and values with a running max and sum per row (online
  // softmax); the probabilities exist one tile at a time, in FP32, and are never stored. What
  // the backward needs beyond q, k, v and the output is one FP32 log-sum-exp per row.
  // Grouped-query ready: H query heads share G key/value heads (G divides H; query head h reads
  // kv head h / (H/G); G == H is ordinary multi-head attention), with no per-head K/V copies.
  // hs is the head size, 1 to kMaxAttentionHeadSize; scale = 1/sqrt(hs).
  //   qkv (B,T,(H+2G)*hs): each token's row holds q (H heads of hs), then k (G heads), then v
  //       (G heads); GPT-2's (B,T,3C) with G = H is exactly this.
  //   -> out (B,T,H*hs), the heads merged (the output projection's input), rounded once;
  //      lse (B,H,T) f32, lse[b,h,i] = log sum_{j<=i} exp(s_ij), s_ij = scale * q_i . k_j
  //   out[b,i,h,:] = sum_{j<=i} exp(s_ij - lse[b,h,i]) v[b,j,g,:]
  // Deterministic on every backend (fixed tile orders, no float atomics); backends agree to
  // FP32 rounding, not bit for bit. 0-sized B or T is a no-op.
  static constexpr std::int64_t kMaxAttentionHeadSize = 256;
  void flash_attention_forward(StreamId stream, const Tensor& qkv, std::int64_t heads,
                               std::int64_t kv_heads, const Tensor& out, const Tensor& lse);
  // dout (B,T,H*hs), and qkv, out, lse as the forward left them -> dqkv (B,T,(H+2G)*hs),
  // written (dq, dk, dv in qkv's layout; dk and dv sum over each group's query heads).
  // delta (B,H,T) f32 is memory the caller provides (so its allocator sees it) and the call
  // writes, then reads: delta[b,h,i] = dout[b,i,h,:] . out[b,i,h,:] in FP32 (FlashAttention-2's
  // precomputed row term); what it held before does not matter. The backward recomputes the
  // probabilities tile by tile from q, k and lse, so nothing of size T x T is stored or allocated.
  void flash_attention_backward(StreamId stream, const Tensor& dout, const Tensor& qkv,
                                const Tensor& out, const Tensor& lse, std::int64_t heads,
                                std::int64_t kv_heads, const Tensor& delta, const Tensor& dqkv);

  // ---- Llama-family ops (RMSNorm, rotary embeddings, SwiGLU) ----
  // inp (N,C), weight (C) -> out (N,C), rstd (N) f32
  //   out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps) (Zhang & Sennrich 2019).
  void rmsnorm_forward(StreamId stream, const Tensor& inp, const Tensor& weight, float eps,
                       const Tensor& out, const Tensor& rstd);
  // dout (N,C), inp (N,C), weight (C), rstd (N) f32 -> dinp (N,C) +=, dweight (C) f32 +=
  //   norm = inp * rstd, g = weight * dout: dinp += rstd * (g - norm * mean(g * norm)),
  //   dweight += sum over rows of norm * dout. dinp accumulates as layernorm_backward's does.
  void rmsnorm_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& rstd, const Tensor& dinp,
                        const Tensor& dweight);
  // Rotary position embedding (Su et al. 2021) in place on the q and k heads of a packed
  // qkv (B,T,(H+2G)*hs) as flash_attention_forward reads it (v is not touched), in the
  // "rotate half" layout of HuggingFace's Llama: for position t and i < hs/2, with
  // a = f32(t) * f.inv_freq[i] (rounded to f32) and (x, y) = (e[i], e[i + hs/2]) of a head e:
  //   e[i] = x cos a - y sin a,  e[i + hs/2] = y cos a + x sin a.
  // inverse: the transposed rotation (angle -a), which is the backward: applied to dqkv it
  // turns the gradient of the rotated q, k into that of the unrotated ones.
  // hs must be even and f.half == hs / 2 (RopeFreqs from core/rope.h). FP32 with one rounding
  // per element; HuggingFace rounds cos, sin and the two products to the activation dtype
  // first (a few roundings apart in bf16).
  void rope(StreamId stream, const Tensor& qkv, std::int64_t heads, std::int64_t kv_heads,
            const RopeFreqs& f, bool inverse);
  // Per-head RMSNorm of the q and k heads of a packed qkv (B,T,(H+2G)*hs) as
  // flash_attention_forward reads it (Qwen3's q_norm and k_norm), in place, v not touched: each
  // q head e (hs values) -> e * rstd * q_weight, each k head -> e * rstd * k_weight, with
  // rstd = 1/sqrt(mean(e^2) + eps) as rmsnorm_forward's. Also writes qk_in (B,T,(H+G)*hs), the
  // q and k columns as they were (what the backward reads), and rstd (B,T,H+G) f32.
  // q_weight, k_weight (hs), one dtype.
  void qk_norm_forward(StreamId stream, const Tensor& qkv, std::int64_t heads,
                       std::int64_t kv_heads, const Tensor& q_weight, const Tensor& k_weight,
                       float eps, const Tensor& qk_in, const Tensor& rstd);
  // dqkv (B,T,(H+2G)*hs) in place: the gradient of the normed q and k heads becomes that of
  // qk_in's (rmsnorm_backward's formula per head, written, not accumulated); the v columns are
  // not touched. dq_weight, dk_weight (hs) f32 +=: sums over every q (k) head of every token of
  // norm * dout, as rmsnorm_backward's dweight.
  void qk_norm_backward(StreamId stream, const Tensor& dqkv, const Tensor& qk_in,
                        const Tensor& rstd, std::int64_t heads, std::int64_t kv_heads,
                        const Tensor& q_weight, const Tensor& k_weight, const Tensor& dq_weight,
                        const Tensor& dk_weight);
  // gate_up (N,2F): each row's gate g (first F) and up u (last F) -> out (N,F) = silu(g) * u,
  // silu(g) = g / (1 + exp(-g)) (Shazeer 2020, Llama's MLP).
  void swiglu_forward(StreamId stream, const Tensor& gate_up, const Tensor& out);
  // dout (N,F), gate_up (N,2F) -> dgate_up (N,2F), written: with s = sigmoid(g),
  //   dg = dout * u * s * (1 + g * (1 - s)),  du = dout * silu(g).
  // In place allowed (dgate_up = gate_up): the gradient takes the saved input's memory.
  void swiglu_backward(StreamId stream, const Tensor& dout, const Tensor& gate_up,
                       const Tensor& dgate_up);
  // ---- end Llama-family ops ----

  // tokens (B,T) int32, wte (V,C), wpe (maxT,C), T <= maxT -> out (B,T,C) = wte[tok] + wpe[t]
  // Token ids must lie in [0, V). That depends on the data, not the call, so the base class
  // cannot check it: the CPU backend throws InvalidArgument before writing anything, the meta
  // backend cannot look, a device backend traps.
  void embedding_forward(StreamId stream, const IndexTensor& tokens, const Tensor& wte,
                         const Tensor& wpe, const Tensor& out);
  // dout (B,T,C), tokens (B,T) -> dwte (V,C) f32 +=, dwpe (maxT,C) f32 +=
  // Repeated tokens add in (b,t) order on every backend: bitwise deterministic.
  void embedding_backward(StreamId stream, const Tensor& dout, const IndexTensor& tokens,
                          const Tensor& dwte, const Tensor& dwpe);
  // The same without a position table (the Llama family's embedding: positions come from the
  // rotary embedding): out = wte[tok]; backward dwte += only.
  void embedding_forward(StreamId stream, const IndexTensor& tokens, const Tensor& wte,
                         const Tensor& out);
  void embedding_backward(StreamId stream, const Tensor& dout, const IndexTensor& tokens,
                          const Tensor& dwte);

  // Softmax cross-entropy over a padded vocabulary: logits (N,Vp), targets (N) int32 in [0, V),
  // V <= Vp (llm.c pads 50257 to 50304 so GEMMs tile; columns >= V are ignored)
  //   -> losses (N) f32 = lse - logits[target], lse (N) f32 = log sum_{j<V} exp(logits[j]).
  // lse is what the backward needs to rebuild the probabilities without a stored (N,Vp) copy.
  // Target ids are data, checked as token ids are (see embedding_forward).
  void crossentropy_forward(StreamId stream, const Tensor& logits, const IndexTensor& targets,
                            std::int64_t vocab, const Tensor& losses, const Tensor& lse);
  // logits (N,Vp), lse (N) f32, targets (N) -> dlogits (N,Vp), written:
  //   dlogits[i,j] = g_i * (exp(logits[i,j] - lse[i]) - [j == target_i]) for j < V, 0 for j >= V
  // with g_i = dloss * dlosses[i], or dloss alone when dlosses is null (a mean loss over N rows
  // with loss scale S passes dloss = S / N). In place allowed (dlogits = logits), which saves
  // GPT-2's largest activation.
  void crossentropy_backward(StreamId stream, const Tensor& logits, const Tensor& lse,
                             const IndexTensor& targets, std::int64_t vocab, float dloss,
                             const Tensor* dlosses, const Tensor& dlogits);

  // One AdamW step (core/adamw.h specifies the arithmetic bit for bit) over n elements:
  //   param (n) f32, exp_avg (n) f32, exp_avg_sq (n) f32 updated in place, grad (n) any dtype;
  //   param_out (n) any dtype, optional (null: none): the updated weights rounded, for a
  //   low-precision working copy. k comes from adamw_constants(options, step, grad_scale), so
  //   bias corrections and the gradient's unscaling (1 / (loss scale * accumulation)) are in it.
  void adamw(StreamId stream, const AdamWConstants& k, const Tensor& param, const Tensor& grad,
             const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* param_out = nullptr);

  // ---- conv2d (conv helper's section; Conv2dDesc above, checks in backend_conv.cpp) -------
  // inp, weight and out (and in backward dout and dinp) share one dtype, f32, f16 or bf16
  // (cuDNN's convolutions take one data type); products accumulate in FP32. Tensors need only
  // the element counts of their layouts, so (B, H*W, C) activations pass as they are. Outputs
  // overlap nothing. Deterministic on every backend (no float atomics in the reductions).
  // inp (N,H,W,C), weight (K,R,S,C) -> out (N,P,Q,K), written.
  void conv2d_forward(StreamId stream, const Conv2dDesc& d, const Tensor& inp, const Tensor& weight,
                      const Tensor& out);
  // dout (N,P,Q,K), inp (N,H,W,C), weight (K,R,S,C)
  //   -> dinp (N,H,W,C) written, when not null (the first layer of a network needs none);
  //   -> dweight (K,R,S,C) f32 += (parameter gradients accumulate in FP32, as elsewhere).
  void conv2d_backward(StreamId stream, const Conv2dDesc& d, const Tensor& dout, const Tensor& inp,
                       const Tensor& weight, const Tensor* dinp, const Tensor& dweight);
  // ---- end conv2d ----

 protected:
  Backend();

  // Implementations get validated arguments only (see the contract above).
  virtual StreamId do_create_stream() = 0;
  virtual void do_destroy_stream(StreamId stream) = 0;
  virtual bool do_has_stream(StreamId stream) const = 0;
  virtual void do_synchronize(StreamId stream) = 0;
  virtual EventHandle do_record_event(StreamId stream) = 0;
  virtual bool do_has_event(EventHandle event) const = 0;
  virtual bool do_query_event(EventHandle event) = 0;
  virtual void do_synchronize_event(EventHandle event) = 0;
  virtual void do_wait_event(StreamId stream, EventHandle event) = 0;
  virtual void do_release_event(EventHandle event) = 0;

  virtual void do_gemm(StreamId stream, const GemmDesc& d, const Tensor& a, const Tensor& b,
                       const Tensor& c) = 0;
  virtual void do_fill(StreamId stream, const Tensor& x, float value) = 0;
  virtual void do_copy(StreamId stream, const Tensor& src, const Tensor& dst) = 0;
  virtual void do_cast(StreamId stream, const Tensor& src, const Tensor& dst) = 0;
  virtual void do_axpy(StreamId stream, float a, const Tensor& x, const Tensor& y) = 0;
  virtual void do_scale(StreamId stream, float a, const Tensor& x) = 0;
  virtual void do_sumsq(StreamId stream, const Tensor& x, const Tensor& out) = 0;

  // Neural-network primitives; rows/cols are resolved from the validated shapes.
  virtual void do_layernorm_forward(StreamId stream, const Tensor& inp, const Tensor& weight,
                                    const Tensor& bias, float eps, const Tensor& out,
                                    const Tensor& mean, const Tensor& rstd) = 0;
  virtual void do_layernorm_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                                     const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& dinp, const Tensor& dweight,
                                     const Tensor& dbias) = 0;
  virtual void do_gelu_forward(StreamId stream, const Tensor& inp, const Tensor& out) = 0;
  virtual void do_gelu_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                                const Tensor& dinp) = 0;
  virtual void do_add(StreamId stream, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void do_add_bias(StreamId stream, const Tensor& bias, const Tensor& out) = 0;
  virtual void do_bias_backward(StreamId stream, const Tensor& dout, const Tensor& dbias) = 0;
  // t: the matrices' size T (R = numel / (T*T)). attention_forward/backward call these in
  // place (att == preatt, dpreatt == datt), so every implementation must support that.
  virtual void do_softmax_causal_forward(StreamId stream, const Tensor& preatt, float scale,
                                         const Tensor& att, std::int64_t t) = 0;
  virtual void do_softmax_causal_backward(StreamId stream, const Tensor& datt, const Tensor& att,
                                          float scale, const Tensor& dpreatt, std::int64_t t) = 0;
  // The head permutes of attention; P parts (3 for q,k,v; 1 for one (B,T,C) tensor):
  //   split: src (B,T,P,H,hs) -> dst (P,B,H,T,hs);  merge: src (P,B,H,T,hs) -> dst (B,T,P,H,hs)
  // src and dst do not overlap; dtypes may differ (values are rounded to dst's dtype).
  virtual void do_split_heads(StreamId stream, const Tensor& src, const Tensor& dst,
                              const HeadDims& d) = 0;
  virtual void do_merge_heads(StreamId stream, const Tensor& src, const Tensor& dst,
                              const HeadDims& d) = 0;
  virtual void do_flash_attention_forward(StreamId stream, const Tensor& qkv,
                                          const AttentionDims& d, const Tensor& out,
                                          const Tensor& lse) = 0;
  virtual void do_flash_attention_backward(StreamId stream, const Tensor& dout, const Tensor& qkv,
                                           const Tensor& out, const Tensor& lse,
                                           const AttentionDims& d, const Tensor& delta,
                                           const Tensor& dqkv) = 0;
  virtual void do_rmsnorm_forward(StreamId stream, const Tensor& inp, const Tensor& weight,
                                  float eps, const Tensor& out, const Tensor& rstd) = 0;
  virtual void do_rmsnorm_backward(StreamId stream, const Tensor& dout, const Tensor& inp,
                                   const Tensor& weight, const Tensor& rstd, const Tensor& dinp,
                                   const Tensor& dweight) = 0;
  // d: the qkv's sizes (as flash attention's); positions are 0 .. T-1.
  virtual void do_rope(StreamId stream, const Tensor& qkv, const AttentionDims& d,
                       const RopeFreqs& f, bool inverse) = 0;
  // d: the qkv's sizes (as flash attention's).
  virtual void do_qk_norm_forward(StreamId stream, const Tensor& qkv, const AttentionDims& d,
                                  const Tensor& q_weight, const Tensor& k_weight, float eps,
                                  const Tensor& qk_in, const Tensor& rstd) = 0;
  virtual void do_qk_norm_backward(StreamId stream, const Tensor& dqkv, const Tensor& qk_in,
                                   const Tensor& rstd, const AttentionDims& d,
                                   const Tensor& q_weight, const Tensor& k_weight,
                                   const Tensor& dq_weight, const Tensor& dk_weight) = 0;
  virtual void do_swiglu_forward(StreamId stream, const Tensor& gate_up, const Tensor& out) = 0;
  virtual void do_swiglu_backward(StreamId stream, const Tensor& dout, const Tensor& gate_up,
                                  const Tensor& dgate_up) = 0;
  // wpe / dwpe null: no position table.
  virtual void do_embedding_forward(StreamId stream, const IndexTensor& tokens, const Tensor& wte,
                                    const Tensor* wpe, const Tensor& out) = 0;
  virtual void do_embedding_backward(StreamId stream, const Tensor& dout, const IndexTensor& tokens,
                                     const Tensor& dwte, const Tensor* dwpe) = 0;
  virtual void do_crossentropy_forward(StreamId stream, const Tensor& logits,
                                       const IndexTensor& targets, std::int64_t vocab,
                                       const Tensor& losses, const Tensor& lse) = 0;
  virtual void do_crossentropy_backward(StreamId stream, const Tensor& logits, const Tensor& lse,
                                        const IndexTensor& targets, std::int64_t vocab, float dloss,
                                        const Tensor* dlosses, const Tensor& dlogits) = 0;
  virtual void do_adamw(StreamId stream, const AdamWConstants& k, const Tensor& param,
                        const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                        const Tensor* param_out) = 0;

  // ---- conv2d (conv helper's section): validated descriptor and operands only ----
  virtual void do_conv2d_forward(StreamId stream, const Conv2dDesc& d, const Tensor& inp,
                                 const Tensor& weight, const Tensor& out) = 0;
  virtual void do_conv2d_backward(StreamId stream, const Conv2dDesc& d, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight, const Tensor* dinp,
                                  const Tensor& dweight) = 0;
  // ---- end conv2d ----

  // Backends with library limits (CBLAS and cuBLAS take 32-bit m, n, k; cuBLAS's strided
  // batched GEMM a 32-bit batch count) report them here; the base class then rejects a GEMM
  // whose m, n, k or batch is larger with InvalidArgument. Default: no limit.
  virtual std::int64_t max_gemm_dim() const;

 private:
  class Sync final : public StreamSync {
   public:
    explicit Sync(Backend& b) : b_(b) {}
    EventHandle record(StreamId stream) override { return b_.record_event(stream); }
    bool query(EventHandle event) override { return b_.query_event(event); }
    void synchronize(EventHandle event) override { b_.synchronize_event(event); }
    void release(EventHandle event) override { b_.release_event(event); }

   private:
    Backend& b_;
  };

  void check_stream(StreamId stream, const char* op) const;
  void embedding_forward_checked(StreamId stream, const IndexTensor& tokens, const Tensor& wte,
                                 const Tensor* wpe, const Tensor& out);
  void embedding_backward_checked(StreamId stream, const Tensor& dout, const IndexTensor& tokens,
                                  const Tensor& dwte, const Tensor* dwpe);
  void check_event(EventHandle event, const char* op) const;
  std::string where(const char* op) const;

  Sync sync_;
};

}  // namespace memfit
