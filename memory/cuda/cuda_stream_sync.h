// CudaStreamSync: the caching allocator's StreamSync (memory/stream.h) over CUDA events, for
// one device. CUDA builds only.
//
//   cudaStream_t copy;  cudaStreamCreate(&copy);
//   CudaProvider gpu(0);
//   CudaStreamSync sync(0);
//   CachingAllocator alloc(gpu, {}, &sync);
//   Block b = alloc.allocate(n, Category::kActivation);            // default stream
//   launch_on(copy, b.data());
//   b.record_stream(to_stream_id(copy));  // b's memory is not reused before `copy` is done
//
// StreamId <-> cudaStream_t: a StreamId is the cudaStream_t handle's bits; 0 (kDefaultStream)
// is the legacy default stream of `device`. Use to_stream_id / to_cuda_stream below.
//
// Events are created with cudaEventDisableTiming: the allocator only asks "done yet?", and
// the runtime documents events without timing (and without cudaEventBlockingSync) as the
// fastest for cudaEventQuery and cudaStreamWaitEvent. A released event goes back to a pool
// and is recorded again later (cudaEventRecord overwrites what an event captured), so a
// training step creates no events once warm; the pool holds as many events as were ever
// outstanding at once, and the destructor destroys them.
//
// Errors: a failing CUDA call throws CudaError (memory/cuda/cuda_check.h). cudaEventQuery's
// cudaErrorNotReady is not an error: query() returns false and clears it from the runtime's
// last error. Errors from earlier asynchronous work (a faulting kernel) surface from record,
// query or synchronize as CudaError, since the runtime reports them from any later call.
//
// Thread-safe. Every event belongs to `device`; recording one on a stream of another device
// is an error, so use one CudaStreamSync per device. Must outlive the allocator using it, and
// every handle must be released (the caching allocator releases all it records).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "memory/stream.h"

namespace memfit {

inline StreamId to_stream_id(cudaStream_t s) {
  return static_cast<StreamId>(reinterpret_cast<std::uintptr_t>(s));
}
inline cudaStream_t to_cuda_stream(StreamId id) {
  return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(id));
}

class CudaStreamSync final : public StreamSync {
 public:
  // Throws InvalidArgument when `device` is not a usable CUDA device.
  explicit CudaStreamSync(int device = 0);
  ~CudaStreamSync() override;
  CudaStreamSync(const CudaStreamSync&) = delete;
  CudaStreamSync& operator=(const CudaStreamSync&) = delete;

  EventHandle record(StreamId stream) override;
  bool query(EventHandle event) override;
  void synchronize(EventHandle event) override;
  void release(EventHandle event) override;

  int device() const { return device_; }
  // Events created so far (pool misses) and events waiting in the pool: a steady state shows
  // created() flat while record() keeps being called.
  std::int64_t created() const;
  std::size_t pooled() const;

 private:
  const int device_;
  mutable std::mutex mu_;
  std::vector<cudaEvent_t> pool_;
  std::int64_t created_ = 0;
};

}  // namespace memfit
