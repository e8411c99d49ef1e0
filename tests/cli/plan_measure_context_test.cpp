// `memfit plan --measure-context`: with a CUDA device the measured context replaces the device
// file's figure (the table says both); without one (a CPU build, or no usable GPU) it is a
// usage error naming why and the figure that would be used, and nothing is written.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "tests/cli/cli_testutil.h"

namespace memfit::clitest {
namespace {

TEST(PlanMeasureContext, MeasuresWithADeviceOrExplainsWhyNot) {
  const std::string out = ::testing::TempDir() + "plan_measure_context.yaml";
  std::ofstream(out) << "sentinel\n";
  const ProgramRun r =
      run_memfit("plan --model gpt2 --device h100-80g --measure-context --out " + out);
  if (r.exit_code == 0) {  // a CUDA build on a machine with a GPU
    EXPECT_TRUE(contains(r.output, "context measured on this GPU: ")) << r.output;
    EXPECT_TRUE(contains(r.output, "h100-80g's file says 800.00 MiB")) << r.output;
    EXPECT_NE(read_file(out), "sentinel\n");
  } else {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "memfit: error: --measure-context needs a CUDA device"))
        << r.output;
    // Why (the build or the runtime's reason) and what is used without it.
    EXPECT_TRUE(contains(r.output, "built without the CUDA backend") ||
                contains(r.output, "no usable CUDA device"))
        << r.output;
    EXPECT_TRUE(contains(r.output, "for h100-80g")) << r.output;
    EXPECT_EQ(read_file(out), "sentinel\n");
  }
  std::remove(out.c_str());
}

}  // namespace
}  // namespace memfit::clitest
