// Saves are crash-safe, tested by crashing (issue 17): a forked child writes a training state,
// a plan or a whole report over an earlier one and is killed in the middle, and the earlier
// file must be there, whole and loadable, or the new one, whole; never a partial file under the
// final name. Two ways to kill, neither of which the writer can see coming:
//   - at a byte: RLIMIT_FSIZE makes the kernel stop the child with SIGXFSZ when a write passes
//     that offset (any write, of any file), at offsets spread over the file;
//   - at a stage: SIGKILL raised from the atomic writer's test probe (profiler/atomic_file.h)
//     after the temporary is created, after each write, after the fsync, after the rename and
//     after the directory's fsync: every stage of every file.
// At least 50 kill points per kind of file. The files each save writes are deterministic, so
// "the old file" and "the new file" are compared byte for byte, then loaded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "policies/plan.h"
#include "policies/run_setup.h"
#include "policies/train_state.h"
#include "profiler/atomic_file.h"
#include "profiler/pickle.h"
#include "profiler/report.h"
#include "tests/core/exec_testutil.h"  // small_gpt

namespace memfit {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The regular files under `dir` (not recursive) by name, with their bytes.
std::map<std::string, std::string> files_in(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) out[e.path().filename().string()] = slurp(e.path());
  }
  return out;
}

bool is_temporary(const std::string& name) { return name.find(".tmp.") != std::string::npos; }

void remove_temporaries(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (is_temporary(e.path().filename().string())) fs::remove(e.path());
  }
}

// ---- killing a writer ---------------------------------------------------------------------

int g_kill_at = 0;  // the child's probe call that raises SIGKILL
int g_probes = 0;   // probe calls so far in this process

void kill_probe(WriteStage, const std::string&) {
  if (++g_probes == g_kill_at) ::raise(SIGKILL);
}
void count_probe(WriteStage, const std::string&) { ++g_probes; }

struct Kill {
  bool at_byte;  // else at the n-th probe call
  long n;
};

// Runs `save` in a child killed as `k` says; returns its wait status.
int run_killed(const std::function<void()>& save, Kill k) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(120);  // a child that hangs dies of SIGALRM: the test fails instead of hanging
    if (k.at_byte) {
      ::signal(SIGXFSZ, SIG_DFL);
      const rlimit lim{static_cast<rlim_t>(k.n), static_cast<rlim_t>(k.n)};
      ::setrlimit(RLIMIT_FSIZE, &lim);
    } else {
      g_probes = 0;
      g_kill_at = static_cast<int>(k.n);
      set_write_probe(&kill_probe);
    }
    try {
      save();
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// How many probe calls one save makes.
int probes_of(const std::function<void()>& save) {
  g_probes = 0;
  set_write_probe(&count_probe);
  save();
  set_write_probe(nullptr);
  return g_probes;
}

// Kill points: every probe call of a save, then byte offsets spread over [1, largest) (at
// least `min_total` points in all).
std::vector<Kill> kill_points(int probes, std::size_t largest, int min_total) {
  std::vector<Kill> out;
  for (int i = 1; i <= probes; ++i) out.push_back({false, i});
  const int bytes = std::max(20, min_total - probes);
  std::set<long> offsets{0, 1};
  for (int i = 0; i < bytes; ++i) {
    offsets.insert(static_cast<long>(1 + (largest - 1) * static_cast<std::size_t>(i) /
                                             static_cast<std::size_t>(bytes)));
  }
  for (long o : offsets) out.push_back({true, o});
  return out;
}

// One kind of file: `save_old` and `save_new` write into `dir`, `load` proves a file set
// loadable. Runs every kill point of save_new over the old files and checks what is left.
struct Outcome {
  int points = 0;
  int killed = 0;
  int old_left = 0, new_left = 0, mixed = 0;
};

void crash_test(const fs::path& dir, const std::function<void()>& save_old,
                const std::function<void()>& save_new,
                const std::function<void(const fs::path&)>& load, Outcome& out) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  // The new files, as a save that is not killed writes them.
  save_new();
  const std::map<std::string, std::string> new_files = files_in(dir);
  std::size_t largest = 0;
  for (const auto& [name, bytes] : new_files) largest = std::max(largest, bytes.size());
  const int probes = probes_of(save_new);
  fs::remove_all(dir);
  fs::create_directories(dir);
  save_old();
  const std::map<std::string, std::string> old_files = files_in(dir);
  EXPECT_EQ(old_files.size(), new_files.size());
  for (const auto& [name, bytes] : old_files) {
    EXPECT_NE(bytes, new_files.at(name)) << name << ": the test needs old and new to differ";
  }

  for (const Kill& k : kill_points(probes, largest, 50)) {
    SCOPED_TRACE((k.at_byte ? "killed at byte " : "killed at probe call ") + std::to_string(k.n));
    ++out.points;
    const int status = run_killed(save_new, k);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child was not killed: exit status " << status;
    const int sig = WTERMSIG(status);
    ASSERT_TRUE(sig == (k.at_byte ? SIGXFSZ : SIGKILL)) << "killed by signal " << sig;
    ++out.killed;
    // Under each final name: the old file or the new one, whole. Temporaries may be left.
    int olds = 0, news = 0;
    for (const auto& [name, bytes] : files_in(dir)) {
      if (is_temporary(name)) continue;
      ASSERT_TRUE(old_files.count(name)) << "unexpected file " << name;
      if (bytes == old_files.at(name)) {
        ++olds;
      } else {
        ASSERT_EQ(bytes, new_files.at(name)) << name << " is neither the old nor the new file";
        ++news;
      }
    }
    ASSERT_EQ(olds + news, static_cast<int>(old_files.size())) << "a file is missing";
    ASSERT_NO_THROW(load(dir));
    if (news == 0) {
      ++out.old_left;
    } else if (olds == 0) {
      ++out.new_left;
    } else {
      ++out.mixed;
    }
    // Back to the old files for the next point.
    remove_temporaries(dir);
    for (const auto& [name, bytes] : old_files) {
      std::ofstream(dir / name, std::ios::binary | std::ios::trunc) << bytes;
    }
  }
}

RunSpec small_run() {
  RunSpec r;
  r.model = testing::small_gpt(2);
  r.trainer.policy.dtype = DType::kF32;
  r.batch = 2;
  r.seq_len = 16;
  return r;
}

Batch batch_of(const RunSpec& r, int salt) {
  Batch b;
  b.batch = r.batch;
  b.seq_len = r.resolved_seq_len();
  for (std::int64_t i = 0; i < b.batch * b.seq_len; ++i) {
    b.tokens.push_back(static_cast<std::int32_t>((i * 11 + salt) % r.model.vocab));
    b.targets.push_back(static_cast<std::int32_t>((i * 13 + 1 + salt) % r.model.vocab));
  }
  return b;
}

fs::path test_dir(const std::string& name) {
  return fs::temp_directory_path() / ("memfit_kill_" + name + "_" + std::to_string(::getpid()));
}

TEST(SaveKill, TrainingStateSurvivesAKillAtEveryPoint) {
  const RunSpec spec = small_run();
  RunSetup run(spec);
  const fs::path dir = test_dir("state");
  const std::string path = (dir / "run.mfstate").string();
  run.step(batch_of(spec, 0));
  const std::string old_bytes = [&] {
    fs::create_directories(dir);
    run.trainer().save(path);
    return slurp(path);
  }();
  run.step(batch_of(spec, 1));  // the new state: one more step
  Outcome o;
  crash_test(
      dir, [&] { std::ofstream(path, std::ios::binary) << old_bytes; },
      [&] { run.trainer().save(path); },
      [&](const fs::path& d) { (void)TrainStateFile::read((d / "run.mfstate").string()); }, o);
  EXPECT_GE(o.points, 50);
  EXPECT_EQ(o.killed, o.points);
  EXPECT_GT(o.old_left, 0);
  EXPECT_GT(o.new_left, 0);  // killed after the rename
  EXPECT_EQ(o.mixed, 0);
  std::printf("training state: %d kill points, %d left the old file, %d the new one\n", o.points,
              o.old_left, o.new_left);
  fs::remove_all(dir);
}

TEST(SaveKill, PlanSurvivesAKillAtEveryPoint) {
  const fs::path dir = test_dir("plan");
  const std::string path = (dir / "plan.yaml").string();
  Plan p;
  p.model = small_run().model;
  p.device = "cpu";
  p.budget = 64 << 20;
  p.seq_len = 16;
  p.policy.micro_batch = 4;
  p.accum_steps = 1;
  p.global_batch = 4;
  Plan q = p;
  q.policy.micro_batch = 2;
  q.accum_steps = 2;
  q.why = std::string(4000, 'w');  // a few pages, so byte kills land inside the data
  Outcome o;
  crash_test(
      dir, [&] { p.save(path); }, [&] { q.save(path); },
      [&](const fs::path& d) { (void)Plan::load((d / "plan.yaml").string()); }, o);
  EXPECT_GE(o.points, 50);
  EXPECT_EQ(o.killed, o.points);
  EXPECT_GT(o.old_left, 0);
  EXPECT_GT(o.new_left, 0);
  EXPECT_EQ(o.mixed, 0);
  std::printf("plan: %d kill points, %d left the old file, %d the new one\n", o.points, o.old_left,
              o.new_left);
  fs::remove_all(dir);
}

TEST(SaveKill, ReportSurvivesAKillAtEveryPoint) {
  // Two recorded runs' reports: the second is written over the first.
  const RunSpec spec = small_run();
  auto report_of = [&](int steps) {
    RunSetup run(spec, {.record = true});
    for (int i = 0; i < steps; ++i) run.step(batch_of(spec, i));
    return run.finish_report(steps);
  };
  const ProfileReport first = report_of(1);
  const ProfileReport second = report_of(2);
  const std::vector<ExportFormat> all = parse_formats("all");
  const fs::path dir = test_dir("report");
  Outcome o;
  crash_test(
      dir, [&] { export_report(first, dir.string(), all); },
      [&] { export_report(second, dir.string(), all); },
      [&](const fs::path& d) {
        (void)read_pickle(slurp(d / "snapshot.pickle"), "snapshot.pickle");
        EXPECT_NE(slurp(d / "summary.json").find("\"peak\""), std::string::npos);
      },
      o);
  EXPECT_GE(o.points, 50);
  EXPECT_EQ(o.killed, o.points);
  EXPECT_GT(o.old_left, 0);
  EXPECT_GT(o.new_left, 0);
  // Files are swapped in only after every one is written: a kill leaves a mix of old and new
  // files only between the first rename and the last (at most one kill point per file).
  EXPECT_LE(o.mixed, static_cast<int>(all.size()) * 2);
  std::printf(
      "report: %d kill points, %d left the old report, %d the new one, %d a mix of whole "
      "files (killed between renames)\n",
      o.points, o.old_left, o.new_left, o.mixed);
  fs::remove_all(dir);
}

// Two processes writing one path at once: every write is whole, so the file at the end is one
// of theirs, whole (last writer wins); neither fails.
TEST(SaveKill, ConcurrentWritersLeaveOneWholeFile) {
  const fs::path dir = test_dir("concurrent");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "out.json").string();
  const std::string a(200000, 'a'), b(300000, 'b');
  std::vector<pid_t> kids;
  for (const std::string* text : {&a, &b}) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      try {
        for (int i = 0; i < 40; ++i) write_file_atomic(path, *text);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  for (int i = 0; i < 200; ++i) {  // meanwhile a reader only ever sees whole files
    const std::string now = slurp(path);
    if (!now.empty()) ASSERT_TRUE(now == a || now == b) << "a partial file of " << now.size();
  }
  for (pid_t pid : kids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  const std::string last = slurp(path);
  EXPECT_TRUE(last == a || last == b);
  EXPECT_EQ(files_in(dir).size(), 1u) << "a temporary was left behind";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memfit
