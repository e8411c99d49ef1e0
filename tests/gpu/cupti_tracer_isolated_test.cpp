// CuptiTracer on a GPU: a device allocation, copies both ways, a memset, a kernel and an NVTX
// range (a ScopedRange) inside start()/stop() all come back with sane times, sizes and
// addresses; a second running tracer is refused.
//
// An isolated binary (memfit_cupti_tracer_isolated_test): NVTX binds CUPTI at the process's
// first NVTX call, which must come after start() (cupti_tracer.h); in the shared GPU test
// binary an earlier test's ScopedRange would come first.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_testutil.h"
#include "memory/error.h"
#include "profiler/cuda/cupti_tracer.h"
#include "profiler/scoped_range.h"

namespace memfit {
namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// out[i] = i for i < n: a kernel without nvcc (tests are .cpp), JIT-compiled by the driver.
constexpr const char* kIotaPtx = R"(
.version 7.0
.target sm_52
.address_size 64
.visible .entry memfit_test_iota(.param .u64 out, .param .u32 n)
{
  .reg .pred %p<2>;
  .reg .b32 %r<6>;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r5, 4;
  add.s64 %rd4, %rd2, %rd3;
  st.global.u32 [%rd4], %r5;
DONE:
  ret;
}
)";

const GpuActivity* find(const std::vector<GpuActivity>& v, GpuActivityKind k,
                        const std::string& name_part = "") {
  for (const GpuActivity& a : v) {
    if (a.kind == k && a.name.find(name_part) != std::string::npos) return &a;
  }
  return nullptr;
}

TEST(CuptiTracer, RecordsAllocationsCopiesMemsetKernelsAndMarkers) {
  MEMFIT_REQUIRE_GPU();
  std::string why;
  ASSERT_TRUE(CuptiTracer::available(&why)) << why;

  constexpr std::uint32_t kN = 1 << 18;  // 1 MiB of u32
  constexpr std::size_t kBytes = kN * sizeof(std::uint32_t);
  cudaLibrary_t lib = nullptr;
  cudaKernel_t kernel = nullptr;
  CUDA_OK(cudaLibraryLoadData(&lib, kIotaPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUDA_OK(cudaLibraryGetKernel(&kernel, lib, "memfit_test_iota"));
  std::vector<std::uint32_t> host(kN, 7);

  CuptiTracer tracer;
  const std::int64_t t0 = steady_ns();
  tracer.start();
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, kBytes));
  CUDA_OK(cudaMemcpy(dev, host.data(), kBytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dev, 0, kBytes));
  {
    ScopedRange r(RangeKind::kOther, "cupti_test_range");
    void* out = dev;
    std::uint32_t n = kN;
    void* args[] = {&out, &n};
    CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(kN / 256), dim3(256), args,
                             0, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
  }
  CUDA_OK(cudaMemcpy(host.data(), dev, kBytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(dev));
  tracer.stop();
  const std::int64_t t1 = steady_ns();
  CUDA_OK(cudaLibraryUnload(lib));
  for (std::uint32_t i = 0; i < kN; i += 4099) ASSERT_EQ(host[i], i) << "the kernel did not run";

  const std::vector<GpuActivity> recs = tracer.take();
  EXPECT_EQ(tracer.dropped(), 0u);
  ASSERT_FALSE(recs.empty());
  // The offset is measured to within microseconds; allow 2 ms for the clocks' drift.
  const std::int64_t slack = 2'000'000;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    const GpuActivity& a = recs[i];
    EXPECT_GE(a.start_ns, t0 - slack) << a.name;
    EXPECT_LE(a.end_ns, t1 + slack) << a.name;
    EXPECT_LE(a.start_ns, a.end_ns) << a.name;
    if (i > 0) EXPECT_LE(recs[i - 1].start_ns, a.start_ns);  // by start time
  }
  const GpuActivity* malloc_rec = nullptr;
  for (const GpuActivity& a : recs) {
    if (a.kind == GpuActivityKind::kMalloc && a.address == reinterpret_cast<std::uintptr_t>(dev)) {
      malloc_rec = &a;
    }
  }
  ASSERT_NE(malloc_rec, nullptr) << "no MEMORY2 allocation record at the cudaMalloc address";
  EXPECT_GE(malloc_rec->bytes, kBytes);
  EXPECT_EQ(malloc_rec->name, "device");
  const GpuActivity* free_rec = find(recs, GpuActivityKind::kFree);
  ASSERT_NE(free_rec, nullptr);
  EXPECT_EQ(free_rec->address, malloc_rec->address);
  EXPECT_GE(free_rec->start_ns, malloc_rec->start_ns);

  const GpuActivity* h2d = find(recs, GpuActivityKind::kMemcpy, "HtoD");
  const GpuActivity* d2h = find(recs, GpuActivityKind::kMemcpy, "DtoH");
  ASSERT_NE(h2d, nullptr);
  ASSERT_NE(d2h, nullptr);
  EXPECT_EQ(h2d->bytes, kBytes);
  EXPECT_EQ(d2h->bytes, kBytes);
  EXPECT_LT(h2d->start_ns, d2h->start_ns);
  const GpuActivity* set = find(recs, GpuActivityKind::kMemset);
  ASSERT_NE(set, nullptr);
  EXPECT_EQ(set->bytes, kBytes);
  const GpuActivity* k = find(recs, GpuActivityKind::kKernel, "memfit_test_iota");
  ASSERT_NE(k, nullptr) << "no kernel record";
  EXPECT_GT(k->end_ns, k->start_ns);
  EXPECT_GT(k->start_ns, set->start_ns);
  EXPECT_LT(k->end_ns, d2h->end_ns);
  const GpuActivity* m = find(recs, GpuActivityKind::kMarker, "cupti_test_range");
  ASSERT_NE(m, nullptr) << "no NVTX range record (NVTX_INJECTION64_PATH="
                        << (std::getenv("NVTX_INJECTION64_PATH")
                                ? std::getenv("NVTX_INJECTION64_PATH")
                                : "unset")
                        << ")";
  EXPECT_LE(m->start_ns, k->start_ns + slack);
  EXPECT_GE(m->end_ns, m->start_ns);
  testing::print_figure("cupti records in the tracer test", std::to_string(recs.size()));

  EXPECT_TRUE(tracer.take().empty());  // taken once
}

TEST(CuptiTracer, OneTracerRunsAtATime) {
  MEMFIT_REQUIRE_GPU();
  CuptiTracer a, b;
  a.start();
  EXPECT_THROW(b.start(), InvalidArgument);
  EXPECT_THROW(a.start(), InvalidArgument);
  a.stop();
  a.stop();  // twice is fine
  b.start();
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  b.stop();
  EXPECT_NE(find(b.take(), GpuActivityKind::kMalloc), nullptr);
}

TEST(CuptiTracer, AvailableSaysWhyNot) {
  std::string why = "unchanged";
  const bool ok = CuptiTracer::available(&why);
  if (ok) {
    EXPECT_TRUE(why.empty());
  } else {
    EXPECT_FALSE(why.empty());
    std::printf("CuptiTracer::available: false: %s\n", why.c_str());
  }
}

}  // namespace
}  // namespace memfit
