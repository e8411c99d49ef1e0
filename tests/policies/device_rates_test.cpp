// DeviceRates (policies/device_rates.h) on the CPU backend, at small sizes: every figure is
// positive and finite, a mid-size GEMM's rate is in a sane range, host_link is the slower
// direction; apply_measured replaces exactly the five rates and the result (and a measured
// device file, comments and all) round-trips through the YAML reader; bad options, a backend
// with nothing to time and an allocator of the wrong memory are InvalidArgument (the first two
// naming what and what is valid). The GPU half (default sizes, CudaBackend, the CLI) is
// tests/gpu/device_rates_gpu_test.cpp.
#include "policies/device_rates.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/meta/meta_backend.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "memory/pinned_host_provider.h"

namespace memfit {
namespace {

// The CPU backend with its "device" (host) memory and pinned host memory, as on a GPU.
// Members are destroyed allocators first, then providers, then the backend.
struct CpuRig {
  CpuBackend be;
  HostProvider device_mem;
  PinnedHostProvider pinned;
  CachingAllocator device{device_mem, {}, &be.stream_sync()};
  CachingAllocator host{pinned, {}, &be.stream_sync()};
};

DeviceRatesOptions small() {
  DeviceRatesOptions o;
  o.gemm_size = 64;
  o.gemm_size_f32 = 64;
  o.copy_bytes = 1 << 20;
  o.reps = 3;
  o.warmup = 1;
  return o;
}

bool sane(double v) { return std::isfinite(v) && v > 0; }

// The InvalidArgument message of measuring with `o`, or "" when it measures.
std::string error_of(const DeviceRatesOptions& o) {
  CpuRig rig;
  try {
    measure_device_rates(rig.be, rig.device, rig.host, o);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceRates, EveryFigureIsPositiveAndFiniteOnTheCpuBackend) {
  CpuRig rig;
  const MeasuredRates r = measure_device_rates(rig.be, rig.device, rig.host, small());
  EXPECT_TRUE(sane(r.flops_f32)) << r.flops_f32;
  EXPECT_TRUE(sane(r.flops_f16)) << r.flops_f16;
  EXPECT_TRUE(sane(r.flops_bf16)) << r.flops_bf16;
  EXPECT_TRUE(sane(r.mem_bandwidth)) << r.mem_bandwidth;
  EXPECT_TRUE(sane(r.host_to_device)) << r.host_to_device;
  EXPECT_TRUE(sane(r.device_to_host)) << r.device_to_host;
  EXPECT_TRUE(sane(r.seconds)) << r.seconds;
  EXPECT_EQ(r.host_link, std::min(r.host_to_device, r.device_to_host));
  // Everything went back to the allocators (their caches).
  EXPECT_EQ(rig.device.stats().allocated_bytes[kStatAll].current, 0);
  EXPECT_EQ(rig.host.stats().allocated_bytes[kStatAll].current, 0);
}

TEST(DeviceRates, ALargerGemmRateIsNotAbsurd) {
  CpuRig rig;
  DeviceRatesOptions o = small();
  o.gemm_size = 256;  // 33.5 MFLOP a call
  o.gemm_size_f32 = 256;
  const MeasuredRates r = measure_device_rates(rig.be, rig.device, rig.host, o);
  for (double f : {r.flops_f32, r.flops_f16, r.flops_bf16}) {
    EXPECT_GT(f, 1e6);   // a 2-core machine under load does several GFLOP/s
    EXPECT_LT(f, 1e15);  // no CPU does a PFLOP/s
  }
  EXPECT_GT(r.mem_bandwidth, 1e6);
  EXPECT_LT(r.mem_bandwidth, 1e14);
}

TEST(DeviceRates, ApplyMeasuredReplacesExactlyTheFiveRatesAndRoundTrips) {
  const DeviceSpec before = DeviceSpec::preset("h100-80g");
  MeasuredRates r;
  r.flops_f32 = 51.25e12;
  r.flops_f16 = 701.5e12;
  r.flops_bf16 = 702.5e12;
  r.mem_bandwidth = 2.875e12;
  r.host_to_device = 53e9;
  r.device_to_host = 51.5e9;
  r.host_link = 51.5e9;
  const DeviceSpec d = apply_measured(before, r);
  EXPECT_EQ(d.flops_f32, r.flops_f32);
  EXPECT_EQ(d.flops_f16, r.flops_f16);
  EXPECT_EQ(d.flops_bf16, r.flops_bf16);
  EXPECT_EQ(d.mem_bandwidth, r.mem_bandwidth);
  EXPECT_EQ(d.host_link, r.host_link);
  // Everything else as it was.
  EXPECT_EQ(d.name, before.name);
  EXPECT_EQ(d.kind, before.kind);
  EXPECT_EQ(d.memory_bytes, before.memory_bytes);
  EXPECT_EQ(d.context_bytes, before.context_bytes);
  EXPECT_EQ(d.rank_link, before.rank_link);
  EXPECT_EQ(d.cpu_adamw, before.cpu_adamw);

  const DeviceSpec back = DeviceSpec::from_yaml_string(d.to_yaml(), "measured.yaml");
  EXPECT_EQ(back.name, d.name);
  EXPECT_EQ(back.kind, d.kind);
  EXPECT_EQ(back.memory_bytes, d.memory_bytes);
  EXPECT_EQ(back.context_bytes, d.context_bytes);
  EXPECT_EQ(back.flops_f32, d.flops_f32);
  EXPECT_EQ(back.flops_f16, d.flops_f16);
  EXPECT_EQ(back.flops_bf16, d.flops_bf16);
  EXPECT_EQ(back.mem_bandwidth, d.mem_bandwidth);
  EXPECT_EQ(back.host_link, d.host_link);
  EXPECT_EQ(back.rank_link, d.rank_link);
}

TEST(DeviceRates, CpuMeasuredRatesApplyAndRoundTrip) {
  CpuRig rig;
  const MeasuredRates r = measure_device_rates(rig.be, rig.device, rig.host, small());
  const DeviceSpec d = apply_measured(DeviceSpec::preset("cpu"), r);
  const DeviceSpec back = DeviceSpec::from_yaml_string(d.to_yaml(), "cpu-measured.yaml");
  EXPECT_EQ(back.flops_bf16, r.flops_bf16);
  EXPECT_EQ(back.mem_bandwidth, r.mem_bandwidth);
  EXPECT_EQ(back.host_link, r.host_link);
}

TEST(DeviceRates, TheMeasuredFileListsEachFigureBesideTheFilesAndLoads) {
  MeasuredDevice m;
  m.file = DeviceSpec::preset("h100-80g");
  m.rates.flops_f32 = 50e12;
  m.rates.flops_f16 = 700e12;
  m.rates.flops_bf16 = 710e12;
  m.rates.mem_bandwidth = 2.9e12;
  m.rates.host_to_device = 53e9;
  m.rates.device_to_host = 51e9;
  m.rates.host_link = 51e9;
  m.rates.seconds = 1.25;
  m.measured = apply_measured(m.file, m.rates);
  m.measured.context_bytes = std::size_t{612} << 20;
  m.measured.name = "h100-80g\nsecond line";  // a name's line break must not break the comments

  const std::vector<MeasuredFigure> f = m.figures();
  ASSERT_EQ(f.size(), 6u);
  EXPECT_EQ(f[0].key, "flops_f32");
  EXPECT_DOUBLE_EQ(f[0].ratio(), 50e12 / 67e12);
  EXPECT_EQ(f[4].key, "host_link");
  EXPECT_DOUBLE_EQ(f[4].ratio(), 51e9 / 50e9);
  EXPECT_EQ(f[5].key, "context");
  EXPECT_TRUE(f[5].bytes);
  EXPECT_DOUBLE_EQ(f[5].ratio(), 612.0 / 800.0);

  m.file.name = m.measured.name;
  const std::string text = m.to_yaml();
  EXPECT_NE(text.find("# h100-80g second line measured"), std::string::npos) << text;
  EXPECT_NE(text.find("#   flops_bf16     7.1e+14      9.895e+14    0.72"), std::string::npos)
      << text;
  const DeviceSpec back = DeviceSpec::from_yaml_string(text, "h100-80g-measured.yaml");
  EXPECT_EQ(back.name, m.measured.name);
  EXPECT_EQ(back.flops_bf16, 710e12);
  EXPECT_EQ(back.host_link, 51e9);
  EXPECT_EQ(back.context_bytes, std::size_t{612} << 20);
  EXPECT_EQ(back.memory_bytes, m.file.memory_bytes);
  EXPECT_EQ(back.rank_link, m.file.rank_link);
}

TEST(DeviceRates, ApplyMeasuredRefusesWhatADeviceFileCannotHold) {
  MeasuredRates r;
  r.flops_f32 = r.flops_f16 = r.flops_bf16 = 1e12;
  r.mem_bandwidth = r.host_link = 1e10;
  for (double bad : {0.0, -1.0, 0.5, 1e22, std::nan(""), HUGE_VAL}) {
    MeasuredRates x = r;
    x.mem_bandwidth = bad;
    try {
      apply_measured(DeviceSpec::preset("h100-80g"), x);
      ADD_FAILURE() << bad << " was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("mem_bandwidth"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("valid: 1 to 1e21"), std::string::npos) << e.what();
    }
  }
}

TEST(DeviceRates, BadOptionsNameTheOptionAndWhatIsValid) {
  const auto expect = [](DeviceRatesOptions o, const std::string& want) {
    const std::string e = error_of(o);
    EXPECT_NE(e.find(want), std::string::npos) << "want '" << want << "' in: " << e;
    EXPECT_NE(e.find("valid: "), std::string::npos) << e;
  };
  DeviceRatesOptions o = small();
  o.gemm_size = 0;
  expect(o, "gemm_size 0");
  o = small();
  o.gemm_size = -8;
  expect(o, "gemm_size -8");
  o = small();
  o.gemm_size_f32 = 0;
  expect(o, "gemm_size_f32 0");
  o = small();
  o.copy_bytes = 0;
  expect(o, "copy_bytes 0");
  o = small();
  o.copy_bytes = -4096;
  expect(o, "copy_bytes -4096");
  o = small();
  o.copy_bytes = 1023;
  expect(o, "copy_bytes 1023");
  o = small();
  o.reps = 0;
  expect(o, "reps 0");
  o = small();
  o.warmup = -1;
  expect(o, "warmup -1");
}

TEST(DeviceRates, AMetaBackendHasNothingToTime) {
  MetaBackend meta;
  NullProvider null;
  CachingAllocator device(null, {}, &meta.stream_sync());
  CachingAllocator host(null, {}, &meta.stream_sync());
  try {
    measure_device_rates(meta, device, host, small());
    FAIL() << "a meta backend was timed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("backend meta"), std::string::npos) << e.what();
  }
}

TEST(DeviceRates, AnAllocatorThatDoesNotServeTheDeviceIsRefused) {
  CpuBackend be;
  NullProvider null;  // addresses for a dry run: nothing a CPU backend may touch
  PinnedHostProvider pinned;
  CachingAllocator device(null, {}, &be.stream_sync());
  CachingAllocator host(pinned, {}, &be.stream_sync());
  EXPECT_THROW(measure_device_rates(be, device, host, small()), InvalidArgument);
  CachingAllocator null_host(null, {}, &be.stream_sync());
  HostProvider mem;
  CachingAllocator real(mem, {}, &be.stream_sync());
  EXPECT_THROW(measure_device_rates(be, real, null_host, small()), InvalidArgument);
}

TEST(DeviceRates, MeasuringAGpuNeedsACudaDeviceSpec) {
  try {
    measure_cuda_device(DeviceSpec::preset("cpu"), small());
    FAIL() << "a kind-cpu device was measured as a GPU";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("valid: a kind-cuda device"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace memfit
