// DeviceRates (policies/device_rates.h) on this machine's GPU at the default sizes: prints each
// measured figure and its ratio to the h100-80g preset ("figure: ..." lines, which run.sh
// collects), and checks they are plausible for whichever datacenter GPU this is (the test does
// not know: bounds use the larger of the h100-80g and h200 presets' peaks, the smaller's for
// lower bounds). Then `memfit plan --measure` writes a device file that DeviceSpec::load reads
// back with the measured rates. Skips, saying why, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "memory/caching_allocator.h"
#include "memory/pinned_host_provider.h"
#include "policies/device_rates.h"
#include "policies/device_spec.h"
#include "policies/runtime_env.h"
#include "tests/cli/cli_testutil.h"
#include "tests/gpu/gpu_testutil.h"

namespace memfit {
namespace {

std::string with_ratio(double measured, double preset) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.4g (%.2fx h100-80g's %.4g)", measured, measured / preset,
                preset);
  return buf;
}

TEST(DeviceRatesGpu, DefaultSizesGivePlausibleRates) {
  MEMFIT_REQUIRE_GPU();
  const DeviceSpec h100 = DeviceSpec::preset("h100-80g");
  const DeviceSpec h200 = DeviceSpec::preset("h200");
  RuntimeEnv env = make_runtime(DeviceKind::kCuda, AllocatorConfig{});
  PinnedHostProvider pinned;
  ASSERT_EQ(pinned.mode(), PinnedHostProvider::Mode::kCudaHostAlloc);
  CachingAllocator host(pinned, {}, &env.backend->stream_sync());
  const MeasuredRates r = measure_device_rates(*env.backend, *env.alloc, host);

  testing::print_figure("measured flops_f32", with_ratio(r.flops_f32, h100.flops_f32));
  testing::print_figure("measured flops_f16", with_ratio(r.flops_f16, h100.flops_f16));
  testing::print_figure("measured flops_bf16", with_ratio(r.flops_bf16, h100.flops_bf16));
  testing::print_figure("measured mem_bandwidth", with_ratio(r.mem_bandwidth, h100.mem_bandwidth));
  testing::print_figure("measured host_link", with_ratio(r.host_link, h100.host_link));
  char secs[64];
  std::snprintf(secs, sizeof secs, "%.4g B/s host to device, %.4g B/s back; %.2f s in all",
                r.host_to_device, r.device_to_host, r.seconds);
  testing::print_figure("measured host copies", secs);

  for (double v : {r.flops_f32, r.flops_f16, r.flops_bf16, r.mem_bandwidth, r.host_link}) {
    EXPECT_GT(v, 0);
  }
  EXPECT_GT(r.flops_bf16, r.flops_f32);  // tensor cores against FP32 without TF32
  EXPECT_GT(r.flops_f16, r.flops_f32);
  // No more than 1.5x the larger preset's peak (a GEMM above the datasheet is a timing bug).
  EXPECT_LE(r.flops_f32, 1.5 * std::max(h100.flops_f32, h200.flops_f32));
  EXPECT_LE(r.flops_f16, 1.5 * std::max(h100.flops_f16, h200.flops_f16));
  EXPECT_LE(r.flops_bf16, 1.5 * std::max(h100.flops_bf16, h200.flops_bf16));
  // Read + write bytes per second: within reach of the datasheet's HBM bandwidth.
  EXPECT_GE(r.mem_bandwidth, 0.2 * std::min(h100.mem_bandwidth, h200.mem_bandwidth));
  EXPECT_LE(r.mem_bandwidth, 1.5 * std::max(h100.mem_bandwidth, h200.mem_bandwidth));
  EXPECT_GT(r.host_link, 1e9);  // any PCIe x16 link from Gen3 up moves more
  EXPECT_EQ(r.host_link, std::min(r.host_to_device, r.device_to_host));

  const DeviceSpec d = apply_measured(h100, r);
  const DeviceSpec back = DeviceSpec::from_yaml_string(d.to_yaml(), "measured.yaml");
  EXPECT_EQ(back.flops_bf16, r.flops_bf16);
  EXPECT_EQ(back.mem_bandwidth, r.mem_bandwidth);
}

TEST(DeviceRatesGpu, PlanMeasureWritesADeviceFileThatLoads) {
  MEMFIT_REQUIRE_GPU();
  const std::string out = ::testing::TempDir() + "device_rates_gpu_measured.yaml";
  std::remove(out.c_str());
  const clitest::ProgramRun r =
      clitest::run_memfit("plan --model gpt2 --device h100-80g --measure --device-out " + out);
  std::printf("%s", r.output.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(clitest::contains(r.output, "plan with --device " + out)) << r.output;
  const DeviceSpec d = DeviceSpec::load(out);
  const DeviceSpec preset = DeviceSpec::preset("h100-80g");
  EXPECT_EQ(d.name, "h100-80g");
  EXPECT_EQ(d.kind, DeviceKind::kCuda);
  EXPECT_EQ(d.memory_bytes, preset.memory_bytes);
  EXPECT_NE(d.flops_bf16, preset.flops_bf16);
  EXPECT_GT(d.flops_bf16, d.flops_f32);
  EXPECT_GT(d.context_bytes, 0u);
  // And a plan takes it as --device FILE.
  const clitest::ProgramRun again = clitest::run_memfit("plan --model gpt2 --device " + out);
  EXPECT_EQ(again.exit_code, 0) << again.output;
  std::remove(out.c_str());
}

}  // namespace
}  // namespace memfit
