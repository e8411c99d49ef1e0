// CpuRates (policies/cpu_rates.h): the measurement runs every op it names and gives sane
// rates; the cache file round-trips, is reused for this machine's key, measured again when
// stale, corrupt or asked, and bad files are refused with where and what; the dry run's
// compute_seconds and step_seconds add up what they say.
#include "policies/cpu_rates.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "memory/error.h"
#include "policies/dry_run.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

// A plausible rates file for this machine's key, without measuring.
CpuRates fake() {
  CpuRates r;
  r.key = CpuRates::this_key();
  for (std::size_t d = 0; d < OpRates::kDTypes; ++d) {
    r.ops.gemm[d] = {{1e6, 1e9}, {1e8, 5e10 * static_cast<double>(d + 1)}};
  }
  r.ops.ops[static_cast<std::size_t>(MetaOp::kLayerNormForward)][0] = {2e-6, 3e9};
  r.copy = 1e10;
  r.ops.bandwidth = r.copy;
  r.adamw = 1e9;
  r.measure_seconds = 0.5;
  return r;
}

int g_measured = 0;
CpuRates counting_measure() {
  ++g_measured;
  return fake();
}

class CpuRatesCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("memfit_cpu_rates_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    setenv("MEMFIT_CACHE_DIR", dir_.c_str(), 1);
    g_measured = 0;
  }
  void TearDown() override {
    unsetenv("MEMFIT_CACHE_DIR");
    fs::remove_all(dir_);
  }
  fs::path dir_;
};

TEST_F(CpuRatesCache, MeasuresOnceThenReadsTheFile) {
  std::string note;
  auto a = CpuRates::cached(&note, false, &counting_measure);
  EXPECT_EQ(g_measured, 1);
  EXPECT_NE(note.find("measured"), std::string::npos) << note;
  EXPECT_NE(note.find("saved to " + CpuRates::cache_path()), std::string::npos) << note;
  EXPECT_TRUE(fs::exists(CpuRates::cache_path()));
  EXPECT_EQ(fs::path(CpuRates::cache_path()).parent_path(), dir_);
  auto b = CpuRates::cached(&note, false, &counting_measure);
  EXPECT_EQ(g_measured, 1) << "the second call reads the file";
  EXPECT_EQ(note, "from " + CpuRates::cache_path());
  EXPECT_EQ(b->key, a->key);
  EXPECT_DOUBLE_EQ(b->copy, a->copy);
  EXPECT_DOUBLE_EQ(b->ops.gemm_rate(DType::kBF16, 1e7), a->ops.gemm_rate(DType::kBF16, 1e7));
  // Asked to measure again: measured and rewritten whatever is there.
  CpuRates::cached(&note, true, &counting_measure);
  EXPECT_EQ(g_measured, 2);
  EXPECT_NE(note.find("asked to measure again"), std::string::npos) << note;
}

CpuRates contended_measure() {
  ++g_measured;
  CpuRates r = fake();
  r.contention = 0.3;
  return r;
}

// Rates measured while other processes held the cores are kept (plans stay reproducible) but
// every note says so, with the share of time waited and what to do; quiet ones say nothing.
TEST_F(CpuRatesCache, ContendedRatesAreKeptButEveryNoteWarns) {
  std::string note;
  CpuRates::cached(&note, false, &contended_measure);
  EXPECT_NE(note.find("WARNING: measured while other processes held the CPU"), std::string::npos)
      << note;
  EXPECT_NE(note.find("30% of the time"), std::string::npos) << note;
  EXPECT_NE(note.find("memfit plan --measure"), std::string::npos) << note;
  CpuRates::cached(&note, false, &counting_measure);  // read back: still contended
  EXPECT_EQ(g_measured, 1);
  EXPECT_NE(note.find("30% of the time"), std::string::npos) << note;
  CpuRates::cached(&note, true, &counting_measure);  // measured again, quiet (fake: unknown)
  EXPECT_EQ(note.find("WARNING"), std::string::npos) << note;
}

TEST_F(CpuRatesCache, StaleOrCorruptFilesAreMeasuredAgain) {
  fs::create_directories(dir_);
  CpuRates other = fake();
  other.key = "some other machine";
  { std::ofstream(CpuRates::cache_path()) << other.to_yaml(); }
  std::string note;
  CpuRates::cached(&note, false, &counting_measure);
  EXPECT_EQ(g_measured, 1);
  EXPECT_NE(note.find("another machine or build"), std::string::npos) << note;
  { std::ofstream(CpuRates::cache_path()) << "memfit_cpu_rates: 1\nkey: [unclosed\n"; }
  CpuRates::cached(&note, false, &counting_measure);
  EXPECT_EQ(g_measured, 2);
  EXPECT_NE(note.find("unreadable"), std::string::npos) << note;
  // And the rewritten file is good again.
  CpuRates::cached(&note, false, &counting_measure);
  EXPECT_EQ(g_measured, 2);
}

TEST_F(CpuRatesCache, AnUnwritableCacheStillGivesRates) {
  fs::create_directories(dir_);
  { std::ofstream(dir_ / "blocker") << "x"; }
  setenv("MEMFIT_CACHE_DIR", (dir_ / "blocker").c_str(), 1);  // a file where a folder must be
  std::string note;
  auto r = CpuRates::cached(&note, false, &counting_measure);
  ASSERT_NE(r, nullptr);
  EXPECT_NE(note.find("not saved"), std::string::npos) << note;
}

TEST(CpuRatesFile, RoundTripsAndRefusesBadFiles) {
  const CpuRates a = fake();
  const CpuRates b = CpuRates::from_yaml(a.to_yaml(), "rates.yaml");
  EXPECT_EQ(b.key, a.key);
  EXPECT_DOUBLE_EQ(b.adamw, a.adamw);
  const auto& lr = b.ops.ops[static_cast<std::size_t>(MetaOp::kLayerNormForward)][0];
  EXPECT_DOUBLE_EQ(lr.rate, 3e9);
  EXPECT_DOUBLE_EQ(lr.per_call, 2e-6);
  EXPECT_EQ(b.contention, -1) << "unknown stays unknown";
  EXPECT_EQ(b.ops.per_op, 0);
  CpuRates c = fake();
  c.contention = 0.125;
  c.ops.per_op = 4.5e-6;
  c.ops.scale = 1.125;
  EXPECT_DOUBLE_EQ(CpuRates::from_yaml(c.to_yaml(), "c").contention, 0.125);
  EXPECT_DOUBLE_EQ(CpuRates::from_yaml(c.to_yaml(), "c").ops.per_op, 4.5e-6);
  EXPECT_DOUBLE_EQ(CpuRates::from_yaml(c.to_yaml(), "c").ops.scale, 1.125);
  const auto refuses = [](const std::string& text, const std::string& what) {
    try {
      CpuRates::from_yaml(text, "rates.yaml");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("rates.yaml"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  std::string good = a.to_yaml();
  refuses("device: {}\n", "not a memfit CPU rates file");
  refuses("memfit_cpu_rates: 7\n", "format 7");
  refuses("memfit_cpu_rates: 2\nkey: k\n", "missing key 'copy'");
  refuses("{{{", "not valid YAML");
  const auto swap = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  refuses(swap("copy: 1e+10", "copy: -3"), "copy");
  refuses(swap("adamw: 1e+09", "adamw: lots"), "adamw: not a number");
  refuses(swap("contention: -1", "contention: -0.5"), "contention");
  refuses(swap("per_op: 0", "per_op: -1e-06"), "per_op");
  refuses(swap("scale: 1", "scale: 0"), "scale");
  refuses(swap("layernorm_forward:", "warp_drive:"), "unknown op 'warp_drive'");
  refuses(swap("f32: [[1e+06, 1e+09], [1e+08, 5e+10]]", "f32: [[1e+08, 1e+09], [1e+06, 5e+10]]"),
          "increasing flops");
}

TEST(CpuRates, StepSecondsIsTheDryRunsOpsPlusHostAdamW) {
  const CpuRates r = fake();
  RunSpec run;
  run.model = ModelSpec::preset("gpt-micro");
  run.batch = 4;
  run.trainer.policy.micro_batch = 2;
  DryRunResult plain = dry_run(run, 1);
  EXPECT_EQ(plain.compute_seconds, 0) << "no rates, no time";
  run.op_rates = r.op_rates();
  DryRunResult timed = dry_run(run, 1);
  EXPECT_GT(timed.compute_seconds, 0);
  EXPECT_EQ(timed.step.reserved, plain.step.reserved) << "rates decide nothing about memory";
  EXPECT_DOUBLE_EQ(r.step_seconds(run, timed), timed.compute_seconds);
  EXPECT_DOUBLE_EQ(r.step_seconds(run), timed.compute_seconds);
  // Two more micro-batches, two more micro-batches' ops: the repeats the dry run skips are
  // priced too.
  RunSpec twice = run;
  twice.batch = 8;
  const DryRunResult t2 = dry_run(twice, 1);
  const double per_micro = (t2.compute_seconds - timed.compute_seconds) / 2;
  EXPECT_GT(per_micro, 0);
  RunSpec many = run;
  many.batch = 2 * 40;  // 40 micro-batches: most are skipped as repeats
  const DryRunResult t40 = dry_run(many, 1);
  EXPECT_LT(t40.micro_batches_run, 40);
  EXPECT_NEAR(t40.compute_seconds, timed.compute_seconds + 38 * per_micro,
              1e-9 * t40.compute_seconds);
  // The step's op count, skipped micro-batches included: what per_op adds up over.
  const double calls_per_micro = (t2.op_calls - timed.op_calls) / 2;
  EXPECT_GT(calls_per_micro, 0);
  EXPECT_EQ(t40.op_calls, timed.op_calls + 38 * calls_per_micro);
  auto per_op = std::make_shared<OpRates>(r.ops);
  per_op->per_op = 1e-3;
  RunSpec priced = many;
  priced.op_rates = per_op;
  EXPECT_NEAR(dry_run(priced, 1).compute_seconds - t40.compute_seconds, 1e-3 * t40.op_calls,
              1e-9 * t40.compute_seconds);
  // Optimizer offload: the host's AdamW over every parameter comes on top.
  RunSpec off = run;
  off.trainer.policy.offload.optimizer = true;
  const DryRunResult to = dry_run(off, 1);
  EXPECT_DOUBLE_EQ(r.step_seconds(off, to),
                   to.compute_seconds + double(run.model.parameter_count()) / r.adamw);
}

TEST(CpuRates, MeasureRunsEveryOpAndGivesSaneRates) {
  const CpuRates r = CpuRates::measure();
  EXPECT_EQ(r.key, CpuRates::this_key());
  EXPECT_GT(r.copy, 1e8);
  EXPECT_GT(r.adamw, 1e6);
  EXPECT_GT(r.measure_seconds, 0);
  // Linux reports each thread's run delay: the share is known, and a share of thread time.
  EXPECT_GE(r.contention, 0);
  EXPECT_LT(r.contention, 2);
  // What a real step takes beyond its kernels, per op: not negative, and well under a
  // millisecond (a whole gpt-tiny micro-batch of 128 tokens takes tens of milliseconds).
  EXPECT_GE(r.ops.per_op, 0);
  EXPECT_LE(r.ops.per_op, 1e-3);
  EXPECT_GE(r.ops.scale, 0.5);  // within calibrate()'s bounds
  EXPECT_LE(r.ops.scale, 4);
  for (std::size_t d = 0; d < OpRates::kDTypes; ++d) {
    ASSERT_EQ(r.ops.gemm[d].size(), 4u);
    for (const auto& p : r.ops.gemm[d]) EXPECT_GT(p.rate, 1e6) << d;
  }
  for (MetaOp op : {MetaOp::kLayerNormForward, MetaOp::kLayerNormBackward, MetaOp::kGeluForward,
                    MetaOp::kGeluBackward, MetaOp::kFlashAttentionForward,
                    MetaOp::kFlashAttentionBackward, MetaOp::kEmbeddingBackward,
                    MetaOp::kCrossEntropyBackward, MetaOp::kAdamW, MetaOp::kCopy,
                    MetaOp::kSwiGluBackward, MetaOp::kRmsNormBackward}) {
    for (std::size_t d = 0; d < OpRates::kDTypes; ++d) {
      const auto& x = r.ops.ops[static_cast<std::size_t>(op)][d];
      EXPECT_GT(x.rate, 0) << meta_op_name(op) << " " << d;
      EXPECT_GE(x.per_call, 0) << meta_op_name(op) << " " << d;
    }
  }
  // What it measured reads back.
  EXPECT_EQ(CpuRates::from_yaml(r.to_yaml(), "m").key, r.key);
}

}  // namespace
}  // namespace memfit
