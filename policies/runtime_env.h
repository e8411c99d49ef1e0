// RuntimeEnv: the backend, device memory provider and budgeted caching allocator a run trains
// on, for a DeviceKind; the bottom layer of RunSetup (policies/run_setup.h), which most code
// should use instead.
//
//   RuntimeEnv env = make_runtime(DeviceKind::kCuda, conf, {.worker_streams = true});
//   LayerContext ctx{*env.backend, *env.alloc, kDefaultStream, DType::kBF16};
//   env.device_total_bytes (0 on the CPU), env.context_bytes
//
// cpu:  CpuBackend (worker streams when asked: offload overlaps for real), HostProvider.
// cuda: CudaBackend on device 0, CudaProvider (policies/cuda/cuda_runtime_env.cpp, CUDA builds
//       only); context_bytes from the backend's ContextInfo (the context and library handles).
// Either way the allocator runs on the backend's stream_sync and the backend takes its GEMM
// workspace or scratch from it (Backend::set_workspace_allocator), inside the budget, as the
// dry run (policies/dry_run.h) assumes.
// Errors: kCuda in a build without the CUDA backend, or on a machine with no usable device
// (InvalidArgument saying which, with the runtime's reason). Members are destroyed allocator
// first (the backend forgets it before), then provider, then backend.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/backend.h"
#include "memory/alloc_conf.h"
#include "memory/caching_allocator.h"
#include "memory/provider.h"
#include "policies/device_spec.h"

namespace memfit {

struct RuntimeOptions {
  bool worker_streams = false;  // cpu: a thread per created stream (offload's copy stream)
};

struct RuntimeEnv {
  DeviceKind kind = DeviceKind::kCpu;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MemoryProvider> provider;
  std::unique_ptr<CachingAllocator> alloc;  // declared last: destroyed first
  std::size_t device_total_bytes = 0;       // 0: unknown (cpu)
  std::size_t context_bytes = 0;            // CUDA context + library handles (0 on cpu)

  const char* name() const { return device_kind_name(kind); }  // "cpu", "cuda"

  RuntimeEnv() = default;
  RuntimeEnv(RuntimeEnv&&) = default;
  // Tears down what it held in the destructor's order first (a defaulted member-wise move
  // would destroy the old backend while the old allocator still used its stream_sync).
  RuntimeEnv& operator=(RuntimeEnv&& other) noexcept;
  ~RuntimeEnv();
};

RuntimeEnv make_runtime(DeviceKind kind, const AllocatorConfig& conf,
                        const RuntimeOptions& options = {});

// The pinned host memory a run on this machine may take when no host budget is given: its
// available memory now (/proc/meminfo's MemAvailable) less a margin of a tenth of its memory
// (at least 1 GiB: pinning nearly all of it stalls or kills a real machine), and less the
// device budget on the CPU backend, whose "device" memory is host memory too. At least 1 MiB;
// 0 (no limit) when /proc/meminfo cannot be read.
struct HostMemory {
  std::size_t total = 0, available = 0;  // bytes; 0: unknown
};
HostMemory host_memory();  // this machine's, now
std::size_t default_host_budget(DeviceKind kind, std::size_t device_budget,
                                HostMemory mem = host_memory());

// True when this build has the CUDA backend and a device is usable; *why says why not.
bool cuda_runtime_available(std::string* why = nullptr);

#if MEMFIT_HAVE_CUDA
RuntimeEnv make_cuda_runtime(const AllocatorConfig& conf);  // policies/cuda/
#endif

}  // namespace memfit
