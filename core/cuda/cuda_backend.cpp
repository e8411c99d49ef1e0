// CudaBackend: construction and the measured context, streams, events, copies, scratch.
// GEMM is in cuda_gemm.cpp, elementwise ops in cuda_elementwise.cpp, the neural-network ops in
// cuda_nn.cpp.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <string>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/cuda_lib_check.h"
#include "memory/caching_allocator.h"
#include "memory/check.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_provider.h"
#include "memory/error.h"

namespace memfit {

// ---- Impl ----------------------------------------------------------------------------------

CudaBackend::Impl::~Impl() {
  // Errors are ignored here: at process exit the runtime may already be unloading
  // (cudaErrorCudartUnloading), and a broken context was reported by the call that broke it.
  int previous = device;
  (void)cudaGetDevice(&previous);
  if (cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  for (auto& [id, s] : streams) (void)cudaStreamSynchronize(s);
  if (gemm_cache != nullptr) cuda::destroy_gemm_plan_cache(gemm_cache);
#if MEMFIT_HAVE_CUDNN
  for (auto& [s, h] : cudnn_handles) (void)cudnnDestroy(h);
#endif
  if (lt != nullptr) (void)cublasLtDestroy(lt);
  for (auto& [h, e] : events) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : event_pool) (void)cudaEventDestroy(e);
  for (auto& [id, s] : streams) (void)cudaStreamDestroy(s);
  (void)cudaSetDevice(previous);
  (void)cudaGetLastError();
}

cudaStream_t CudaBackend::Impl::stream(StreamId id) const {
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find(id);
  MEMFIT_CHECK(it != streams.end()) << "CudaBackend: stream " << id
                                    << " reached an op without being validated";
  return it->second;
}

#if MEMFIT_HAVE_CUDNN
cudnnHandle_t CudaBackend::Impl::cudnn(cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cudnn_handles.find(s);
    if (it != cudnn_handles.end()) return it->second;
  }
  // Created outside the lock (cudnnCreate takes milliseconds); one thread per stream at a time
  // (Backend's rule), so no other thread is creating a handle for `s` meanwhile.
  cuda::DeviceGuard guard(device);
  cudnnHandle_t h = nullptr;
  MEMFIT_CUDNN_CHECK(cudnnCreate(&h));
  const cudnnStatus_t st = cudnnSetStream(h, s);
  if (st != CUDNN_STATUS_SUCCESS) {
    (void)cudnnDestroy(h);
    cuda::throw_cudnn_error(st, "cudnnSetStream(handle, stream)", __FILE__, __LINE__);
  }
  std::lock_guard<std::mutex> lock(mu);
  cudnn_handles.emplace(s, h);
  return h;
}
#endif

// ---- CudaScratch ---------------------------------------------------------------------------

CudaScratch::CudaScratch(CudaBackend& be, StreamId stream, std::size_t bytes,
                         std::string_view tag)
    : bytes_(bytes), device_(be.options().device) {
  if (bytes == 0) return;
  if (CachingAllocator* alloc = be.workspace_allocator()) {
    block_ = alloc->allocate(bytes, Category::kWorkspace, stream, tag);
    ptr_ = block_.data();
    return;
  }
  cs_ = be.impl().stream(stream);
  cuda::DeviceGuard guard(device_);
  MEMFIT_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, cs_));
}

CudaScratch::~CudaScratch() {
  if (ptr_ == nullptr || block_) return;  // the Block frees itself (stream-ordered reuse)
  int previous = device_;
  (void)cudaGetDevice(&previous);
  if (cudaSetDevice(device_) == cudaSuccess) (void)cudaFreeAsync(ptr_, cs_);
  (void)cudaSetDevice(previous);
  (void)cudaGetLastError();
}

// ---- construction --------------------------------------------------------------------------

namespace {

// total - free on the current device.
std::size_t used_bytes(std::size_t* total, std::size_t* free_out) {
  std::size_t free = 0;
  std::size_t tot = 0;
  MEMFIT_CUDA_CHECK(cudaMemGetInfo(&free, &tot));
  if (total) *total = tot;
  if (free_out) *free_out = free;
  return tot - free;
}

}  // namespace

CudaBackend::CudaBackend(CudaBackendOptions options) : options_(options) {
  std::string why;
  const int count = CudaProvider::cuda_device_count(&why);
  if (count == 0) {
    throw InvalidArgument("CudaBackend: device " + std::to_string(options.device) +
                          " requested but there is no usable CUDA device (" + why + ")");
  }
  if (options.device < 0 || options.device >= count) {
    throw InvalidArgument("CudaBackend: device " + std::to_string(options.device) +
                          " does not exist; valid devices are 0.." + std::to_string(count - 1));
  }
  const int dev = options.device;
  impl_ = std::make_unique<Impl>(dev);
  cuda::DeviceGuard guard(dev);
  MEMFIT_CUDA_CHECK(cudaFree(nullptr));  // creates the primary context if it does not exist yet
  MEMFIT_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, dev));

  std::size_t free_before = 0;
  context_.device = dev;
  context_.used_before_handles = used_bytes(&context_.total_bytes, &free_before);

  cudaStream_t s = nullptr;
  MEMFIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  impl_->streams.emplace(kDefaultStream, s);
  MEMFIT_CUBLAS_CHECK(cublasLtCreate(&impl_->lt));

  std::size_t free_after = 0;
  (void)used_bytes(nullptr, &free_after);
  // Other processes can free memory meanwhile; a negative delta is reported as 0.
  context_.handle_bytes = free_before > free_after ? free_before - free_after : 0;
  context_.free_bytes = free_after;
}

CudaBackend::~CudaBackend() = default;  // Impl's destructor synchronizes, then destroys

void CudaBackend::set_workspace_allocator(CachingAllocator* alloc) { workspace_ = alloc; }

cudaStream_t CudaBackend::cuda_stream(StreamId stream) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->streams.find(stream);
  if (it == impl_->streams.end()) {
    throw InvalidArgument("cuda: cuda_stream(" + std::to_string(stream) +
                          "): no such stream; valid: kDefaultStream (0) or an id from "
                          "create_stream() not yet destroyed");
  }
  return it->second;
}

std::int64_t CudaBackend::max_gemm_dim() const { return std::numeric_limits<std::int32_t>::max(); }

// ---- streams -------------------------------------------------------------------------------

StreamId CudaBackend::do_create_stream() {
  cuda::DeviceGuard guard(impl_->device);
  cudaStream_t s = nullptr;
  MEMFIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::lock_guard<std::mutex> lock(impl_->mu);
  const StreamId id = impl_->next_stream++;
  impl_->streams.emplace(id, s);
  return id;
}

void CudaBackend::do_destroy_stream(StreamId stream) {
  cuda::DeviceGuard guard(impl_->device);
  const cudaStream_t s = impl_->stream(stream);
  MEMFIT_CUDA_CHECK(cudaStreamSynchronize(s));
#if MEMFIT_HAVE_CUDNN
  cudnnHandle_t h = nullptr;
#endif
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->streams.erase(stream);
#if MEMFIT_HAVE_CUDNN
    auto it = impl_->cudnn_handles.find(s);
    if (it != impl_->cudnn_handles.end()) {
      h = it->second;
      impl_->cudnn_handles.erase(it);
    }
#endif
  }
#if MEMFIT_HAVE_CUDNN
  if (h != nullptr) MEMFIT_CUDNN_CHECK(cudnnDestroy(h));
#endif
  MEMFIT_CUDA_CHECK(cudaStreamDestroy(s));
}

bool CudaBackend::do_has_stream(StreamId stream) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->streams.count(stream) != 0;
}

void CudaBackend::do_synchronize(StreamId stream) {
  cuda::DeviceGuard guard(impl_->device);
  MEMFIT_CUDA_CHECK(cudaStreamSynchronize(impl_->stream(stream)));
}

// ---- events --------------------------------------------------------------------------------
// Handles are the backend's own counter, not the cudaEvent_t bits: a pooled event is recorded
// again under a new handle, so a stale handle is never mistaken for a live one.

EventHandle CudaBackend::do_record_event(StreamId stream) {
  cuda::DeviceGuard guard(impl_->device);
  const cudaStream_t s = impl_->stream(stream);
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->event_pool.empty()) {
      e = impl_->event_pool.back();
      impl_->event_pool.pop_back();
    }
  }
  if (e == nullptr) {
    MEMFIT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    std::lock_guard<std::mutex> lock(impl_->mu);
    ++impl_->events_created;
  }
  const cudaError_t err = cudaEventRecord(e, s);
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (err != cudaSuccess) {
    impl_->event_pool.push_back(e);
    const std::string call = "cudaEventRecord(event, stream " + std::to_string(stream) + ")";
    cuda::throw_cuda_error(err, call.c_str(), __FILE__, __LINE__);
  }
  const EventHandle h = impl_->next_event++;
  impl_->events.emplace(h, e);
  return h;
}

cudaEvent_t CudaBackend::Impl::event(EventHandle h) const {
  std::lock_guard<std::mutex> lock(mu);
  auto it = events.find(h);
  MEMFIT_CHECK(it != events.end()) << "CudaBackend: event " << h
                                   << " reached the backend without being validated";
  return it->second;
}

bool CudaBackend::do_has_event(EventHandle event) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->events.count(event) != 0;
}

bool CudaBackend::do_query_event(EventHandle event) {
  const cudaError_t err = cudaEventQuery(impl_->event(event));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error; do not leave it as the thread's last error
    return false;
  }
  cuda::throw_cuda_error(err, "cudaEventQuery(event)", __FILE__, __LINE__);
}

void CudaBackend::do_synchronize_event(EventHandle event) {
  MEMFIT_CUDA_CHECK(cudaEventSynchronize(impl_->event(event)));
}

void CudaBackend::do_wait_event(StreamId stream, EventHandle event) {
  cuda::DeviceGuard guard(impl_->device);
  MEMFIT_CUDA_CHECK(cudaStreamWaitEvent(impl_->stream(stream), impl_->event(event), 0));
}

void CudaBackend::do_release_event(EventHandle event) {
  // Back to the pool at once: cudaEventRecord on a pooled event overwrites what it captured,
  // and work already waiting on it (cudaStreamWaitEvent) captured the old state.
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->events.find(event);
  MEMFIT_CHECK(it != impl_->events.end()) << "CudaBackend: release of unknown event " << event;
  impl_->event_pool.push_back(it->second);
  impl_->events.erase(it);
}

// ---- copy ----------------------------------------------------------------------------------

void CudaBackend::do_copy(StreamId stream, const Tensor& src, const Tensor& dst) {
  const std::size_t bytes = src.nbytes();
  if (bytes == 0) return;
  const bool from_dev = src.device() == Device::kCuda;
  const bool to_dev = dst.device() == Device::kCuda;
  const cudaMemcpyKind kind = from_dev ? (to_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                                       : (to_dev ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  cuda::DeviceGuard guard(impl_->device);
  // Asynchronous for pinned host memory; with pageable memory the runtime stages through its
  // own buffers and the call may return only once the copy is done (CUDA runtime API, "API
  // synchronization behavior"). Ordered on the stream either way.
  MEMFIT_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), bytes, kind, impl_->stream(stream)));
}

}  // namespace memfit
