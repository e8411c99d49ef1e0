// MetaBackend: the dry-run backend. It accepts and rejects exactly the calls every backend
// does (the checks live in Backend), then does no arithmetic and touches no memory: its
// tensors (Device::kMeta) hold NullProvider addresses that must never be dereferenced. What it
// records instead is the work it was asked for, so a planner can turn a dry-run step into an
// estimated time (flops over a device's rate, bytes over its bandwidth).
//
//   NullProvider null;
//   MetaBackend meta;
//   CachingAllocator alloc(null, {}, &meta.stream_sync());
//   ... run the real executor with `meta` ...
//   MetaStats s = meta.stats();   // s.gemm_flops, s.bytes_moved(), s.calls(MetaOp::kGemm)
//
// Streams and events behave as on the CPU backend (inline: events complete when recorded).
// Thread-safe: stats are updated under a mutex.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include "core/backend.h"
#include "core/cpu/inline_streams.h"

namespace memfit {

enum class MetaOp : std::uint8_t { kGemm, kFill, kCopy, kCast, kAxpy, kScale, kSumSq, kCount };
const char* meta_op_name(MetaOp op);  // "gemm", "fill", ...

struct MetaStats {
  std::array<std::int64_t, static_cast<std::size_t>(MetaOp::kCount)> op_calls{};
  std::int64_t gemm_flops = 0;       // sum of GemmDesc::flops() (2*m*n*k*batch); saturates
  std::int64_t bytes_read = 0;       // operand bytes an op must read (C only when beta != 0)
  std::int64_t bytes_written = 0;    // operand bytes an op writes
  std::int64_t host_copy_bytes = 0;  // copy() bytes with one side on the host (transfers)

  std::int64_t calls(MetaOp op) const { return op_calls[static_cast<std::size_t>(op)]; }
  std::int64_t total_calls() const;
  std::int64_t bytes_moved() const { return bytes_read + bytes_written; }
};

class MetaBackend final : public cpu::InlineBackend {
 public:
  MetaBackend() = default;
  Device device() const override { return Device::kMeta; }
  const char* name() const override { return "meta"; }

  MetaStats stats() const;
  void reset_stats();

 protected:
  void do_gemm(StreamId stream, const GemmDesc& d, const Tensor& a, const Tensor& b,
               const Tensor& c) override;
  void do_fill(StreamId stream, const Tensor& x, float value) override;
  void do_copy(StreamId stream, const Tensor& src, const Tensor& dst) override;
  void do_cast(StreamId stream, const Tensor& src, const Tensor& dst) override;
  void do_axpy(StreamId stream, float a, const Tensor& x, const Tensor& y) override;
  void do_scale(StreamId stream, float a, const Tensor& x) override;
  void do_sumsq(StreamId stream, const Tensor& x, const Tensor& out) override;

  // Same limit as cuBLAS and CBLAS, so a plan that dry-runs here also runs there.
  std::int64_t max_gemm_dim() const override;

 private:
  void count(MetaOp op, std::int64_t read, std::int64_t written, std::int64_t flops = 0,
             std::int64_t host_bytes = 0);

  mutable std::mutex mu_;
  MetaStats stats_;
};

}  // namespace memfit
