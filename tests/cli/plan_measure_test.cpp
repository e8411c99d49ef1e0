// `memfit plan --measure` with a CUDA device (policies/device_rates.h): with a usable GPU it
// measures it, prints each figure beside the preset's, writes the measured device file and
// plans with it; without one (a CPU build, or no usable GPU, as on CI) it is a usage error that
// names the runtime's reason and what works instead (--device cpu --measure), and nothing is
// written. --device-out's own mistakes are refused before anything runs.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "policies/device_spec.h"
#include "policies/runtime_env.h"
#include "tests/cli/cli_testutil.h"

namespace memfit::clitest {
namespace {

TEST(PlanMeasure, ACudaDeviceIsMeasuredIntoAFileOrTheErrorSaysWhyNot) {
  const std::string out = ::testing::TempDir() + "plan_measure_h100.yaml";
  std::ofstream(out) << "sentinel\n";
  const ProgramRun r =
      run_memfit("plan --model gpt2 --device h100-80g --measure --device-out " + out);
  std::string why;
  if (cuda_runtime_available(&why)) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "measured on this GPU in ")) << r.output;
    EXPECT_TRUE(contains(r.output, "h100-80g's file")) << r.output;
    EXPECT_TRUE(contains(r.output, "plan with --device " + out)) << r.output;
    EXPECT_TRUE(contains(r.output, "the rates measured on this GPU")) << r.output;
    const DeviceSpec d = DeviceSpec::load(out);  // the file loads as a device
    EXPECT_EQ(d.name, "h100-80g");
    EXPECT_NE(d.flops_bf16, DeviceSpec::preset("h100-80g").flops_bf16);
  } else {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output,
                         "memfit: error: --measure with --device h100-80g measures "
                         "this machine's GPU, and there is none here"))
        << r.output;
    EXPECT_TRUE(contains(r.output, why)) << "the runtime's reason '" << why << "' in " << r.output;
    EXPECT_TRUE(contains(r.output, "--device cpu --measure")) << r.output;
    EXPECT_EQ(read_file(out), "sentinel\n");  // nothing written
  }
  std::remove(out.c_str());
}

TEST(PlanMeasure, DeviceOutMistakesAreRefusedBeforeAnythingRuns) {
  const std::string out = ::testing::TempDir() + "plan_measure_bad.yaml";
  std::ofstream(out) << "sentinel\n";
  struct Case {
    std::string args, want;
  };
  const Case cases[] = {
      // Without --measure, or with the CPU's (whose rates go to the cache).
      {"--device h100-80g --device-out " + out, "--device-out '" + out + "' is where --measure"},
      {"--device cpu --measure --device-out " + out, "--device cpu --measure keeps this CPU's"},
      {"--device h100-80g --measure --device-out " + out + ".json",
       "valid: a path ending in .yaml or .yml"},
      {"--device h100-80g --measure --calibrate", "--measure and --calibrate: give one"},
      // A kind-cpu device file is this machine's CPU.
      {"--device " + std::string(MEMFIT_TEST_SOURCE_DIR) + "/presets/devices/cpu.yaml --measure",
       "valid: --device cpu --measure"},
  };
  for (const Case& c : cases) {
    const ProgramRun r = run_memfit("plan --model gpt2 " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.want)) << c.args << ": want '" << c.want << "' in\n"
                                            << r.output;
  }
  EXPECT_EQ(read_file(out), "sentinel\n");
  std::remove(out.c_str());
}

}  // namespace
}  // namespace memfit::clitest
