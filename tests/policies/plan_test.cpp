// Plan: YAML and JSON round trips, what Trainer gets from it, atomic saves, and errors that
// name the file, the line and the key.
#include "policies/plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "memory/error.h"

namespace memfit {
namespace {

Plan sample_plan() {
  Plan p;
  p.model = ModelSpec::preset("gpt-tiny");
  p.model.ln_eps = 3e-6f;
  p.device = "h100-80g";
  p.budget = std::size_t{24} << 30;
  p.seq_len = 96;
  p.device_kind = DeviceKind::kCuda;
  p.policy.micro_batch = 7;
  p.accum_steps = 5;
  p.global_batch = 124;  // 4 ranks x 31, uneven: 4 x 7 + 3 per rank
  p.policy.dtype = DType::kBF16;
  p.policy.checkpoint = Checkpointing::every(2);
  p.policy.offload.optimizer = true;
  p.policy.offload.gradients = true;
  p.policy.offload.activations = true;
  p.policy.offload.delayed_update = true;
  p.ranks = 4;
  p.zero_stage = 2;
  p.overlap_comm = false;  // not the default, so a reader that drops it fails
  PeakFigures& k = p.predicted.peaks;
  k.reserved = 123456789012ull;
  k.allocated = 98765;
  k.at_peak[category_index(Category::kActivation)] = 4242;
  k.at_peak[category_index(Category::kGradient)] = 77;
  k.allocated_at_peak = 4242 + 77;
  k.category_peaks[category_index(Category::kActivation)] = 5000;
  k.category_peaks[category_index(Category::kGradient)] = 77;
  k.category_peaks[category_index(Category::kTemporary)] = 9;
  k.host_pinned = 31415926;
  k.host_at_peak[category_index(Category::kOptimizerState)] = 31415926 - 1000;
  k.host_at_peak[category_index(Category::kActivation)] = 1000;
  p.predicted.step_seconds = 0.1234567890123;
  p.predicted.tokens_per_second = 25123.5;
  p.why = "largest micro-batch: \"quoted\" and: colons";
  return p;
}

void expect_equal(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.model.to_yaml(), b.model.to_yaml());
  EXPECT_EQ(a.model.ln_eps, b.model.ln_eps);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.device_kind, b.device_kind);
  EXPECT_EQ(a.budget, b.budget);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.global_batch, b.global_batch);
  EXPECT_EQ(a.accum_steps, b.accum_steps);
  EXPECT_EQ(a.policy, b.policy);  // dtype, checkpointing, offload switches, micro-batch
  EXPECT_EQ(a.ranks, b.ranks);
  EXPECT_EQ(a.zero_stage, b.zero_stage);
  EXPECT_EQ(a.overlap_comm, b.overlap_comm);
  EXPECT_EQ(a.predicted.peaks, b.predicted.peaks);
  EXPECT_EQ(a.predicted.step_seconds, b.predicted.step_seconds);  // bit-exact: %.17g
  EXPECT_EQ(a.predicted.tokens_per_second, b.predicted.tokens_per_second);
  EXPECT_EQ(a.why, b.why);
}

TEST(Plan, YamlAndJsonRoundTripEveryField) {
  const Plan p = sample_plan();
  const std::string y = p.to_yaml();
  expect_equal(p, Plan::from_yaml_string(y));
  const std::string j = p.to_json();
  expect_equal(p, Plan::from_json_string(j));
  // The keys the CLI's consumers read.
  for (const char* k : {"activation_dtype", "checkpoint", "offload", "optimizer", "gradients",
                        "activations", "micro_batch", "accum_steps", "peak_reserved_bytes",
                        "peak_by_category", "cached_bytes_at_peak", "category_peaks",
                        "host_pinned_bytes", "device_kind", "step_seconds"}) {
    EXPECT_NE(j.find(std::string("\"") + k + "\""), std::string::npos) << k;
    EXPECT_NE(y.find(std::string(k) + ":"), std::string::npos) << k;
  }
}

// Every model preset's spec survives a plan file in both formats (its keys typed as the JSON
// writer types them: Qwen3's qk_norm a boolean, rope factors numbers).
TEST(Plan, EveryModelPresetRoundTripsInBothFormats) {
  for (const std::string& name : ModelSpec::preset_names()) {
    SCOPED_TRACE(name);
    Plan p = sample_plan();
    p.model = ModelSpec::preset(name);
    p.seq_len = std::min<std::int64_t>(p.seq_len, p.model.seq_len);
    expect_equal(p, Plan::from_yaml_string(p.to_yaml()));
    const std::string j = p.to_json();
    expect_equal(p, Plan::from_json_string(j));
    if (p.model.qk_norm) EXPECT_NE(j.find("\"qk_norm\": true"), std::string::npos) << j;
  }
}

TEST(Plan, ExplicitSchedulesRoundTripAsTheSameValue) {
  Plan p = sample_plan();
  p.ranks = 1;
  p.zero_stage = 0;
  p.global_batch = 31;
  const int n = static_cast<int>(p.model.layers);
  for (const Checkpointing& ck :
       {Checkpointing::solved(Schedule::every(n, 3)), Checkpointing::ops(Schedule::all(n)),
        Checkpointing::sqrt(), Checkpointing::none()}) {
    p.policy.checkpoint = ck;
    const std::string y = p.to_yaml();
    EXPECT_EQ(Plan::from_yaml_string(y).policy.checkpoint, ck) << y;
    EXPECT_EQ(Plan::from_json_string(p.to_json()).policy.checkpoint, ck);
    EXPECT_EQ(y.find("schedule:") != std::string::npos, ck.has_ops()) << y;
  }
  // Earlier plans: an op list in `checkpoint`, `offload: true`, a top-level delayed_update.
  const Plan old = Plan::from_yaml_string(
      "model: {kind: gpt, vocab: 64, seq_len: 16, layers: 2, hidden: 32, heads: 4}\n"
      "micro_batch: 3\nactivation_dtype: bf16\ncheckpoint: F0:input F1:all B1 R0:all B0\n"
      "offload: true\ndelayed_update: true\n");
  EXPECT_EQ(old.policy.checkpoint.kind(), Checkpointing::Kind::kOps);
  EXPECT_EQ(old.policy.checkpoint.ops_text(), "F0:input F1:all B1 R0:all B0");
  EXPECT_TRUE(old.policy.offload.optimizer);
  EXPECT_TRUE(old.policy.offload.delayed_update);
}

TEST(Plan, RunSpecGivesTheSameMicroBatchesAsThePlan) {
  Plan p = sample_plan();
  EXPECT_EQ(p.run_spec().ranks, 4);  // each process of the 4 sets its own rank
  EXPECT_EQ(p.run_spec().trainer.zero_stage, p.zero_stage);
  EXPECT_FALSE(p.run_spec().trainer.overlap_comm);
  p.ranks = 1;
  p.zero_stage = 0;
  p.global_batch = 31;
  const RunSpec r = p.run_spec();
  EXPECT_EQ(r.trainer.policy, p.policy);
  EXPECT_EQ(r.batch, 31);
  EXPECT_EQ(r.seq_len, 96);
  EXPECT_EQ(r.alloc.budget, p.budget);
  EXPECT_EQ(r.device, DeviceKind::kCuda);
  // micro_batch_split(31, 7) = {7, 7, 7, 7, 3}: accum_steps micro-batches.
  EXPECT_EQ(r.trainer.policy.micro_batches(r.batch).size(),
            static_cast<std::size_t>(p.accum_steps));
}

TEST(Plan, TheBreakdownAtThePeakMustAddUp) {
  Plan p = sample_plan();
  std::string j = p.to_json();
  const std::string key = "\"cached_bytes_at_peak\": ";
  const std::size_t at = j.find(key);
  ASSERT_NE(at, std::string::npos) << j;
  j.insert(at + key.size(), "1");  // now 1 followed by the right digits: more than reserved
  try {
    (void)Plan::from_json_string(j, "p.json");
    ADD_FAILURE() << "accepted a breakdown that does not add up";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cached_bytes_at_peak"), std::string::npos) << e.what();
  }
  // Without cached_bytes_at_peak the breakdown may not pass the reserved peak either: the
  // writer could not write such a plan back (fuzz/regressions/plan_yaml/breakdown-past-the-peak).
  std::string y = p.to_yaml();
  const std::size_t c = y.find("  cached_bytes_at_peak:");
  ASSERT_NE(c, std::string::npos) << y;
  y.erase(c, y.find('\n', c) + 1 - c);
  EXPECT_NO_THROW((void)Plan::from_yaml_string(y, "p.yaml"));
  const std::string r = "peak_reserved_bytes: ";
  const std::size_t at_r = y.find(r);
  y.replace(at_r + r.size(), y.find('\n', at_r) - at_r - r.size(), "1");
  try {
    (void)Plan::from_yaml_string(y, "p.yaml");
    ADD_FAILURE() << "accepted a breakdown past the peak:\n" << y;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.predicted.peak_by_category: its bytes add up to"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("more than peak_reserved_bytes (1)"), std::string::npos)
        << e.what();
  }
}

TEST(Plan, MissingGlobalBatchIsMicroTimesAccum) {
  const Plan p = Plan::from_yaml_string(
      "model: {kind: gpt, vocab: 64, seq_len: 16, layers: 2, hidden: 32, heads: 4}\n"
      "micro_batch: 3\naccum_steps: 4\nactivation_dtype: f16\ncheckpoint: all\n");
  EXPECT_EQ(p.global_batch, 12);
  EXPECT_EQ(p.policy.dtype, DType::kF16);
  EXPECT_FALSE(p.policy.offload.any());
}

std::string temp_dir() {
  const std::string d = std::filesystem::temp_directory_path().string() + "/memfit_plan_test_" +
                        std::to_string(::getpid());
  std::filesystem::create_directories(d);
  return d;
}

TEST(Plan, SaveIsAtomicAndLoadPicksTheFormatByExtension) {
  const std::string dir = temp_dir();
  const Plan p = sample_plan();
  for (const char* name : {"plan.yaml", "plan.yml", "plan.json"}) {
    const std::string path = dir + "/" + name;
    p.save(path);
    expect_equal(p, Plan::load(path));
    // Overwrite: no temp file is left beside it.
    Plan q = p;
    q.policy.micro_batch = 8;
    q.global_batch = 4 * 36;  // 4 ranks x (4 x 8 + 4)
    q.save(path);
    EXPECT_EQ(Plan::load(path).policy.micro_batch, 8);
  }
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 3u);
  EXPECT_THROW(p.save(dir + "/plan.txt"), InvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir + "/plan.txt"));
  // A directory that does not exist: an error and nothing written.
  EXPECT_THROW(p.save(dir + "/missing/plan.yaml"), ConfigError);
  EXPECT_THROW((void)Plan::load(dir + "/absent.yaml"), ConfigError);
  // A symlink waiting under the old predictable temporary name redirects nothing.
  const std::string victim = dir + "/victim";
  { std::ofstream(victim) << "precious"; }
  const std::string trap = dir + "/trap.yaml.tmp." + std::to_string(::getpid());
  ASSERT_EQ(::symlink(victim.c_str(), trap.c_str()), 0);
  p.save(dir + "/trap.yaml");
  std::ifstream in(victim);
  std::string got;
  std::getline(in, got);
  EXPECT_EQ(got, "precious");
  expect_equal(p, Plan::load(dir + "/trap.yaml"));
  std::filesystem::remove_all(dir);
}

void expect_error(const std::string& text, const std::string& needle, bool json = false) {
  try {
    (void)(json ? Plan::from_json_string(text, "p.json") : Plan::from_yaml_string(text, "p.yaml"));
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected: " << needle;
  }
}

const char* kModel =
    "model:\n  kind: gpt\n  vocab: 64\n  seq_len: 16\n  layers: 2\n  hidden: 32\n  heads: 4\n";

TEST(Plan, ErrorsNameTheFileTheLineAndTheKey) {
  const std::string m = kModel;  // 7 lines
  const std::string ok = "micro_batch: 2\nactivation_dtype: bf16\ncheckpoint: none\n";
  EXPECT_NO_THROW((void)Plan::from_yaml_string(m + ok));
  EXPECT_TRUE(Plan::from_yaml_string(m + ok).overlap_comm);  // an earlier plan: the default
  expect_error(m + ok + "micro_btch: 3\n", "p.yaml:11:1: plan.micro_btch: unknown key; valid:");
  expect_error(m + "micro_batch: 0\nactivation_dtype: bf16\ncheckpoint: none\n",
               "p.yaml:8:14: plan.micro_batch: 0 is out of range; valid: 1 to");
  expect_error(m + "micro_batch: 2\nactivation_dtype: f8\ncheckpoint: none\n",
               "p.yaml:9:19: plan.activation_dtype: 'f8'; valid: f32, f16, bf16");
  expect_error(m + "micro_batch: 2\nactivation_dtype: f32\ncheckpoint: every:0\n",
               "p.yaml:10:13: plan.checkpoint:");
  expect_error(m + ok + "offload: maybe\n", "p.yaml:11:10: plan.offload: 'maybe'; valid: true");
  expect_error(m + ok + "delayed_update: true\n",
               "plan.offload.delayed_update: true needs offload");
  expect_error(m + ok + "offload: {wights: true}\n",
               "p.yaml:11:11: plan.offload.wights: unknown key; valid: optimizer, gradients, "
               "weights, activations, delayed_update");
  expect_error(m + ok + "offload: {weights: true}\n",
               "p.yaml:11:20: plan.offload.weights: true needs offload.optimizer: true");
  expect_error(m + ok + "offload: {optimizer: true, weights: true, delayed_update: true}\n",
               "plan.offload.weights: true with offload.delayed_update: true; valid: one");
  expect_error(m + ok + "offload: {gradients: true}\n",
               "p.yaml:11:22: plan.offload.gradients: true needs offload.optimizer: true");
  expect_error(m + ok + "schedule: F0:all B0\n", "plan.schedule:");
  expect_error(m + ok + "seq_len: 17\n", "p.yaml:11:10: plan.seq_len: 17 exceeds the model's");
  expect_error(m + ok + "accum_steps: 3\nglobal_batch: 7\n",
               "p.yaml:12:15: plan.global_batch: 7 is not reached by 3 micro-batches of 2; "
               "valid: 5 to 6");
  // A product past int64 is an error naming it, never a wrapped global batch (UBSan found
  // micro_batch 549755813889 x accum_steps 33554432 taken as "global batch 5").
  expect_error(m + "micro_batch: 549755813889\nactivation_dtype: bf16\ncheckpoint: none\n" +
                   "accum_steps: 33554432\n",
               "p.yaml:11:14: plan.accum_steps: 33554432 micro-batches of 549755813889 on 1 ranks "
               "is more than 2^63-1 samples per step");
  expect_error(m + ok + "budget_bytes: 12 parsecs\n", "p.yaml:11:15: plan.budget_bytes:");
  expect_error(m + ok + "predicted:\n  peak_by_category:\n    weights: 3\n",
               "p.yaml:13:5: plan.predicted.peak_by_category.weights:");
  expect_error(
      m + ok + "predicted: {host_pinned_bytes: 10, host_pinned_by_category: {gradient: 9}}\n",
      "plan.predicted.host_pinned_by_category: its bytes add up to 9, not "
      "host_pinned_bytes (10)");
  expect_error(
      m + ok + "predicted:\n  category_peaks: {gradient: 18446744073709551615, activation: 2}\n",
      "plan.predicted.category_peaks.activation: 2 bytes: the map's total passes 2^64");
  expect_error(m + ok + "predicted:\n  peak_by_category: {[a, b]: 1}\n",
               "plan.predicted.peak_by_category: expected a category name as the key");
  expect_error(m + ok + "predicted: {step_seconds: -1}\n",
               "plan.predicted.step_seconds: '-1' is not a finite number >= 0");
  expect_error(m + ok + "zero_stage: 3\n", "plan.zero_stage: 3 is out of range; valid: 0 to 2");
  expect_error(m + ok + "overlap_comm: maybe\n", "plan.overlap_comm");
  // Errors inside the model map keep the plan file's line numbers.
  std::string bad_model = m;
  bad_model.replace(bad_model.find("heads: 4"), 8, "heads: 5");
  expect_error(bad_model + ok, "p.yaml:7:");
  expect_error(ok, "plan.model: missing");
  expect_error(m + ok + "why: [a, b]\n", "plan.why: expected a single value");
  expect_error("micro_batch: [1,\n", "p.yaml:2:1: malformed plan:");
  expect_error("- 1\n- 2\n", "p.yaml: a plan is one map");
  // A list or map as a key is an error at it naming the map and its keys (it was exit 3,
  // "yaml-cpp bad conversion", with no file).
  expect_error(m + ok + "? [a, b]\n: 1\n",
               "p.yaml:11:3: plan: a key that is a list; valid keys: model,");
  expect_error(m + ok + "{x: 1}: 2\n", "p.yaml:11:1: plan: a key that is a map; valid keys:");
  expect_error(m + ok + "offload: {[optimizer]: true}\n",
               "p.yaml:11:11: plan.offload: a key that is a list; valid keys: optimizer,");
  expect_error(
      m + ok + "predicted: {{a: 1}: 2}\n",
      "p.yaml:11:13: plan.predicted: a key that is a map; valid keys: peak_reserved_bytes");
}

TEST(Plan, LoadRefusesDirectoriesDevicesAndHugeFilesByName) {
  const std::string dir = testing::TempDir() + "plan_dir_" + std::to_string(::getpid()) + ".yaml";
  std::filesystem::create_directory(dir);
  const std::string zero = dir + "/zero.json";  // a plan name for /dev/zero
  std::filesystem::create_symlink("/dev/zero", zero);
  for (const auto& [path, want] : {std::pair<std::string, std::string>{dir, "is a directory"},
                                   {zero, "is a character device"}}) {
    try {
      (void)Plan::load(path);
      ADD_FAILURE() << path;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("plan file '" + path + "': " + want), std::string::npos)
          << e.what();
    }
  }
  std::filesystem::remove_all(dir);
  const std::string big = testing::TempDir() + "plan_big_" + std::to_string(::getpid()) + ".json";
  std::ofstream(big) << std::string((std::size_t{4} << 20) + 1, ' ');
  try {
    (void)Plan::load(big);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("over the limit of 4 MiB"), std::string::npos) << e.what();
  }
  std::filesystem::remove(big);
}

TEST(Plan, JsonErrorsNameTheLineAndKeyToo) {
  Plan p = sample_plan();
  std::string j = p.to_json();
  const std::string key = "\"micro_batch\": 7";
  ASSERT_NE(j.find(key), std::string::npos) << j;
  std::string bad = j;
  bad.replace(bad.find(key), key.size(), "\"micro_batch\": \"seven\"");
  const int line = 1 + static_cast<int>(std::count(j.begin(), j.begin() + j.find(key), '\n'));
  expect_error(bad, "p.json:" + std::to_string(line) + ":", true);
  expect_error(bad, "plan.micro_batch: 'seven' is not an integer", true);
  expect_error("{\"micro_batch\": 1,", "p.json: malformed JSON plan", true);
  std::string bad_heads = j;
  bad_heads.replace(bad_heads.find("\"heads\": 8"), 10, "\"heads\": 7");
  expect_error(bad_heads, "model.heads", true);
}

// A duplicate key is an error at the second one, not a silent winner; so is a second YAML
// document (yaml-cpp's Load reads the first and drops the rest).
TEST(Plan, DuplicateKeysAndSecondDocumentsAreErrors) {
  const std::string m = kModel;  // 7 lines
  const std::string ok = "micro_batch: 2\nactivation_dtype: bf16\ncheckpoint: none\n";
  expect_error(m + ok + "micro_batch: 3\n", "p.yaml:11:1: plan.micro_batch: a duplicate key");
  expect_error(m + ok + "---\n" + m + ok, "p.yaml:12:1: a second YAML document");
}

}  // namespace
}  // namespace memfit
