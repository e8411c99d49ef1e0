// CuptiTracer: what the GPU did while a run was profiled, from CUPTI's Activity API (CUDA
// builds only: profiler/cuda/ is compiled only with MEMFIT_HAVE_CUDA).
//
//   std::string why;
//   if (!CuptiTracer::available(&why)) std::cerr << "no GPU trace: " << why << "\n";
//   CuptiTracer tracer;
//   tracer.start();
//   ... train ...
//   tracer.stop();                                    // forced flush, then disable
//   report.gpu = tracer.take();                       // profiler/report.h
//   report.gpu_dropped = tracer.dropped();
//
// Records: device allocations and frees (MEMORY2: every cudaMalloc/cudaFree in the process,
// memfit's own segments and the cuBLAS/cuDNN workspaces made outside memfit's allocator alike),
// kernels (CONCURRENT_KERNEL, which does not serialize kernels), memcpy, memset, and NVTX
// ranges (MARKER: memfit's ScopedRanges, profiler/scoped_range.h, paired begin to end). Times
// are steady_clock nanoseconds, the Recorder's clock: CUPTI timestamps (cuptiGetTimestamp's
// scale) are shifted by an offset measured at start().
//
// NVTX: CUPTI sees NVTX ranges only when NVTX hands them to it, which NVTX decides at the
// process's first NVTX call (NVTX_INJECTION64_PATH names the tool library). start() sets that
// variable to the CUPTI library in use when it is unset, so markers are recorded when the
// first start() comes before the first ScopedRange of the process (as in `memfit profile`);
// ranges of a process whose NVTX was bound earlier are not seen (the other records are).
//
// Buffers: CUPTI fills 4 MiB buffers from a process-wide pool (reused across tracers, at most
// 64 in flight); records lost because a buffer was full or none could be had are counted by
// dropped(). Every CUPTI call is checked: a failure throws CudaError naming the call and
// CUPTI's result string. CUPTI's activity callbacks are process-wide, so one tracer may run at
// a time: start() while another tracer runs throws InvalidArgument. The destructor stops a
// running tracer. Not thread-safe itself (start/stop/take from one thread); CUPTI's own threads
// deliver buffers concurrently, which the tracer handles.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "profiler/report.h"

namespace memfit {

class CuptiTracer {
 public:
  CuptiTracer();
  ~CuptiTracer();
  CuptiTracer(const CuptiTracer&) = delete;
  CuptiTracer& operator=(const CuptiTracer&) = delete;

  void start();  // InvalidArgument if a tracer (this one or another) is running; CudaError
  void stop();   // cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), then disable
  // The records since start() not taken yet, by start time (a marker still open: end ==
  // start).
  std::vector<GpuActivity> take();
  // Records CUPTI dropped (cuptiActivityGetNumDroppedRecords) plus buffers it asked for that
  // could not be had, since start().
  std::uint64_t dropped() const;

  // Whether tracing can work here: a CUDA device and a loadable CUPTI. false + the reason.
  static bool available(std::string* why);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace memfit
