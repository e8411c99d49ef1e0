// CudaBackend's elementwise ops and sumsq: validated by Backend, queued as one kernel each
// (two for sumsq) on the op's stream; see elementwise_kernels.h for the arithmetic.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/elementwise_kernels.h"
#include "memory/cuda/cuda_check.h"

namespace memfit {

void CudaBackend::do_fill(StreamId stream, const Tensor& x, float value) {
  cuda::DeviceGuard guard(impl_->device);
  cuda::launch_fill(impl_->stream(stream), x.raw(), x.dtype(), value, x.numel());
}

void CudaBackend::do_cast(StreamId stream, const Tensor& src, const Tensor& dst) {
  cuda::DeviceGuard guard(impl_->device);
  const cudaStream_t s = impl_->stream(stream);
  if (src.dtype() == dst.dtype()) {
    // Same dtype: the values are the bits (NaN payloads included), as convert() keeps them.
    if (src.nbytes() > 0) {
      MEMFIT_CUDA_CHECK(
          cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, s));
    }
    return;
  }
  cuda::launch_cast(s, src.raw(), src.dtype(), dst.raw(), dst.dtype(), src.numel());
}

void CudaBackend::do_axpy(StreamId stream, float a, const Tensor& x, const Tensor& y) {
  cuda::DeviceGuard guard(impl_->device);
  cuda::launch_axpy(impl_->stream(stream), a, x.raw(), x.dtype(), y.raw(), y.dtype(), x.numel());
}

void CudaBackend::do_scale(StreamId stream, float a, const Tensor& x) {
  cuda::DeviceGuard guard(impl_->device);
  cuda::launch_scale(impl_->stream(stream), a, x.raw(), x.dtype(), x.numel());
}

void CudaBackend::do_sumsq(StreamId stream, const Tensor& x, const Tensor& out) {
  const std::int64_t n = x.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(impl_->device);
  const cudaStream_t s = impl_->stream(stream);
  // One (double, int64) pair per partial block; stream-ordered scratch, freed once queued.
  const std::size_t bytes = static_cast<std::size_t>(cuda::sumsq_partial_count(n)) * 16;
  CudaScratch partials(*this, stream, bytes, "cuda.sumsq.partials");
  cuda::launch_sumsq(s, x.raw(), x.dtype(), n, partials.data(), out.data<float>());
}

}  // namespace memfit
