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
//   create_stream(). The CPU and meta backends run every op inline on the calling thread, so
//   their streams are always idle and their events complete when recorded.
// - Tensors are views (core/tensor.h) of contiguous row-major memory on device() (copy() also
//   takes host tensors, Device::kCpu). They must stay alive until the op has run on its stream.
// - Every op validates before queueing anything: stream, devices, dtypes, element counts,
//   overlap of inputs and outputs, and 32-bit limits where a library needs them. A violation
//   throws InvalidArgument naming the backend, the op, the operand and what would be valid;
//   nothing has been written then. The checks live in this class (backend.cpp) so every
//   backend accepts and rejects exactly the same calls; implementations see valid calls only.
// - Arithmetic is FP32 whatever the storage dtype: inputs widen exactly to f32, results round
//   to the output dtype (nearest even, as memfit::convert). Reductions accumulate wider.
// - Thread safety: stream and event calls may come from any thread (the caching allocator
//   calls the StreamSync from its own lock). Ops may be issued from several threads as long as
//   no two threads use one stream at the same time (as CUDA streams).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/tensor.h"
#include "memory/stream.h"

namespace memfit {

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
  void check_event(EventHandle event, const char* op) const;
  std::string where(const char* op) const;

  Sync sync_;
};

}  // namespace memfit
