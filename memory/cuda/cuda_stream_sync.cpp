#include "memory/cuda/cuda_stream_sync.h"

#include <string>

#include "memory/check.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_provider.h"
#include "memory/error.h"

namespace memfit {
namespace {

cudaEvent_t to_event(EventHandle h) { return reinterpret_cast<cudaEvent_t>(h); }

}  // namespace

CudaStreamSync::CudaStreamSync(int device) : device_(device) {
  std::string why;
  const int count = CudaProvider::cuda_device_count(&why);
  if (device < 0 || device >= count) {
    throw InvalidArgument(
        "CudaStreamSync: device " + std::to_string(device) +
        (count == 0 ? " requested but there is no usable CUDA device (" + why + ")"
                    : " does not exist; valid devices are 0.." + std::to_string(count - 1)));
  }
}

CudaStreamSync::~CudaStreamSync() {
  // Errors are ignored: at process exit the runtime may already be unloading
  // (cudaErrorCudartUnloading) and the driver reclaims events with the context anyway.
  for (cudaEvent_t e : pool_) (void)cudaEventDestroy(e);
  (void)cudaGetLastError();
}

EventHandle CudaStreamSync::record(StreamId stream) {
  // Stream 0 means "the legacy default stream of the current device", so `device_` must be
  // current for the record as well as for creating the event. The guard comes first: if it
  // throws, no pooled event has been taken out (and lost).
  cuda::DeviceGuard guard(device_);
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pool_.empty()) {
      event = pool_.back();
      pool_.pop_back();
    }
  }
  if (event == nullptr) {
    MEMFIT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    std::lock_guard<std::mutex> lock(mu_);
    ++created_;
  }
  const cudaError_t err = cudaEventRecord(event, to_cuda_stream(stream));
  if (err != cudaSuccess) {
    release(reinterpret_cast<EventHandle>(event));
    const std::string call = "cudaEventRecord(event, stream " + std::to_string(stream) + ")";
    cuda::throw_cuda_error(err, call.c_str(), __FILE__, __LINE__);
  }
  return reinterpret_cast<EventHandle>(event);
}

bool CudaStreamSync::query(EventHandle event) {
  MEMFIT_CHECK(event != 0) << "query of a null event handle";
  const cudaError_t err = cudaEventQuery(to_event(event));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    // "Not actually an error" (cudaError docs), but the runtime may still leave it as the
    // thread's last error; PyTorch's allocator clears it at the same spot.
    (void)cudaGetLastError();
    return false;
  }
  cuda::throw_cuda_error(err, "cudaEventQuery(event)", __FILE__, __LINE__);
}

void CudaStreamSync::synchronize(EventHandle event) {
  MEMFIT_CHECK(event != 0) << "synchronize on a null event handle";
  MEMFIT_CUDA_CHECK(cudaEventSynchronize(to_event(event)));
}

void CudaStreamSync::release(EventHandle event) {
  MEMFIT_CHECK(event != 0) << "release of a null event handle";
  std::lock_guard<std::mutex> lock(mu_);
  pool_.push_back(to_event(event));
}

std::int64_t CudaStreamSync::created() const {
  std::lock_guard<std::mutex> lock(mu_);
  return created_;
}

std::size_t CudaStreamSync::pooled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_.size();
}

}  // namespace memfit
