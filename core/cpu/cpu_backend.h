// CpuBackend: the numerical reference backend. Runs every op inline on the calling thread, on
// host memory (tensors with Device::kCpu), so its streams are always idle and its events are
// complete when recorded; stream ids and event handles are still checked as on CUDA.
//
//   CpuBackend be;
//   HostProvider host;
//   CachingAllocator alloc(host, {}, &be.stream_sync());
//   be.gemm(kDefaultStream, d, a, b, c);   // done when it returns
//
// GEMM goes through OpenBLAS's cblas_sgemm with FP32 accumulation. f16/bf16 operands are
// widened (exactly) to f32 in scratch, and a non-f32 C is computed in f32 scratch (holding
// the widened old C when beta != 0) and rounded once to its dtype. The scratch is plain host
// heap (std::vector), outside the caching allocator and its budget: at most one A, one B and
// one C matrix of f32 per call, freed on return. Elementwise ops work in 4096-element f32
// chunks, with OpenMP across chunks from 64K elements; sumsq() sums per-block partials in a
// fixed order, so its result does not depend on the thread count.
// Thread safety: as Backend (backend.h).
#pragma once

#include <cstdint>

#include "core/backend.h"
#include "core/cpu/inline_streams.h"

namespace memfit {

class CpuBackend final : public Backend {
 public:
  CpuBackend() = default;
  Device device() const override { return Device::kCpu; }
  const char* name() const override { return "cpu"; }

  std::size_t live_events() const { return streams_.live_events(); }  // for leak tests

 protected:
  StreamId do_create_stream() override { return streams_.create(); }
  void do_destroy_stream(StreamId stream) override { streams_.destroy(stream); }
  bool do_has_stream(StreamId stream) const override { return streams_.has(stream); }
  void do_synchronize(StreamId) override {}
  EventHandle do_record_event(StreamId stream) override { return streams_.record(stream); }
  bool do_has_event(EventHandle event) const override { return streams_.has_event(event); }
  bool do_query_event(EventHandle) override { return true; }
  void do_synchronize_event(EventHandle) override {}
  void do_wait_event(StreamId, EventHandle) override {}
  void do_release_event(EventHandle event) override { streams_.release(event); }

  void do_gemm(StreamId stream, const GemmDesc& d, const Tensor& a, const Tensor& b,
               const Tensor& c) override;
  void do_fill(StreamId stream, const Tensor& x, float value) override;
  void do_copy(StreamId stream, const Tensor& src, const Tensor& dst) override;
  void do_cast(StreamId stream, const Tensor& src, const Tensor& dst) override;
  void do_axpy(StreamId stream, float a, const Tensor& x, const Tensor& y) override;
  void do_scale(StreamId stream, float a, const Tensor& x) override;
  void do_sumsq(StreamId stream, const Tensor& x, const Tensor& out) override;

  // cblas_sgemm takes 32-bit sizes.
  std::int64_t max_gemm_dim() const override;

 private:
  cpu::InlineStreams streams_;
};

namespace cpu {

// The batched GEMM of backend.h on host memory; `d` has its strides resolved (no kPacked).
void gemm(const GemmDesc& d, const Tensor& a, const Tensor& b, const Tensor& c);

// One plain row-major cblas_sgemm call, C = alpha * op(A) @ op(B) + beta * C with dense
// leading dimensions. Exposed so benchmarks can time OpenBLAS itself as their anchor in the
// same binary (libopenblas is a private dependency of libmemfit).
void blas_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                const float* b, float beta, float* c);

}  // namespace cpu
}  // namespace memfit
