// `memfit demo` end to end: runs the built program and checks its report and its errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli/cli_testutil.h"

namespace {

using namespace memfit::clitest;  // NOLINT: test helpers

TEST(DemoCommand, ReportIsConsistentWithWhatItPrinted) {
  const std::string report = testing::TempDir() + "memfit_demo_test.json";
  const ProgramRun r = run_memfit("demo --micro-batch 2 --steps 3 --budget 6GiB --out " + report);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(report);
  ASSERT_TRUE(f.good()) << "no report at " << report;
  const nlohmann::json j = nlohmann::json::parse(f);
  const auto live = j.at("peak_live_bytes").get<std::uint64_t>();
  const auto allocated = j.at("peak_allocated_bytes").get<std::uint64_t>();
  const auto reserved = j.at("peak_reserved_bytes").get<std::uint64_t>();
  EXPECT_GT(live, 0u);
  EXPECT_LE(live, allocated);
  EXPECT_LE(allocated, reserved);
  EXPECT_NEAR(j.at("reserved_over_live").get<double>(), double(reserved) / double(live), 1e-9);
  EXPECT_EQ(j.at("allocator_stats").at("reserved_bytes.all.peak").get<std::uint64_t>(), reserved);
  // 6 GiB holds gpt2 at some micro-batch, and the answer is below what 24 GiB would hold.
  const auto max_b = j.at("max_micro_batch_under_budget").get<std::int64_t>();
  EXPECT_GE(max_b, 1);
  EXPECT_NE(r.output.find("largest micro-batch that fits is " + std::to_string(max_b)),
            std::string::npos)
      << r.output;
  std::remove(report.c_str());
}

TEST(DemoCommand, BudgetTooSmallSaysWhatWouldFit) {
  const ProgramRun r = run_memfit("demo --budget 1GiB --out ''");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("too small"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MiB or more"), std::string::npos) << r.output;
}

TEST(DemoCommand, BadInputNamesTheOption) {
  ProgramRun r = run_memfit("demo --alloc-conf max_split_size_mb:0 --out ''");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("max_split_size_mb"), std::string::npos) << r.output;
  r = run_memfit("demo --model gpt5 --out ''");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("gpt2-medium"), std::string::npos) << r.output;
  r = run_memfit("demo --budget 12XB --out ''");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("12XB"), std::string::npos) << r.output;
}

}  // namespace
