// RuntimeEnv: the backend, memory provider and caching allocator a CLI command trains on,
// chosen by name ("cpu" or "cuda"), so `memfit train` / `memfit profile` take --backend.
//
//   RuntimeEnv env = make_runtime("cuda", conf, {.worker_streams = true});
//   LayerContext ctx{*env.backend, *env.alloc, kDefaultStream, DType::kBF16};
//   ... Trainer ...; env.device_total_bytes (0 on the CPU), env.context_bytes
//
// cpu:  CpuBackend (worker streams when asked: offload overlaps for real), HostProvider; the
//       backend's GEMM scratch comes from the allocator (counts against the budget, as the
//       planner's dry run assumes).
// cuda: CudaBackend on device 0, CudaProvider, the allocator on the backend's stream_sync, the
//       cuBLASLt workspace from the allocator; context_bytes from the backend's ContextInfo.
// Errors: an unknown name (InvalidArgument listing "cpu, cuda"); "cuda" in a build without the
// CUDA backend or on a machine with no usable device (InvalidArgument saying which, with the
// runtime's reason). Members are destroyed allocator first, then provider, then backend.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/backend.h"
#include "memory/alloc_conf.h"
#include "memory/caching_allocator.h"
#include "memory/provider.h"

namespace memfit {

struct RuntimeOptions {
  bool worker_streams = false;  // cpu: a thread per created stream (offload's copy stream)
};

struct RuntimeEnv {
  std::string name;                          // "cpu" or "cuda"
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MemoryProvider> provider;
  std::unique_ptr<CachingAllocator> alloc;   // declared last: destroyed first
  std::size_t device_total_bytes = 0;        // 0: unknown (cpu)
  std::size_t context_bytes = 0;             // CUDA context + library handles (0 on cpu)

  RuntimeEnv() = default;
  RuntimeEnv(RuntimeEnv&&) = default;
  // Tears down what it held in the destructor's order first (a defaulted member-wise move
  // would destroy the old backend while the old allocator still used its stream_sync).
  RuntimeEnv& operator=(RuntimeEnv&& other) noexcept;
  ~RuntimeEnv();  // resets alloc, then provider, then backend
};

RuntimeEnv make_runtime(std::string_view backend, const AllocatorConfig& conf,
                        const RuntimeOptions& options = {});

// True when this build has the CUDA backend and a device is usable; *why says why not.
bool cuda_runtime_available(std::string* why = nullptr);

}  // namespace memfit
