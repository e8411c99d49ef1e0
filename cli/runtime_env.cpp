// RuntimeEnv: see cli/runtime_env.h.
#include "cli/runtime_env.h"

#include <memory>
#include <string>
#include <utility>

#include "core/cpu/cpu_backend.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "policies/dry_run.h"  // kGpuGemmWorkspaceBytes

#if MEMFIT_HAVE_CUDA
#include "core/cuda/cuda_backend.h"
#include "memory/cuda/cuda_provider.h"

// The planner's dry runs model the CUDA backend's default GEMM workspace.
static_assert(memfit::CudaBackendOptions{}.gemm_workspace_bytes == memfit::kGpuGemmWorkspaceBytes,
              "policies/dry_run.h's kGpuGemmWorkspaceBytes must follow CudaBackendOptions");
#endif

namespace memfit {
namespace {

// The backend keeps a pointer to the allocator for its GEMM workspace/scratch; it must forget
// it before the allocator dies (the CPU backend's worker streams may still hold a queued GEMM,
// and set_workspace_allocator drains them first).
void detach_workspace(Backend* backend) {
  if (backend == nullptr) return;
  if (auto* cpu = dynamic_cast<CpuBackend*>(backend)) {
    cpu->set_workspace_allocator(nullptr);
    return;
  }
#if MEMFIT_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(backend)) {
    // Queued GEMMs hold workspace blocks recorded on their streams; the allocator's destructor
    // waits for those events, so only the pointer needs clearing here.
    cuda->set_workspace_allocator(nullptr);
  }
#endif
}

RuntimeEnv make_cpu(const AllocatorConfig& conf, const RuntimeOptions& options) {
  RuntimeEnv env;
  env.name = "cpu";
  // The backend goes into env first: should anything below throw, env's destructor still
  // tears down in the safe order (the allocator uses the backend's stream_sync).
  auto owned =
      std::make_unique<CpuBackend>(CpuBackendOptions{.worker_streams = options.worker_streams});
  CpuBackend* backend = owned.get();
  env.backend = std::move(owned);
  env.provider = std::make_unique<HostProvider>();
  env.alloc = std::make_unique<CachingAllocator>(*env.provider, conf, &backend->stream_sync());
  // The GEMM's f16/bf16 widening scratch counts against the budget, as the planner's dry run
  // assumes (it makes the same allocations on the meta backend).
  backend->set_workspace_allocator(env.alloc.get());
  return env;
}

#if MEMFIT_HAVE_CUDA
RuntimeEnv make_cuda(const AllocatorConfig& conf) {
  std::string why;
  if (CudaProvider::cuda_device_count(&why) == 0) {
    throw InvalidArgument("backend 'cuda': no usable CUDA device (" + why +
                          "); valid here: cpu");
  }
  RuntimeEnv env;
  env.name = "cuda";
  auto owned = std::make_unique<CudaBackend>(CudaBackendOptions{.device = 0});
  CudaBackend* backend = owned.get();
  env.backend = std::move(owned);
  env.provider = std::make_unique<CudaProvider>(0);
  env.alloc = std::make_unique<CachingAllocator>(*env.provider, conf, &backend->stream_sync());
  backend->set_workspace_allocator(env.alloc.get());  // cuBLASLt workspace: Category::kWorkspace
  const ContextInfo& info = backend->context_info();
  env.device_total_bytes = info.total_bytes;
  // Memory that is not free once the backend exists (the context, the library handles,
  // anything else on the GPU): what the planner must subtract from the device's memory.
  env.context_bytes = info.used_before_handles + info.handle_bytes;
  return env;
}
#endif

}  // namespace

RuntimeEnv::~RuntimeEnv() {
  detach_workspace(backend.get());
  alloc.reset();
  provider.reset();
  backend.reset();
}

RuntimeEnv& RuntimeEnv::operator=(RuntimeEnv&& other) noexcept {
  if (this == &other) return *this;
  detach_workspace(backend.get());
  alloc.reset();
  provider.reset();
  backend.reset();
  name = std::move(other.name);
  backend = std::move(other.backend);
  provider = std::move(other.provider);
  alloc = std::move(other.alloc);
  device_total_bytes = other.device_total_bytes;
  context_bytes = other.context_bytes;
  return *this;
}

RuntimeEnv make_runtime(std::string_view backend, const AllocatorConfig& conf,
                        const RuntimeOptions& options) {
  if (backend == "cpu") return make_cpu(conf, options);
  if (backend == "cuda") {
#if MEMFIT_HAVE_CUDA
    return make_cuda(conf);
#else
    throw InvalidArgument(
        "backend 'cuda': this memfit was built without the CUDA backend (configure with "
        "-DMEMFIT_CUDA=ON where nvcc and the CUDA toolkit are installed); valid here: cpu");
#endif
  }
  throw InvalidArgument("backend '" + std::string(backend) + "': unknown; valid: cpu, cuda");
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
