#include "policies/runtime_env.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "core/cpu/cpu_backend.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "memory/size.h"

#if MEMFIT_HAVE_CUDA
#include "memory/cuda/cuda_provider.h"
#endif

namespace memfit {
namespace {

// The backend must forget the allocator before the allocator dies (the CPU backend's worker
// streams may still hold a queued GEMM, and set_workspace_allocator drains them first; queued
// CUDA GEMMs hold workspace blocks recorded on their streams, which the allocator's
// destructor waits for).
void tear_down(RuntimeEnv& env) {
  if (env.backend) env.backend->set_workspace_allocator(nullptr);
  env.alloc.reset();
  env.provider.reset();
  env.backend.reset();
}

RuntimeEnv make_cpu(const AllocatorConfig& conf, const RuntimeOptions& options) {
  RuntimeEnv env;
  env.kind = DeviceKind::kCpu;
  // The backend goes into env first: should anything below throw, env's destructor still
  // tears down in the safe order (the allocator uses the backend's stream_sync).
  env.backend =
      std::make_unique<CpuBackend>(CpuBackendOptions{.worker_streams = options.worker_streams});
  env.provider = std::make_unique<HostProvider>();
  env.alloc = std::make_unique<CachingAllocator>(*env.provider, conf, &env.backend->stream_sync());
  env.backend->set_workspace_allocator(env.alloc.get());
  return env;
}

}  // namespace

HostMemory host_memory() {
  HostMemory m;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  unsigned long long kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);  // " kB"
    if (key == "MemTotal:") m.total = static_cast<std::size_t>(kib) * 1024;
    if (key == "MemAvailable:") m.available = static_cast<std::size_t>(kib) * 1024;
  }
  return m;
}

std::size_t default_host_budget(DeviceKind kind, std::size_t device_budget, HostMemory mem) {
  if (mem.total == 0 || mem.available == 0) return 0;
  const std::size_t margin = std::max(kGiB, mem.total / 10);
  const std::size_t taken = margin + (kind == DeviceKind::kCpu ? device_budget : 0);
  return mem.available > taken + kMiB ? mem.available - taken : kMiB;
}

RuntimeEnv::~RuntimeEnv() { tear_down(*this); }

RuntimeEnv& RuntimeEnv::operator=(RuntimeEnv&& other) noexcept {
  if (this == &other) return *this;
  tear_down(*this);
  kind = other.kind;
  backend = std::move(other.backend);
  provider = std::move(other.provider);
  alloc = std::move(other.alloc);
  device_total_bytes = other.device_total_bytes;
  context_bytes = other.context_bytes;
  return *this;
}

RuntimeEnv make_runtime(DeviceKind kind, const AllocatorConfig& conf,
                        const RuntimeOptions& options) {
  if (kind == DeviceKind::kCpu) return make_cpu(conf, options);
#if MEMFIT_HAVE_CUDA
  return make_cuda_runtime(conf);
#else
  throw InvalidArgument(
      "backend cuda: this memfit was built without the CUDA backend (configure with "
      "-DMEMFIT_CUDA=ON where nvcc and the CUDA toolkit are installed); valid here: cpu");
#endif
}

bool cuda_runtime_available(std::string* why) {
#if MEMFIT_HAVE_CUDA
  std::string reason;
  if (CudaProvider::cuda_device_count(&reason) > 0) return true;
  if (why != nullptr) *why = "no usable CUDA device: " + reason;
  return false;
#else
  if (why != nullptr) *why = "this memfit was built without the CUDA backend";
  return false;
#endif
}

}  // namespace memfit
