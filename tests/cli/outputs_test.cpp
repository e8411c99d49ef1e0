// cli/outputs.h: targets claimed before work, and an output that fails at the end written to
// the temp directory instead, with every failure listed.
#include "cli/outputs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "memory/error.h"

namespace memfit::cli {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("memfit_outputs_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string error_of(const std::vector<Output>& outs) {
  try {
    (void)claim_outputs(outs);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Outputs, ClaimChecksEveryTargetAndLocksIt) {
  const fs::path d = scratch("claim");
  const std::string save = (d / "a.mfstate").string();
  {
    const std::vector<OutputLock> held =
        claim_outputs({{"--save", save}, {"--report", (d / "r").string(), true}, {"--x", ""}});
    EXPECT_EQ(held.size(), 2u);              // the empty one is "not given"
    EXPECT_TRUE(fs::is_directory(d / "r"));  // created
    EXPECT_TRUE(fs::exists(save + ".lock"));
    // Another claim of either target refuses, naming the flag, the path and what to do.
    const std::string e = error_of({{"--save", save}});
    EXPECT_NE(e.find("--save '" + save + "' is being written by another process"),
              std::string::npos)
        << e;
    EXPECT_NE(error_of({{"--out", (d / "r").string(), true}}).find("another process"),
              std::string::npos);
  }
  EXPECT_FALSE(fs::exists(save + ".lock"));  // released and removed
  EXPECT_EQ(error_of({{"--save", save}}), "");

  // One file for two outputs is refused by name (the second lock would blame "another process").
  EXPECT_NE(error_of({{"--save", save}, {"--summary-json", save}})
                .find("--save and --summary-json both name"),
            std::string::npos);
  // Bad targets, each named with why.
  EXPECT_NE(error_of({{"--save", d.string()}}).find("is a directory"), std::string::npos);
  EXPECT_NE(error_of({{"--save", (d / "no/such/dir/x").string()}}).find("does not exist"),
            std::string::npos);
  EXPECT_NE(error_of({{"--summary-json", "/dev/null"}}).find("not a regular file"),
            std::string::npos);
  EXPECT_NE(error_of({{"--report", "/dev/null/r", true}}).find("/dev/null/r"), std::string::npos);
  fs::remove_all(d);
}

TEST(Outputs, AFailedWriteGoesToTheTempDirectoryAndIsListed) {
  const fs::path d = scratch("rescue");
  const fs::path tmp = scratch("rescue_tmp");
  ::setenv("TMPDIR", tmp.c_str(), 1);
  const std::string target = (d / "state.bin").string();
  std::vector<std::string> written, failed;
  auto write = [&](const std::string& path) {
    if (path == target) throw IoError("cannot write '" + path + "': No space left on device");
    std::ofstream(path) << "state";
    written.push_back(path);
  };
  write_or_rescue("--save", target, false, write, failed);
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(fs::path(written[0]).parent_path(), tmp);
  EXPECT_NE(written[0].find("memfit-rescue-"), std::string::npos);
  EXPECT_NE(written[0].find("state.bin"), std::string::npos);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].find("No space left"), std::string::npos) << failed[0];
  EXPECT_NE(failed[0].find("saved to '" + written[0] + "' instead"), std::string::npos);

  // A write that succeeds adds nothing; one whose rescue fails too says it was not saved.
  write_or_rescue("--summary-json", (d / "ok.json").string(), false, write, failed);
  EXPECT_EQ(failed.size(), 1u);
  write_or_rescue(
      "--save", target, false,
      [&](const std::string& p) { throw IoError("cannot write '" + p + "'"); }, failed);
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_NE(failed[1].find("not saved"), std::string::npos) << failed[1];

  // finish_outputs: nothing failed, nothing thrown; else one IoError listing each.
  EXPECT_NO_THROW(finish_outputs({}));
  try {
    finish_outputs(failed);
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(failed[0]), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(failed[1]), std::string::npos);
  }
  ::unsetenv("TMPDIR");
  fs::remove_all(d);
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace memfit::cli
