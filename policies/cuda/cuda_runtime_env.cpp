// The CUDA half of RuntimeEnv (policies/runtime_env.h): CudaBackend + CudaProvider on one
// device: device 0, or under mpirun the node-local rank's (local rank modulo the devices), so
// the ranks of a node each take their own GPU (NCCL refuses two ranks on one device).
#include <memory>
#include <string>

#include "core/comm/communicator.h"  // launch_info
#include "core/cuda/cuda_backend.h"
#include "memory/cuda/cuda_provider.h"
#include "memory/error.h"
#include "policies/run_spec.h"  // kGpuGemmWorkspaceBytes
#include "policies/runtime_env.h"

namespace memfit {

// The dry run models the CUDA backend's default GEMM workspace.
static_assert(CudaBackendOptions{}.gemm_workspace_bytes == kGpuGemmWorkspaceBytes,
              "policies/run_spec.h's kGpuGemmWorkspaceBytes must follow CudaBackendOptions");

RuntimeEnv make_cuda_runtime(const AllocatorConfig& conf) {
  std::string why;
  const int devices = CudaProvider::cuda_device_count(&why);
  if (devices == 0) {
    throw InvalidArgument("backend cuda: no usable CUDA device (" + why + "); valid here: cpu");
  }
  const int device = launch_info().local_rank % devices;
  RuntimeEnv env;
  env.kind = DeviceKind::kCuda;
  auto owned = std::make_unique<CudaBackend>(CudaBackendOptions{.device = device});
  CudaBackend* backend = owned.get();
  env.backend = std::move(owned);
  env.provider = std::make_unique<CudaProvider>(device);
  env.alloc = std::make_unique<CachingAllocator>(*env.provider, conf, &backend->stream_sync());
  backend->set_workspace_allocator(env.alloc.get());  // cuBLASLt workspace: Category::kWorkspace
  const ContextInfo& info = backend->context_info();
  env.device_total_bytes = info.total_bytes;
  // Memory that is not free once the backend exists (the context, the library handles,
  // anything else on the GPU): what the planner must subtract from the device's memory.
  env.context_bytes = info.used_before_handles + info.handle_bytes;
  return env;
}

}  // namespace memfit
