// MetaBackend's GEMM workspace: with set_gemm_workspace_bytes(N) every GEMM that has work
// takes exactly N bytes (Category::kWorkspace) from the workspace allocator for the call's
// duration, as CudaBackend does with cuBLASLt's workspace; without, the CPU backend's scratch,
// byte for byte, on each CPU GEMM engine (MEMFIT_CPU_GEMM: oneDNN's scratchpad or BLAS's
// widened operands).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/gemm_engine.h"
#include "core/meta/meta_backend.h"
#include "core/tensor.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"

namespace memfit {
namespace {

struct Gemms {
  std::size_t n = 0;  // GEMMs with work issued
};

// Three GEMMs with work (f32, bf16 with a mixed-dtype output, a strided batch) and one with
// none (m == 0).
Gemms issue(MetaBackend& meta, CachingAllocator& alloc) {
  const Device dev = Device::kMeta;
  OwnedTensor a = OwnedTensor::empty(alloc, {64, 96}, DType::kBF16, dev, Category::kActivation);
  OwnedTensor b = OwnedTensor::empty(alloc, {128, 96}, DType::kBF16, dev, Category::kParameter);
  OwnedTensor c = OwnedTensor::empty(alloc, {64, 128}, DType::kF32, dev, Category::kActivation);
  OwnedTensor af = OwnedTensor::empty(alloc, {64, 96}, DType::kF32, dev, Category::kActivation);
  OwnedTensor bf = OwnedTensor::empty(alloc, {128, 96}, DType::kF32, dev, Category::kParameter);
  GemmDesc d;
  d.m = 64;
  d.n = 128;
  d.k = 96;
  d.trans_b = true;
  meta.gemm(kDefaultStream, d, a, b, c);
  meta.gemm(kDefaultStream, d, af, bf, c);
  GemmDesc batched = d;  // two (32, 96) x (96, 64) products
  batched.m = 32;
  batched.n = 64;
  batched.batch = 2;
  batched.stride_b = 0;
  meta.gemm(kDefaultStream, batched, af, bf, c);
  GemmDesc empty = d;
  empty.m = 0;
  meta.gemm(kDefaultStream, empty, af, bf, c);
  return Gemms{3};
}

TEST(MetaGemmWorkspace, EveryGemmWithWorkTakesTheFixedWorkspaceForItsDuration) {
  constexpr std::size_t kWs = std::size_t{3} << 20;
  MetaBackend meta;
  NullProvider null;
  CachingAllocator alloc(null, {}, &meta.stream_sync());
  meta.set_workspace_allocator(&alloc);
  meta.set_gemm_workspace_bytes(kWs);
  EXPECT_EQ(meta.gemm_workspace_bytes(), kWs);
  const Gemms g = issue(meta, alloc);
  const AllocatorStats s = alloc.stats();
  const auto ws = category_index(Category::kWorkspace);
  EXPECT_EQ(s.category_bytes[ws].allocated, static_cast<std::int64_t>(g.n * kWs));
  EXPECT_EQ(s.category_bytes[ws].peak, static_cast<std::int64_t>(kWs));  // one at a time
  EXPECT_EQ(s.category_bytes[ws].current, 0);
  meta.set_workspace_allocator(nullptr);
}

TEST(MetaGemmWorkspace, ZeroBytesKeepsTheCpuScratchAndNoAllocatorTakesNothing) {
  const auto ws = category_index(Category::kWorkspace);
  NullProvider null;
  {
    // Default 0: the CPU scratch, which is shape-dependent (bf16 operands widened), not 3 MiB.
    MetaBackend meta;
    CachingAllocator alloc(null, {}, &meta.stream_sync());
    meta.set_workspace_allocator(&alloc);
    issue(meta, alloc);
    const AllocatorStats s = alloc.stats();
    EXPECT_GT(s.category_bytes[ws].allocated, 0);
    EXPECT_LT(s.category_bytes[ws].peak, std::int64_t{1} << 20);
    meta.set_workspace_allocator(nullptr);
  }
  {
    // A workspace size without an allocator: nothing is taken.
    MetaBackend meta;
    CachingAllocator alloc(null, {}, &meta.stream_sync());
    meta.set_gemm_workspace_bytes(std::size_t{3} << 20);
    issue(meta, alloc);
    EXPECT_EQ(alloc.stats().category_bytes[ws].allocated, 0);
  }
}

// The GPT shapes' GEMMs (forward, dinp, dweight with beta 1, attention batched with a
// broadcast) in every dtype mix the layers issue, on `be`, with operands from `alloc`; returns
// the "cpu.gemm.scratch" allocation sizes in order.
std::vector<std::size_t> scratch_sequence(Backend& be, CachingAllocator& alloc, Device dev) {
  std::vector<std::size_t> sizes;
  alloc.add_listener([&](const AllocatorEvent& e) {
    if (e.kind == EventKind::kAlloc && e.tag == "cpu.gemm.scratch") sizes.push_back(e.size);
  });
  struct Shape3 {
    std::int64_t m, n, k, batch;
    bool ta, tb;
    float beta;
    bool broadcast_b;
  };
  const Shape3 shapes[] = {{256, 96, 32, 1, false, true, 0.0f, false},
                           {256, 32, 96, 1, false, false, 0.0f, false},
                           {96, 32, 256, 1, true, false, 1.0f, false},
                           {16, 16, 8, 4, false, true, 0.0f, false},
                           {16, 8, 16, 4, false, false, 0.0f, true}};
  const DType mixes[][3] = {{DType::kF32, DType::kF32, DType::kF32},
                            {DType::kBF16, DType::kBF16, DType::kBF16},
                            {DType::kBF16, DType::kBF16, DType::kF32},
                            {DType::kF16, DType::kF16, DType::kF16},
                            {DType::kBF16, DType::kF32, DType::kF32}};
  for (const auto& mix : mixes) {
    for (const Shape3& s : shapes) {
      OwnedTensor a = OwnedTensor::empty(alloc, {s.batch * s.m * s.k}, mix[0], dev,
                                         Category::kActivation);
      OwnedTensor b = OwnedTensor::empty(alloc, {s.batch * s.k * s.n}, mix[1], dev,
                                         Category::kParameter);
      OwnedTensor c = OwnedTensor::empty(alloc, {s.batch * s.m * s.n}, mix[2], dev,
                                         Category::kActivation);
      if (dev == Device::kCpu) {
        be.fill(kDefaultStream, a, 0.5f);
        be.fill(kDefaultStream, b, 0.25f);
        be.fill(kDefaultStream, c, 0.0f);
      }
      GemmDesc d;
      d.m = s.m;
      d.n = s.n;
      d.k = s.k;
      d.trans_a = s.ta;
      d.trans_b = s.tb;
      d.beta = s.beta;
      d.batch = s.batch;
      if (s.broadcast_b) d.stride_b = 0;
      be.gemm(kDefaultStream, d, a, b, c);
    }
  }
  be.synchronize(kDefaultStream);
  return sizes;
}

TEST(MetaGemmWorkspace, DryRunScratchIsTheCpuBackendsOnEveryEngine) {
  std::optional<std::string> old;
  if (const char* v = std::getenv(cpu::kGemmEngineEnv)) old = v;
  for (const char* engine : {"blas", "dnnl", "auto"}) {
    SCOPED_TRACE(engine);
    ::setenv(cpu::kGemmEngineEnv, engine, 1);
    CpuBackend cpu_be;
    HostProvider host;
    CachingAllocator cpu_alloc(host, {}, &cpu_be.stream_sync());
    cpu_be.set_workspace_allocator(&cpu_alloc);
    const std::vector<std::size_t> measured = scratch_sequence(cpu_be, cpu_alloc, Device::kCpu);
    cpu_be.set_workspace_allocator(nullptr);

    MetaBackend meta;
    NullProvider null;
    CachingAllocator meta_alloc(null, {}, &meta.stream_sync());
    meta.set_workspace_allocator(&meta_alloc);
    const std::vector<std::size_t> predicted = scratch_sequence(meta, meta_alloc, Device::kMeta);
    meta.set_workspace_allocator(nullptr);

    EXPECT_EQ(predicted, measured);
    EXPECT_FALSE(measured.empty());
    EXPECT_EQ(meta_alloc.stats().requested_bytes[kStatAll].allocated,
              cpu_alloc.stats().requested_bytes[kStatAll].allocated);
  }
  if (old) {
    ::setenv(cpu::kGemmEngineEnv, old->c_str(), 1);
  } else {
    ::unsetenv(cpu::kGemmEngineEnv);
  }
}

TEST(MetaGemmWorkspace, BadEngineVariableFailsTheDryRunToo) {
  std::optional<std::string> old;
  if (const char* v = std::getenv(cpu::kGemmEngineEnv)) old = v;
  ::setenv(cpu::kGemmEngineEnv, "fast", 1);
  MetaBackend meta;
  NullProvider null;
  CachingAllocator alloc(null, {}, &meta.stream_sync());
  meta.set_workspace_allocator(&alloc);
  EXPECT_THROW(issue(meta, alloc), ConfigError);
  meta.set_workspace_allocator(nullptr);
  if (old) {
    ::setenv(cpu::kGemmEngineEnv, old->c_str(), 1);
  } else {
    ::unsetenv(cpu::kGemmEngineEnv);
  }
}

}  // namespace
}  // namespace memfit
