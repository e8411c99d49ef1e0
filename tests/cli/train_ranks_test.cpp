// `mpirun -np 2 memfit train --ranks 2 --zero 0|1|2` (and ZeRO-2 with optimizer offload): the
// losses match one process training the same global batches within 1e-6 relative; rank 0
// prints one report, with every rank's peak equal to its own dry run's; ZeRO-1/2 save a state
// file per rank and resume from them bit for bit; a failing or killed rank ends every rank; a
// launch that does not match --ranks, a bad --zero and a state file of another ZeRO stage are
// refused by name. Skipped, saying why, in a build without MPI (CI has it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/cli/cli_testutil.h"

namespace {

using namespace memfit::clitest;  // NOLINT: test helpers

std::string tmp(const std::string& name) {
  return testing::TempDir() + "train_ranks_" + std::to_string(::getpid()) + "_" + name;
}

const std::string kCorpus = std::string(MEMFIT_TEST_SOURCE_DIR) + "/data/corpus.txt";

// A byte-level GPT small enough for a test: 2 blocks of width 32, windows of 32 bytes.
std::string model_file() {
  static const std::string path = [] {
    const std::string p = tmp("model.yaml");
    std::ofstream(p) << "model:\n  kind: gpt\n  name: ranks-micro\n  vocab: 256\n  seq_len: 32\n"
                        "  layers: 2\n  hidden: 32\n  heads: 4\n  mlp_ratio: 4\n"
                        "  tied_head: true\n";
    return p;
  }();
  return path;
}

std::string args(int steps, const std::string& more) {
  return "train --model " + model_file() + " --data " + kCorpus + " --steps " +
         std::to_string(steps) + " --batch 4 --lr 3e-3 " + more;
}

std::vector<double> losses(const std::string& summary) {
  std::ifstream f(summary);
  EXPECT_TRUE(f.good()) << "no summary at " << summary;
  if (!f.good()) return {};
  return nlohmann::json::parse(f).at("losses").get<std::vector<double>>();
}

class TrainRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpi_available()) GTEST_SKIP() << "this build has no MPI (MEMFIT_MPI found no OpenMPI)";
  }
};

TEST_F(TrainRanks, TwoRanksMatchOneUnderEveryZeroStage) {
  const std::string one = tmp("one.json");
  ProgramRun r = run_memfit(args(4, "--summary-json " + one));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> want = losses(one);
  ASSERT_EQ(want.size(), 4u);
  for (int zero : {0, 1, 2}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(zero));
    const std::string js = tmp("z" + std::to_string(zero) + ".json");
    r = run_memfit_ranks(2, args(4, "--ranks 2 --zero " + std::to_string(zero) +
                                        " --predict --summary-json " + js));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // One report: rank 0's, with both ranks' peaks, each its dry run's.
    EXPECT_EQ(r.output.find("step 4/4", r.output.find("step 4/4") + 1), std::string::npos)
        << "more than one rank printed progress:\n" << r.output;
    EXPECT_TRUE(contains(r.output, "2 ranks (mpirun), ZeRO-" + std::to_string(zero))) << r.output;
    for (const char* rank : {"\n    rank 0 ", "\n    rank 1 "}) {  // the table's rows
      const std::size_t at = r.output.find(rank);
      ASSERT_NE(at, std::string::npos) << r.output;
      const std::string line = r.output.substr(at + 1, r.output.find('\n', at + 1) - at - 1);
      EXPECT_TRUE(contains(line, "exact")) << line;
    }
    const std::vector<double> got = losses(js);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t s = 0; s < want.size(); ++s) {
      EXPECT_NEAR(got[s], want[s], 1e-6 * std::abs(want[s])) << "step " << s + 1;
    }
    std::filesystem::remove(js);
  }
  std::filesystem::remove(one);
}

// The gradient sums overlap the backward by default; --no-overlap finishes each stage's before
// the next. The sums are the same in the same order, so the losses are the same bits, and
// each run's per-rank peak is its own dry run's (they differ: overlap holds gradients longer).
TEST_F(TrainRanks, NoOverlapChangesNoBitsAndIsPredictedToo) {
  std::vector<double> got[2];
  for (int off = 0; off < 2; ++off) {
    SCOPED_TRACE(off ? "--no-overlap" : "overlapped");
    const std::string js = tmp(off ? "no_overlap.json" : "overlap.json");
    const ProgramRun r = run_memfit_ranks(
        2, args(3, std::string("--ranks 2 --zero 2 --predict ") + (off ? "--no-overlap " : "") +
                       "--summary-json " + js));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const char* rank : {"\n    rank 0 ", "\n    rank 1 "}) {
      const std::size_t at = r.output.find(rank);
      ASSERT_NE(at, std::string::npos) << r.output;
      const std::string line = r.output.substr(at + 1, r.output.find('\n', at + 1) - at - 1);
      EXPECT_TRUE(contains(line, "exact")) << line;
    }
    got[off] = losses(js);
    std::filesystem::remove(js);
  }
  ASSERT_EQ(got[0].size(), 3u);
  EXPECT_EQ(got[0], got[1]);
}

// The command: ZeRO-2 with optimizer offload (each rank's chunks of the masters and
// moments in its pinned host memory, the CPU AdamW on them) matches one process without it.
TEST_F(TrainRanks, ZeroTwoWithOffloadMatchesOneRank) {
  const std::string one = tmp("one_offload.json"), two = tmp("two_offload.json");
  ProgramRun r = run_memfit(args(4, "--summary-json " + one));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_memfit_ranks(2, args(4, "--ranks 2 --zero 2 --offload --predict --summary-json " + two));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "zero2-offload-adamw")) << r.output;
  EXPECT_TRUE(contains(r.output, "(pinned host)")) << r.output;
  const std::vector<double> want = losses(one), got = losses(two);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t s = 0; s < want.size(); ++s) {
    EXPECT_NEAR(got[s], want[s], 1e-6 * std::abs(want[s])) << "step " << s + 1;
  }
  std::filesystem::remove(one);
  std::filesystem::remove(two);
}

TEST_F(TrainRanks, ZeroTwoSavesAFilePerRankAndResumesBitForBit) {
  const std::string full = tmp("full.json"), part = tmp("part.json"), rest = tmp("rest.json");
  const std::string state = tmp("run.mfstate");
  ProgramRun r = run_memfit_ranks(2, args(4, "--ranks 2 --zero 2 --summary-json " + full));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_memfit_ranks(2, args(2, "--ranks 2 --zero 2 --save " + state + " --summary-json " + part));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(state + ".rank0of2"));
  EXPECT_TRUE(std::filesystem::exists(state + ".rank1of2"));
  EXPECT_FALSE(std::filesystem::exists(state)) << "ZeRO-2 ranks save their own files only";
  r = run_memfit_ranks(2, args(2, "--ranks 2 --zero 2 --resume " + state + " --summary-json " + rest));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<double> joined = losses(part);
  for (double l : losses(rest)) joined.push_back(l);
  EXPECT_EQ(joined, losses(full)) << "a resumed run must repeat the uninterrupted one's bits";
  // A set mixed from two saves (rank 1's file from a 1-step save) is refused by every rank.
  const std::string other = tmp("other.mfstate");
  r = run_memfit_ranks(2, args(1, "--ranks 2 --zero 2 --save " + other));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string mixed = tmp("mixed.mfstate");
  std::filesystem::copy_file(state + ".rank0of2", mixed + ".rank0of2");
  std::filesystem::copy_file(other + ".rank1of2", mixed + ".rank1of2");
  r = run_memfit_ranks(2, args(1, "--ranks 2 --zero 2 --resume " + mixed));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "from different saves (steps by rank: 2, 1)")) << r.output;
  for (const std::string& f : {other, mixed}) {
    std::filesystem::remove(f + ".rank0of2");
    std::filesystem::remove(f + ".rank1of2");
  }
  // Another stage's files are refused, naming both.
  r = run_memfit_ranks(2, args(1, "--ranks 2 --zero 1 --resume " + state));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "saved by ZeRO-2 rank 0 of 2")) << r.output;
  for (const std::string& f : {full, part, rest, state + ".rank0of2", state + ".rank1of2"}) {
    std::filesystem::remove(f);
  }
}

// Rank 0's budget cannot hold the model while rank 1's can: rank 1 goes on into its first
// collective. Rank 0's error must name it and the cause, and end rank 1 too, in bounded time.
TEST_F(TrainRanks, ARankThatFailsStopsEveryRankNamingItself) {
  const std::string state = tmp("kept.mfstate");
  ProgramRun r = run_memfit(args(1, "--save " + state));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string before = read_file(state);
  // --dtype: a policy, so --budget limits this run instead of planning one.
  const std::string run = args(200, "--ranks 2 --dtype f32 --save " + state);
  const auto t0 = std::chrono::steady_clock::now();
  // `timeout`: a hang fails the test instead of the suite's own limit.
  r = run_memfit_mpmd({run + " --budget 2MiB", run}, "timeout 120 ");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the ranks did not stop within 120 s:\n" << r.output;
  EXPECT_LT(seconds, 60.0);
  EXPECT_TRUE(contains(r.output, "memfit: rank 0 of 2: error: --budget 2MiB")) << r.output;
  EXPECT_TRUE(contains(r.output, "too small")) << r.output;
  EXPECT_EQ(read_file(state), before) << "the saved state changed";
  std::filesystem::remove(state);
}

// A rank killed outright (SIGKILL: the OOM killer's way) ends the launch, naming the rank:
// mpirun notices, and the surviving rank does not wait in its collective.
TEST_F(TrainRanks, ARankThatDiesEndsTheLaunch) {
  const std::string log = tmp("killed.log"), rc = tmp("killed.rc");
  const std::string marker = tmp("marker.json");  // names this launch's processes
  const std::string cmd = memfit_ranks_command(2, args(100000, "--ranks 2 --summary-json " + marker));
  const std::string script =
      "(timeout 120 " + cmd + " > " + log + " 2>&1; echo $? > " + rc + ") & " +
      // Once step 2 is done on rank 0, kill rank 1's process (not mpirun: its command line
      // starts with mpirun's path).
      "for i in $(seq 600); do grep -q 'step *2/' " + log + " 2>/dev/null && break; sleep 0.1; done; " +
      "pids=$(pgrep -f '^" + memfit_binary() + " train .*" + marker + "'); " +
      "kill -9 $(echo $pids | tr ' ' '\\n' | sort -n | tail -1); wait\n";
  const std::string file = tmp("kill.sh");
  std::ofstream(file) << script;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(std::system(("bash " + file).c_str()), 0);
  std::filesystem::remove(file);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string out = read_file(log);
  EXPECT_TRUE(contains(read_file(rc), "137")) << "exit status " << read_file(rc) << out;
  EXPECT_TRUE(contains(out, "exited on signal 9")) << out;
  EXPECT_LT(seconds, 60.0) << out;
  EXPECT_FALSE(std::filesystem::exists(marker)) << "a killed run wrote its summary";
  for (const std::string& f : {log, rc}) std::filesystem::remove(f);
}

TEST_F(TrainRanks, ALaunchThatDoesNotMatchRanksIsRefused) {
  ProgramRun r = run_memfit(args(1, "--ranks 2"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "mpirun -np 2")) << r.output;
  r = run_memfit_ranks(2, args(1, "--ranks 3"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--ranks says 3 ranks, but this run is 2 processes")) << r.output;
  r = run_memfit(args(1, "--zero 3"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--zero 3")) << r.output;
  r = run_memfit_ranks(2, args(1, "--ranks 2 --batch 3"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "multiple of 2")) << r.output;
}

}  // namespace
