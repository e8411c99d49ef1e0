// `memfit train` end to end: runs the built program on a small model and the bundled corpus,
// checks the JSON summary against what it printed, resume through the CLI, and the errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memory/size.h"
#include "profiler/output_lock.h"
#include "tests/cli/cli_testutil.h"

namespace {

using namespace memfit::clitest;  // NOLINT: test helpers

std::string tmp(const std::string& name) {
  return testing::TempDir() + "train_cli_" + std::to_string(::getpid()) + "_" + name;
}

const std::string kCorpus = std::string(MEMFIT_TEST_SOURCE_DIR) + "/data/corpus.txt";

// A byte-level GPT small enough for a test: 2 blocks of width 32, windows of 32 bytes.
std::string model_file() {
  static const std::string path = [] {
    const std::string p = tmp("model.yaml");
    std::ofstream(p) << "model:\n  kind: gpt\n  name: cli-micro\n  vocab: 256\n  seq_len: 32\n"
                        "  layers: 2\n  hidden: 32\n  heads: 4\n  mlp_ratio: 4\n"
                        "  tied_head: true\n";
    return p;
  }();
  return path;
}

std::string base_args(int steps) {
  return "train --model " + model_file() + " --data " + kCorpus + " --steps " +
         std::to_string(steps) + " --batch 4 --lr 3e-3";
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "no summary at " << path;
  return nlohmann::json::parse(f);
}

TEST(TrainCommand, SummaryJsonMatchesTheRunAndThePrediction) {
  const std::string js = tmp("summary.json");
  const ProgramRun r =
      run_memfit(base_args(4) + " --dtype bf16 --checkpoint all --predict --summary-json " + js);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 4/4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("predicted (dry run)"), std::string::npos) << r.output;
  const nlohmann::json j = read_json(js);
  for (const char* key : {"peak_reserved_bytes", "peak_allocated_bytes", "peak_by_category",
                          "final_loss", "tokens_per_second", "predicted_peak_reserved_bytes",
                          "predicted_peak_allocated_bytes", "losses"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  const auto reserved = j.at("peak_reserved_bytes").get<std::uint64_t>();
  const auto allocated = j.at("peak_allocated_bytes").get<std::uint64_t>();
  EXPECT_GT(allocated, 0u);
  EXPECT_LE(allocated, reserved);
  std::uint64_t by_cat_max = 0;
  for (const auto& [name, v] : j.at("peak_by_category").items()) {
    by_cat_max = std::max(by_cat_max, v.get<std::uint64_t>());
  }
  EXPECT_GT(j.at("peak_by_category").at("activation").get<std::uint64_t>(), 0u);
  EXPECT_GT(j.at("peak_by_category").at("parameter").get<std::uint64_t>(), 0u);
  EXPECT_LE(by_cat_max, allocated);
  EXPECT_EQ(j.at("losses").size(), 4u);
  EXPECT_EQ(j.at("final_loss").get<double>(), j.at("losses").back().get<double>());
  // Seconds per step, summing to the run's; no plan here, so no predicted time.
  ASSERT_EQ(j.at("step_seconds").size(), 4u);
  double sum = 0;
  for (const auto& v : j.at("step_seconds")) sum += v.get<double>();
  EXPECT_NEAR(sum, j.at("seconds").get<double>(), 1e-9 * sum + 1e-12);
  EXPECT_FALSE(j.contains("predicted_step_seconds"));
  EXPECT_TRUE(contains(r.output, "time per step ")) << r.output;
  EXPECT_TRUE(std::isfinite(j.at("final_loss").get<double>()));
  EXPECT_GT(j.at("tokens_per_second").get<double>(), 0.0);
  EXPECT_EQ(j.at("tokens").get<std::int64_t>(), 4 * 4 * 32);
  // The prediction: the same allocations, the CPU backend's GEMM scratch included (the meta
  // backend mirrors it), so the dry run's peak is the measured one.
  const auto pred = j.at("predicted_peak_allocated_bytes").get<std::uint64_t>();
  EXPECT_GT(pred, 0u);
  EXPECT_EQ(pred, allocated);
  EXPECT_EQ(j.at("predicted_peak_by_category").at("parameter"),
            j.at("peak_by_category").at("parameter"));
  EXPECT_EQ(j.at("predicted_peak_by_category").at("optimizer_state"),
            j.at("peak_by_category").at("optimizer_state"));
  std::remove(js.c_str());
}

TEST(TrainCommand, SaveThenResumeContinuesExactly) {
  const std::string state = tmp("run.mfstate");
  const std::string full = tmp("full.json"), part = tmp("part.json"), rest = tmp("rest.json");
  ASSERT_EQ(run_memfit(base_args(5) + " --offload --summary-json " + full).exit_code, 0);
  ASSERT_EQ(
      run_memfit(base_args(3) + " --offload --save " + state + " --summary-json " + part).exit_code,
      0);
  const ProgramRun r =
      run_memfit(base_args(2) + " --offload --resume " + state + " --summary-json " + rest);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed at step 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 5/5"), std::string::npos) << r.output;
  const auto jf = read_json(full), jr = read_json(rest);
  EXPECT_EQ(jr.at("start_step").get<int>(), 3);
  // JSON doubles round-trip exactly, so the losses compare bit for bit.
  ASSERT_EQ(jr.at("losses").size(), 2u);
  EXPECT_EQ(jr.at("losses")[0].get<double>(), jf.at("losses")[3].get<double>());
  EXPECT_EQ(jr.at("losses")[1].get<double>(), jf.at("losses")[4].get<double>());
  // Resuming with another dtype is refused by name.
  const ProgramRun bad = run_memfit(base_args(1) + " --offload --dtype f16 --resume " + state);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("dtype"), std::string::npos) << bad.output;
  for (const auto& p : {state, full, part, rest}) std::remove(p.c_str());
}

// --offload takes a list: with the gradients offloaded too the losses are the same bits, the
// gradients' device peak is the bucket ring's, and the dry run still predicts it to the byte.
TEST(TrainCommand, OffloadListOffloadsTheGradientsToo) {
  const std::string a = tmp("opt.json"), b = tmp("grads.json");
  const ProgramRun ra =
      run_memfit(base_args(3) + " --accum 2 --offload --predict --summary-json " + a);
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  const ProgramRun rb = run_memfit(base_args(3) +
                                   " --accum 2 --offload optimizer,gradients --predict "
                                   "--summary-json " +
                                   b);
  ASSERT_EQ(rb.exit_code, 0) << rb.output;
  const auto ja = read_json(a), jb = read_json(b);
  EXPECT_EQ(ja.at("losses"), jb.at("losses"));
  EXPECT_TRUE(jb.at("offload_gradients").get<bool>());
  EXPECT_FALSE(ja.at("offload_gradients").get<bool>());
  const auto grads = [](const nlohmann::json& j) {
    return j.at("peak_by_category").at("gradient").get<std::uint64_t>();
  };
  EXPECT_LT(grads(jb), grads(ja));
  EXPECT_EQ(jb.at("predicted_peak_allocated_bytes"), jb.at("peak_allocated_bytes"));
  const ProgramRun bad = run_memfit(base_args(1) + " --offload optimizer,wings");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("unknown switch 'wings'"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("optimizer, gradients, weights, activations, all"), std::string::npos)
      << bad.output;
  for (const auto& p : {a, b}) std::remove(p.c_str());
}

// Weight offload on the command line trains the same losses as resident weights; a host
// budget below what offload pins stops the run before it starts, naming the flag.
TEST(TrainCommand, OffloadAllTrainsTheSameAndTheHostBudgetIsChecked) {
  const std::string a = tmp("w_plain.json"), b = tmp("w_all.json");
  ASSERT_EQ(run_memfit(base_args(2) + " --dtype bf16 --summary-json " + a).exit_code, 0);
  const ProgramRun rb =
      run_memfit(base_args(2) + " --dtype bf16 --offload all --predict --summary-json " + b);
  ASSERT_EQ(rb.exit_code, 0) << rb.output;
  const auto ja = read_json(a), jb = read_json(b);
  EXPECT_EQ(ja.at("losses"), jb.at("losses"));
  EXPECT_TRUE(jb.at("offload_weights").get<bool>());
  EXPECT_FALSE(ja.at("offload_weights").get<bool>());
  const auto params = [](const nlohmann::json& j) {
    return j.at("peak_by_category").at("parameter").get<std::uint64_t>();
  };
  EXPECT_LT(params(jb), params(ja));
  EXPECT_EQ(jb.at("predicted_peak_allocated_bytes"), jb.at("peak_allocated_bytes"));
  const ProgramRun over = run_memfit(base_args(1) + " --offload all --host-budget 1024");
  EXPECT_EQ(over.exit_code, 2) << over.output;
  EXPECT_NE(over.output.find("of pinned host memory"), std::string::npos) << over.output;
  EXPECT_NE(over.output.find("over the host budget of " + memfit::format_bytes(1024)),
            std::string::npos)
      << over.output;
  EXPECT_NE(over.output.find("[--host-budget 1024]"), std::string::npos) << over.output;
  EXPECT_EQ(over.output.find("step 1"), std::string::npos) << "it trained: " << over.output;
  const ProgramRun zero = run_memfit(base_args(1) + " --offload --host-budget 0");
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_NE(zero.output.find("--host-budget 0 must be positive"), std::string::npos) << zero.output;
  for (const auto& p : {a, b}) std::remove(p.c_str());
}

// --clip-grad-norm clips on the device and, under gradient offload, on the host with the same
// bits; each step's norm is printed and in the summary.
TEST(TrainCommand, ClipGradNormClipsTheSameWithGradientsOnTheHost) {
  const std::string a = tmp("clip_dev.json"), b = tmp("clip_host.json"), c = tmp("noclip.json");
  const std::string clip = " --accum 2 --clip-grad-norm 0.05 --summary-json ";
  const ProgramRun ra = run_memfit(base_args(3) + " --offload" + clip + a);
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  EXPECT_NE(ra.output.find("(clipped)"), std::string::npos) << ra.output;
  const ProgramRun rb = run_memfit(base_args(3) + " --offload optimizer,gradients" + clip + b);
  ASSERT_EQ(rb.exit_code, 0) << rb.output;
  ASSERT_EQ(run_memfit(base_args(3) + " --offload --accum 2 --summary-json " + c).exit_code, 0);
  const auto ja = read_json(a), jb = read_json(b), jc = read_json(c);
  EXPECT_EQ(ja.at("losses"), jb.at("losses"));
  EXPECT_EQ(ja.at("grad_norms"), jb.at("grad_norms"));
  EXPECT_EQ(ja.at("clipped_steps").get<int>(), 3);
  EXPECT_EQ(jb.at("clipped_steps").get<int>(), 3);
  EXPECT_NE(ja.at("losses"), jc.at("losses"));
  EXPECT_FALSE(jc.contains("grad_norms"));
  const ProgramRun bad = run_memfit(base_args(1) + " --clip-grad-norm -1");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--clip-grad-norm"), std::string::npos) << bad.output;
  for (const auto& p : {a, b, c}) std::remove(p.c_str());
}

TEST(TrainCommand, BudgetTooSmallSaysWhatWouldFit) {
  // A policy flag given: no planning, the command line's plan is tried and explained.
  const ProgramRun r = run_memfit(base_args(1) + " --checkpoint none --budget 1MiB");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("too small"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MiB or more"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--checkpoint all"), std::string::npos) << r.output;
}

TEST(TrainCommand, BadInputIsAClearErrorWithExitCode2) {
  const std::string empty = tmp("empty.txt");
  std::ofstream(empty).flush();
  const std::string tiny = tmp("tiny.txt");
  std::ofstream(tiny) << "too short";
  struct Case {
    std::string args, expect;
  };
  const Case cases[] = {
      {base_args(0), "--steps"},
      {"train --model " + model_file() + " --data " + tmp("missing.txt") + " --steps 1",
       "missing.txt"},
      {"train --model " + model_file() + " --data " + empty + " --steps 1", "empty"},
      {"train --model " + model_file() + " --data " + tiny + " --steps 1", "33"},
      {base_args(1) + " --accum 3", "3"},  // batch 4 cannot split into 3 micro-batches
      {base_args(1) + " --checkpoint every:0", "every:K"},
      {base_args(1) + " --dtype f8", "f8"},
      {base_args(1) + " --budget 12XB", "12XB"},
      {base_args(1) + " --seq-len 64", "--seq-len"},
      {"train --model gpt5 --data " + kCorpus + " --steps 1", "gpt5"},
      {"train --model gpt-micro --data " + kCorpus + " --steps 1", "vocab"},
      {base_args(1) + " --resume " + tmp("nothing.mfstate"), "nothing.mfstate"},
      {base_args(1) + " --lr 1e308", "--lr 1e+308; valid: a learning rate in [0, 1e6]"},
      {base_args(1) + " --steps 99999999999999999999", "memfit: error: --steps"},
  };
  for (const Case& c : cases) {
    const ProgramRun r = run_memfit(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
  }
  std::remove(empty.c_str());
  std::remove(tiny.c_str());
}

// The example programs (built by the default target, as scripts/test.sh does) run and check
// themselves: custom_layer exits 1 unless checkpointing left the losses bit-identical and the
// loss fell.
ProgramRun run_example(const std::string& name, const std::string& args) {
  const char* dir = std::getenv("MEMFIT_BINARY_DIR");
  const std::string bin =
      std::string(dir ? dir : MEMFIT_TEST_BINARY_DIR) + "/examples/example_" + name;
  if (::access(bin.c_str(), X_OK) != 0) return {-1, bin + " is not built (build all targets)"};
  FILE* p = popen((bin + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(Examples, RunAndCheckThemselves) {
  ProgramRun r = run_example("custom_layer", kCorpus + " 6");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("losses identical with and without checkpointing: yes"),
            std::string::npos)
      << r.output;
  r = run_example("custom_loop", kCorpus + " 3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step   3"), std::string::npos) << r.output;
  const std::string state = tmp("train_gpt.mfstate");
  r = run_example("train_gpt", kCorpus + " 1 " + state);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_example("train_gpt", kCorpus + " 1 " + state);  // resumes from the file it wrote
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step   2"), std::string::npos) << r.output;
  std::remove(state.c_str());
}

}  // namespace
// are errors naming the flag (exit 2) before anything trains: no clamped step count, no
// wrapped seed, no "given as 0" read as "not given".
TEST(TrainCommand, OutOfRangeZeroAndEmptyFlagValuesAreErrorsNamingTheFlag) {
  struct Bad {
    const char* args;
    const char* says;
  };
  const std::string dir = tmp("resume_dir");
  std::filesystem::create_directories(dir);
  const std::string resume_dir = " --resume " + dir;
  const Bad bad[] = {
      {" --steps 99999999999999999999", "--steps: '99999999999999999999' is not an integer"},
      {" --seed -1", "--seed: '-1' is not an integer from 0"},
      {" --seed 99999999999999999999999", "--seed: '99999999999999999999999' is not an integer"},
      {" --micro-batch 0", "--micro-batch 0; valid: 1 or more"},
      {" --seq-len 0", "--seq-len 0; valid: 1 or more"},
      {" --accum 0", "--accum 0; valid: 1 or more"},
      {" --budget ''", "--budget \"\": an empty value"},
      {" --save ''", "--save \"\": an empty file name"},
      {" --summary-json ''", "--summary-json \"\": an empty file name"},
      {resume_dir.c_str(), "is a directory"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.args);
    std::string args = base_args(1);
    if (std::string(b.args).rfind(" --steps", 0) == 0) args = args.substr(0, args.find(" --steps"));
    const ProgramRun r = run_memfit(args + b.args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(b.says), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "trained: " << r.output;
  }
  std::filesystem::remove_all(dir);
}

// ---- outputs (issue 17) ----------------------------------------------------------------------

TEST(TrainCommand, ASecondRunWritingTheSameStateRefusesBeforeTraining) {
  const std::string st = tmp("locked.mfstate");
  const memfit::OutputLock held(st, "--save");  // as a run already writing it holds it
  const ProgramRun r = run_memfit(base_args(2) + " --save " + st);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--save '" + st + "' is being written by another process"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "it trained first:\n" << r.output;
  EXPECT_FALSE(std::filesystem::exists(st));
}

TEST(TrainCommand, BadTargetsAreRefusedBeforeTheFirstStep) {
  for (const std::string& flags : std::vector<std::string>{
           " --save " + testing::TempDir(), " --summary-json /dev/null",
           " --save " + tmp("missing_dir") + "/x.mfstate", " --report /dev/null/r"}) {
    const ProgramRun r = run_memfit(base_args(2) + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.output;
    EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << flags << "\n" << r.output;
  }
}

TEST(TrainCommand, AnOutputThatFailsAfterTrainingDoesNotCostTheOthers) {
  // A file-size limit the state file passes (the shell ignores SIGXFSZ, so the write fails
  // with EFBIG): the state cannot be saved anywhere, but the small summary is written and
  // the exit status and message say what was lost.
  const std::string st = tmp("big.mfstate");
  const std::string js = tmp("after_fail.json");
  const std::string cmd = "trap '' XFSZ; ulimit -f 16; " + memfit_binary() + " " + base_args(1) +
                          " --save " + st + " --summary-json " + js + " 2>&1";
  FILE* p = popen(("bash -c \"" + cmd + "\"").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_NE(out.find("step 1/1"), std::string::npos) << out;
  EXPECT_NE(out.find("not every output could be written"), std::string::npos) << out;
  EXPECT_NE(out.find("--save '" + st + "'"), std::string::npos) << out;
  EXPECT_NE(out.find("failed too"), std::string::npos) << out;  // the rescue hit the limit too
  EXPECT_FALSE(std::filesystem::exists(st));
  const nlohmann::json j = read_json(js);  // written, after the failed save
  EXPECT_EQ(j["steps"], 1);
}

TEST(TrainCommand, TextFromFilesCannotDriveTheTerminal) {
  const std::string m = tmp("escape_model.yaml");
  std::ofstream(m) << "model:\n  kind: gpt\n  name: \"evil\\e[2J\\e]0;pwned\\a\"\n  vocab: 256\n"
                      "  seq_len: 32\n  layers: 2\n  hidden: 32\n  heads: 4\n  mlp_ratio: 4\n";
  const ProgramRun r = run_memfit("train --model " + m + " --data " + kCorpus +
                                  " --steps 1 --batch 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << "a raw ESC reached the terminal";
  EXPECT_EQ(r.output.find('\a'), std::string::npos);
  EXPECT_NE(r.output.find("evil\\x1b[2J\\x1b]0;pwned\\x07"), std::string::npos) << r.output;
}

// The CPU backend with no --budget: a step larger than this machine's memory is refused after a
// dry run, before anything is allocated (it allocated until the OOM killer came), with the
// plan that fits. 8192 x 2048 tokens of a 6.7B model need far more than any machine has.
TEST(TrainCommand, AStepLargerThanThisMachineIsRefusedBeforeAllocating) {
  for (const char* cmd : {"train --data ", "profile --out "}) {
    const std::string target = std::string(cmd).find("train") != std::string::npos
                                   ? kCorpus
                                   : tmp("huge_profile");
    const ProgramRun r = run_memfit(std::string(cmd) + target +
                                    " --model gpt3-6.7b --batch 8192 --steps 1");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("on the cpu backend (a dry run of one step"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("available"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("nothing was allocated"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
  }
  // A tiny one fits and trains as before.
  const ProgramRun ok = run_memfit(base_args(1));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}
