// MetaBackend's GPU GEMM workspace: with set_gemm_workspace_bytes(N) every GEMM that has work
// takes exactly N bytes (Category::kWorkspace) from the workspace allocator for the call's
// duration, as CudaBackend does with cuBLASLt's workspace, instead of the CPU scratch.
#include <gtest/gtest.h>

#include <cstddef>

#include "core/meta/meta_backend.h"
#include "core/tensor.h"
#include "memory/caching_allocator.h"
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

}  // namespace
}  // namespace memfit
