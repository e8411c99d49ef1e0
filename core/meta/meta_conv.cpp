// MetaBackend's conv2d: operand bytes and GEMM-class flops (meta_backend.h), never memory.
#include <cstdint>

#include "core/meta/meta_backend.h"
#include "core/meta/saturating.h"

namespace memfit {

using meta::bytes;
using meta::sat_add;

void MetaBackend::do_conv2d_forward(StreamId, const Conv2dDesc& d, const Tensor& inp,
                                    const Tensor& weight, const Tensor& out) {
  count_matmul(MetaOp::kConv2dForward, inp.dtype(), bytes(inp, weight), bytes(out), d.flops());
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
  count_matmul(MetaOp::kConv2dBackward, inp.dtype(), read, written, flops);
}

}  // namespace memfit
