// CudaBackend::Impl: the CUDA state behind a CudaBackend (streams, the event pool, library
// handles), for the backend's own translation units (cuda_backend.cpp, cuda_gemm.cpp,
// cuda_elementwise.cpp, cuda_nn.cpp, cuda_conv.cpp). Not a public header: C++ (.cpp) files
// only; .cu files get plain launcher headers instead.
//
//   void CudaBackend::do_add(StreamId s, const Tensor& a, const Tensor& b, const Tensor& out) {
//     cudaStream_t cs = impl().stream(s);            // the validated StreamId's cudaStream_t
//     launch_add(cs, ...);                           // nn_kernels.h
//   }
//   #if MEMFIT_HAVE_CUDNN
//     cudnnHandle_t h = impl().cudnn(cs);            // bound to cs; created on first use
//   #endif
//   CudaScratch tmp(*this, s, bytes, "cuda.conv.workspace");   // freed when it goes
//
// Contract:
// - stream(id) returns the cudaStream_t of a live StreamId (the base class has validated it);
//   kDefaultStream maps to a non-blocking stream the backend owns, never the legacy stream.
// - The cuBLASLt handle is created once in the constructor and shared by every stream (a
//   cublasLtHandle_t carries no stream: each matmul takes one).
// - cuDNN handles are per CUDA stream, created on first use (so a backend that never runs a
//   cuDNN op never pays for one) and bound to their stream with cudnnSetStream once. One handle
//   per stream keeps two threads issuing on two streams (allowed by Backend) from racing on a
//   shared handle's stream. Their memory is therefore not in ContextInfo::handle_bytes.
// - Every member function is thread-safe (one mutex for the tables).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#if MEMFIT_HAVE_CUDNN
#include <cudnn.h>
#endif

#include "core/cuda/cuda_backend.h"
#include "memory/block.h"

namespace memfit {

namespace cuda {
// cuBLASLt descriptors and heuristic results cached per GEMM shape (cuda_gemm.cpp).
struct GemmPlanCache;
void destroy_gemm_plan_cache(GemmPlanCache* cache);  // cuda_gemm.cpp
}  // namespace cuda

struct CudaBackend::Impl {
  explicit Impl(int device) : device(device) {}
  ~Impl();  // cuda_backend.cpp: destroys streams, events, handles (after synchronizing)
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // The cudaStream_t of a StreamId the base class has validated (MEMFIT_CHECK otherwise).
  cudaStream_t stream(StreamId id) const;
  // The cudaEvent_t of a live EventHandle (MEMFIT_CHECK otherwise).
  cudaEvent_t event(EventHandle h) const;

  const int device;
  cublasLtHandle_t lt = nullptr;

#if MEMFIT_HAVE_CUDNN
  // The cuDNN handle bound to `s` (created and bound on first use; CudaError on failure).
  cudnnHandle_t cudnn(cudaStream_t s);
#endif

  // ---- state below: guarded by mu (cuda_backend.cpp manages it) ----
  mutable std::mutex mu;
  std::unordered_map<StreamId, cudaStream_t> streams;  // kDefaultStream included
  StreamId next_stream = 1;
  std::unordered_map<EventHandle, cudaEvent_t> events;  // recorded, not yet released
  std::vector<cudaEvent_t> event_pool;                  // released, ready to record again
  EventHandle next_event = 1;
  std::int64_t events_created = 0;
#if MEMFIT_HAVE_CUDNN
  std::unordered_map<cudaStream_t, cudnnHandle_t> cudnn_handles;
#endif
  cuda::GemmPlanCache* gemm_cache = nullptr;  // owned; created by the first gemm
};

// Device scratch for one op, on its stream: from the backend's workspace allocator
// (Category::kWorkspace, `tag`) when one is set, else from the runtime's stream-ordered pool
// (cudaMallocAsync / cudaFreeAsync on the op's stream). Freeing on destruction is stream
// ordered either way: the allocator reuses a block for its own stream at once (later work on
// that stream runs after the op), and cudaFreeAsync is queued behind the op. So the scratch
// may go out of scope as soon as the op is queued. 0 bytes: no memory, data() == nullptr.
class CudaScratch {
 public:
  CudaScratch(CudaBackend& be, StreamId stream, std::size_t bytes, std::string_view tag);
  ~CudaScratch();
  CudaScratch(const CudaScratch&) = delete;
  CudaScratch& operator=(const CudaScratch&) = delete;
  void* data() const { return ptr_; }
  std::size_t size() const { return bytes_; }

 private:
  Block block_;              // from the allocator, or empty
  void* ptr_ = nullptr;      // block_.data() or the cudaMallocAsync pointer
  cudaStream_t cs_ = nullptr;  // for cudaFreeAsync
  std::size_t bytes_ = 0;
  int device_ = 0;
};

}  // namespace memfit
