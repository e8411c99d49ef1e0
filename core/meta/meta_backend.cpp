// MetaBackend: counts what it is asked to do; never reads or writes a tensor's memory.
#include "core/meta/meta_backend.h"

#include <climits>
#include <cstdint>

#include "core/cpu/cpu_backend.h"  // cpu::gemm_scratch_floats: the scratch a dry run mirrors
#include "core/meta/op_rates.h"
#include "core/meta/saturating.h"
#include "memory/caching_allocator.h"
#include "memory/size.h"

namespace memfit {

using meta::bytes;
using meta::sat_add;
using meta::sat_mul;

const char* meta_op_name(MetaOp op) {
  switch (op) {
    case MetaOp::kGemm:
      return "gemm";
    case MetaOp::kFill:
      return "fill";
    case MetaOp::kCopy:
      return "copy";
    case MetaOp::kCast:
      return "cast";
    case MetaOp::kAxpy:
      return "axpy";
    case MetaOp::kScale:
      return "scale";
    case MetaOp::kSumSq:
      return "sumsq";
    case MetaOp::kLayerNormForward:
      return "layernorm_forward";
    case MetaOp::kLayerNormBackward:
      return "layernorm_backward";
    case MetaOp::kGeluForward:
      return "gelu_forward";
    case MetaOp::kGeluBackward:
      return "gelu_backward";
    case MetaOp::kAdd:
      return "add";
    case MetaOp::kAddBias:
      return "add_bias";
    case MetaOp::kBiasBackward:
      return "bias_backward";
    case MetaOp::kSoftmaxCausalForward:
      return "softmax_causal_forward";
    case MetaOp::kSoftmaxCausalBackward:
      return "softmax_causal_backward";
    case MetaOp::kSplitHeads:
      return "split_heads";
    case MetaOp::kMergeHeads:
      return "merge_heads";
    case MetaOp::kFlashAttentionForward:
      return "flash_attention_forward";
    case MetaOp::kFlashAttentionBackward:
      return "flash_attention_backward";
    case MetaOp::kRmsNormForward:
      return "rmsnorm_forward";
    case MetaOp::kRmsNormBackward:
      return "rmsnorm_backward";
    case MetaOp::kRope:
      return "rope";
    case MetaOp::kQkNormForward:
      return "qk_norm_forward";
    case MetaOp::kQkNormBackward:
      return "qk_norm_backward";
    case MetaOp::kSwiGluForward:
      return "swiglu_forward";
    case MetaOp::kSwiGluBackward:
      return "swiglu_backward";
    case MetaOp::kEmbeddingForward:
      return "embedding_forward";
    case MetaOp::kEmbeddingBackward:
      return "embedding_backward";
    case MetaOp::kCrossEntropyForward:
      return "crossentropy_forward";
    case MetaOp::kCrossEntropyBackward:
      return "crossentropy_backward";
    case MetaOp::kAdamW:
      return "adamw";
    case MetaOp::kConv2dForward:
      return "conv2d_forward";
    case MetaOp::kConv2dBackward:
      return "conv2d_backward";
    case MetaOp::kCount:
      break;
  }
  return "?";
}

std::int64_t MetaStats::total_calls() const {
  std::int64_t t = 0;
  for (std::int64_t c : op_calls) t += c;
  return t;
}

std::int64_t MetaStats::flops() const { return sat_add(gemm_flops, other_flops); }

MetaStats MetaBackend::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void MetaBackend::reset_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = MetaStats{};
}

std::int64_t MetaBackend::max_gemm_dim() const { return INT_MAX; }

void MetaBackend::set_rates(const OpRates* rates) {
  std::lock_guard<std::mutex> lock(mu_);
  rates_ = rates;
}

void MetaBackend::count(MetaOp op, DType dt, std::int64_t read, std::int64_t written,
                        std::int64_t flops, std::int64_t host_bytes) {
  const bool gemm = op == MetaOp::kGemm;
  record(op, dt, read, written, gemm ? flops : 0, gemm ? 0 : flops, host_bytes);
}

void MetaBackend::count_matmul(MetaOp op, DType dt, std::int64_t read, std::int64_t written,
                               std::int64_t matmul_flops, std::int64_t flops) {
  record(op, dt, read, written, matmul_flops, flops, 0);
}

void MetaBackend::record(MetaOp op, DType dt, std::int64_t read, std::int64_t written,
                         std::int64_t matmul_flops, std::int64_t flops, std::int64_t host_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.op_calls[static_cast<std::size_t>(op)];
  stats_.bytes_read = sat_add(stats_.bytes_read, read);
  stats_.bytes_written = sat_add(stats_.bytes_written, written);
  stats_.gemm_flops = sat_add(stats_.gemm_flops, matmul_flops);
  stats_.other_flops = sat_add(stats_.other_flops, flops);
  stats_.host_copy_bytes = sat_add(stats_.host_copy_bytes, host_bytes);
  if (rates_ != nullptr) {
    const double s = rates_->seconds(op, dt, static_cast<double>(matmul_flops),
                                     static_cast<double>(flops),
                                     static_cast<double>(read) + static_cast<double>(written));
    stats_.seconds += s;
    stats_.op_seconds[static_cast<std::size_t>(op)] += s;
  }
}

void MetaBackend::do_gemm(StreamId stream, const GemmDesc& d, const Tensor& a, const Tensor& b,
                          const Tensor& c) {
  if (workspace_ != nullptr && gemm_workspace_bytes_ > 0) {
    // A GPU backend's fixed per-call workspace (CudaBackend: cuBLASLt's), whatever the shapes;
    // a GEMM with no output (m, n or batch 0) launches nothing and takes none.
    if (d.m > 0 && d.n > 0 && d.batch > 0) {
      Block ws = workspace_->allocate(gemm_workspace_bytes_, Category::kWorkspace, stream,
                                      "cuda.gemm.workspace");
    }
  } else if (workspace_ != nullptr) {
    const std::size_t floats = cpu::gemm_scratch_floats(d, a, b, c);
    if (floats != 0) {
      // Taken and given back as the CPU backend's run_gemm does around its sgemm call.
      Block ws = workspace_->allocate(checked_mul(floats, sizeof(float), "CPU GEMM scratch"),
                                      Category::kWorkspace, stream, "cpu.gemm.scratch");
    }
  }
  // Each distinct matrix is read once (a broadcast operand, stride 0, once for the batch).
  const bool work = d.m > 0 && d.n > 0 && d.batch > 0;
  const std::int64_t mats_a = d.stride_a == 0 ? 1 : d.batch;
  const std::int64_t mats_b = d.stride_b == 0 ? 1 : d.batch;
  std::int64_t read = 0;
  std::int64_t written = 0;
  if (work) {
    read = sat_add(sat_mul(sat_mul(mats_a, d.m * d.k), dtype_size(a.dtype())),
                   sat_mul(sat_mul(mats_b, d.k * d.n), dtype_size(b.dtype())));
    const std::int64_t c_bytes = sat_mul(sat_mul(d.batch, d.m * d.n), dtype_size(c.dtype()));
    if (d.beta != 0.0f) read = sat_add(read, c_bytes);
    written = c_bytes;
  }
  count(MetaOp::kGemm, a.dtype(), read, written, d.flops());
}

void MetaBackend::do_fill(StreamId, const Tensor& x, float) { count(MetaOp::kFill, x.dtype(), 0, bytes(x)); }

void MetaBackend::do_copy(StreamId, const Tensor& src, const Tensor& dst) {
  const bool transfer = src.device() != dst.device();
  count(MetaOp::kCopy, src.dtype(), bytes(src), bytes(dst), 0, transfer ? bytes(src) : 0);
}

void MetaBackend::do_cast(StreamId, const Tensor& src, const Tensor& dst) {
  count(MetaOp::kCast, src.dtype(), bytes(src), bytes(dst));
}

void MetaBackend::do_axpy(StreamId, float, const Tensor& x, const Tensor& y) {
  count(MetaOp::kAxpy, y.dtype(), sat_add(bytes(x), bytes(y)), bytes(y));
}

void MetaBackend::do_scale(StreamId, float, const Tensor& x) {
  count(MetaOp::kScale, x.dtype(), bytes(x), bytes(x));
}

void MetaBackend::do_sumsq(StreamId, const Tensor& x, const Tensor& out) {
  count(MetaOp::kSumSq, x.dtype(), sat_add(bytes(x), bytes(out)), bytes(out));
}

}  // namespace memfit
