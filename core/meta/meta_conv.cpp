// MetaBackend's conv2d: operand bytes and GEMM-class flops (meta_backend.h), never memory.
#include <cstdint>
#include <mutex>

#include "core/meta/meta_backend.h"
#include "core/meta/saturating.h"

namespace memfit {

using meta::bytes;
using meta::sat_add;

void MetaBackend::count_matmul(MetaOp op, std::int64_t read, std::int64_t written,
                               std::int64_t matmul_flops, std::int64_t flops) {
  count(op, read, written, flops);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.gemm_flops = sat_add(stats_.gemm_flops, matmul_flops);
}

void MetaBackend::do_conv2d_forward(StreamId, const Conv2dDesc& d, const Tensor& inp,
                                    const Tensor& weight, const Tensor& out) {
  count_matmul(MetaOp::kConv2dForward, bytes(inp, weight), bytes(out), d.flops());
}

void MetaBackend::do_conv2d_backward(StreamId, const Conv2dDesc& d, const Tensor& dout,
                                     const Tensor& inp, const Tensor& weight, const Tensor* dinp,
                                     const Tensor& dweight) {
  // dweight accumulates: read and written.
  const std::int64_t read = bytes(dout, inp, weight, dweight);
  std::int64_t written = bytes(dweight);
  std::int64_t flops = d.flops();
  if (dinp != nullptr) {
    written = sat_add(written, bytes(*dinp));
    flops = sat_add(flops, d.flops());
  }
  count_matmul(MetaOp::kConv2dBackward, read, written, flops);
}

}  // namespace memfit
