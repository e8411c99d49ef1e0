// What `memfit train` and `memfit profile` share: their options, where the policies come from
// (a plan file, the planner under --budget, or the command line), the dry runs that predict a
// step's peak, the runtime a run trains on (cli/runtime_env.h) and, when asked, the Recorder
// (and on CUDA the CUPTI tracer) that make its report (profiler/report.h).
//
//   TrainArgs a;  add_run_options(cmd, a);  ...  parse
//   Prepared p = prepare(a);                    // validates everything; writes nothing
//   predict(p, a);
//   Session s = open_session(p.run, a.backend, /*record=*/true);
//   StepResult r = train_step(s, p.run, a, batch, first);
//   ProfileReport rep = finish_report(s, p, steps);  write_report(rep, a.report, p.formats);
//
// Bad input is a memfit::Error (the program exits 2) raised before anything is written: model,
// policies, budget, plan, formats and the backend are all checked by prepare(); the report
// directory is created (and proved writable) only when the run is about to start.
#pragma once

#include <CLI/CLI.hpp>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/runtime_env.h"
#include "core/model.h"
#include "core/model_spec.h"
#include "memory/alloc_conf.h"
#include "memory/category.h"
#include "memory/error.h"
#include "policies/plan.h"
#include "policies/trainer.h"
#include "profiler/recorder.h"
#include "profiler/report.h"

namespace memfit::cli {

struct TrainArgs {
  std::string model;
  std::string data;
  std::int64_t steps = 0;
  std::int64_t batch = 8;
  std::int64_t micro_batch = 0;
  std::int64_t accum = 0;
  std::int64_t seq_len = 0;  // 0: the model's
  std::string dtype = "f32";
  std::string checkpoint = "none";
  bool offload = false;
  std::string budget;
  std::uint64_t seed = 1337;
  double lr = 1e-3;
  std::string alloc_conf;
  bool predict = false;
  std::string plan_file;
  std::string device;
  std::string backend = "cpu";
  std::string report;  // a directory; "" for none
  std::string formats = "all";
  std::vector<std::string> given;  // the options given on the command line
};

bool given(const TrainArgs& a, const std::string& name);

// The options both commands take: --model/--plan, the policy flags, --budget/--device,
// --batch/--seq-len, --seed/--lr, --alloc-conf, --predict, --backend and --formats. The
// commands add --data, --steps and their report directory themselves.
void add_run_options(CLI::App* cmd, TrainArgs& a);
// In the callback, before anything else: which options were given, MEMFIT_ALLOC_CONF.
void collect_given(CLI::App* cmd, TrainArgs& a);

// Everything that decides a step's memory: what a dry run needs to reproduce it.
struct Run {
  ModelSpec spec;
  DType dtype = DType::kF32;
  TrainerOptions trainer;
  std::int64_t batch = 0;
  std::int64_t seq_len = 0;
  AllocatorConfig conf;  // conf.budget: the budget, 0 for none
  std::string backend = "cpu";

  std::string describe() const;
};

struct Peaks {
  std::size_t reserved = 0;
  std::size_t allocated = 0;
  std::array<std::size_t, kCategoryCount> by_category{};

  void take_max(const StepResult& r);
};

// Where the policies come from: a plan file, the planner, or the command line.
struct Source {
  std::optional<Plan> plan;
  std::string kind;  // "file", "planner", "" (command line)
  std::size_t feasible = 0;
};

struct Prepared {
  Source src;
  Run run;
  std::optional<Peaks> predicted;     // predict(): the plan's, or a dry run's
  std::vector<ExportFormat> formats;  // parsed --formats
};

// Validates the arguments and decides the run. Writes nothing.
Prepared prepare(const TrainArgs& a);
// Fills p.predicted: the plan's figures, else with --predict or `want` a dry run's.
void predict(Prepared& p, const TrainArgs& a, bool want = false);

// Prints how the plan was chosen (when it came from a file or the planner).
void print_plan_source(const char* command, const TrainArgs& a, const Prepared& p);

// One step of the run dry-run on the meta backend over a NullProvider, unbudgeted.
Peaks dry_run(const Run& p);

// The first step did not fit: says what this plan needs and what the usual alternatives would
// (from dry runs), as InvalidArgument.
[[noreturn]] void budget_too_small(const Run& p, const std::string& budget_text,
                                   const OutOfMemory& oom);

// A model and its trainer on a runtime, optionally recorded from before the model's first
// allocation. Members are destroyed in reverse: trainer, model, tracer, recorder, runtime.
class CuptiSession;  // CUDA builds: the tracer (train_setup.cpp)
struct Session {
  RuntimeEnv env;
  std::unique_ptr<Recorder> recorder;
  std::unique_ptr<CuptiSession> cupti;
  std::unique_ptr<LayerContext> ctx;
  std::unique_ptr<Model> model;
  std::unique_ptr<Trainer> trainer;

  Session();
  Session(Session&&) noexcept;
  ~Session();
};

// `budget_text`: what --budget said, for the error when the model does not fit. `record`: a
// Recorder (and on the cuda backend the CUPTI tracer, when available) watches the run.
Session open_session(const Run& p, const std::string& budget_text, bool record);

// One training step; an out-of-memory on the first step becomes budget_too_small's error.
StepResult train_step(Session& s, const Run& p, const std::string& budget_text, const Batch& b,
                      bool first);

std::string progress_line(const StepResult& r, std::int64_t step, std::int64_t total,
                          double tokens_per_s, bool show_scale, bool tty);

// The run's report: the recording, the allocator's figures, GPU activity, plan vs measured.
ProfileReport finish_report(Session& s, const Prepared& p, std::int64_t steps);
// Writes it and prints each path, the see_memory_usage line and plan vs measured.
void write_report(const ProfileReport& r, const std::string& dir,
                  const std::vector<ExportFormat>& formats);

}  // namespace memfit::cli
