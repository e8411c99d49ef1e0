// What `memfit train` and `memfit profile` share: their flags, and turning them into the
// library's values: where the policies come from (a plan file, the planner under --budget, or
// the flags), the RunSpec (policies/run_spec.h) the run trains, its prediction (one dry run,
// policies/dry_run.h), the RunSetup (policies/run_setup.h) it trains on, and printing. What
// it runs is all library; this file only parses, prints and names flags.
//
//   TrainArgs a;  add_run_options(cmd, a);  ...  parse
//   Prepared p = prepare(a);                    // validates everything; writes nothing
//   predict(p, a);
//   std::unique_ptr<RunSetup> run = open_run(p, a, /*record=*/true);
//   StepResult r = train_step(*run, a, batch);
//   write_report(finish_report(*run, p, steps, "train"), a.report, p.formats);
//
// Bad input is a memfit::Error (the program exits 2) raised before anything is written: model,
// policies, budget, plan, formats and the backend are all checked by prepare(); the report
// directory is created (and proved writable) only when the run is about to start. A budget
// the run does not fit is the library's BudgetError, re-worded here in flags ("--checkpoint
// all: 40.00 MiB (fits)"); a host budget, its HostBudgetError with the flag that set it.
// --host-budget defaults to this machine's (policies/runtime_env.h's default_host_budget).
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memory/peak_figures.h"
#include "policies/plan.h"
#include "policies/planner.h"
#include "policies/run_setup.h"
#include "policies/run_spec.h"
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
  std::string loss = "chunked";
  std::string offload;  // --offload's list (empty: given bare, or not given)
  std::string budget;
  std::string host_budget;  // "": this machine's default (default_host_budget)
  std::uint64_t seed = 1337;
  double lr = 1e-3;
  double max_grad_norm = 0;  // --clip-grad-norm (0: off)
  std::string alloc_conf;
  bool predict = false;
  std::string plan_file;
  std::string device;
  std::string backend = "cpu";
  std::string report;  // a directory; "" for none
  std::string formats = "all";
  int ranks = 0;  // --ranks: data-parallel ranks (0: the launch's, 1 without mpirun)
  int zero = 0;   // --zero: ZeRO stage 0, 1 or 2
  bool no_overlap = false;  // --no-overlap: the gradient sums do not overlap the backward
  std::vector<std::string> given;  // the options given on the command line
};

bool given(const TrainArgs& a, const std::string& name);

// A validator for an integer option's text, run before CLI11 converts it (CLI11 clamps an
// out-of-range number to the type's limit and reads "-1" as 2^64-1 for an unsigned): the text
// must be a decimal integer the type holds exactly, else the option's error names the range.
// A flag given as "" is a mistake, not "leave it out" (which would pick its default):
// InvalidArgument "<flag> \"\": <what>; valid: ..." when `given` and `value` is empty.
void reject_empty(const char* flag, bool given, const std::string& value,
                  const char* what = "an empty value");

CLI::Validator exact_int32();  // for int fields
CLI::Validator exact_int64();
CLI::Validator exact_uint64();

// The options both commands take: --model/--plan, the policy flags, --budget/--device,
// --batch/--seq-len, --seed/--lr, --alloc-conf, --predict, --backend and --formats. The
// commands add --data, --steps and their report directory themselves.
void add_run_options(CLI::App* cmd, TrainArgs& a);
// In the callback, before anything else: which options were given, MEMFIT_ALLOC_CONF.
void collect_given(CLI::App* cmd, TrainArgs& a);

// --seq-len: ModelSpec::resolve_seq_len (the one check), its error in the flag's name.
std::int64_t seq_len_flag(const ModelSpec& spec, std::int64_t requested);
// --model: ModelSpec::load, its notes (a config.json's ignored keys, ...) printed to stderr.
ModelSpec load_model(const std::string& name);
// --loss: chunked | whole; InvalidArgument naming the flag otherwise.
LossMode parse_loss_flag(const std::string& text);
// The one reading of a budget flag: a positive size with units ("64MiB"); InvalidArgument
// naming `flag` otherwise.
std::size_t parse_budget(const std::string& text, const char* flag = "--budget");

// Whether --alloc-conf (or MEMFIT_ALLOC_CONF) leaves the allocator mode to the planner: it
// does not name expandable_segments either way (PlannerOptions::choose_allocator).
bool planner_chooses_allocator(const std::string& alloc_conf);

// For the `cpu` device preset (this machine): its measured rates (CpuRates::cached, measured
// once and cached; `remeasure`: measured again) time every plan, and set the device's rates
// the cost model ranks with. Other devices, and calibrated plans, are left as they are.
// Returns what happened ("from PATH", "measured in 2.1 s ..."), or "" when not applied.
std::string use_measured_cpu_rates(PlannerOptions& o, const std::string& device_arg,
                                   bool remeasure = false);

// Where the policies come from: a plan file, the planner, or the command line.
struct Source {
  std::optional<Plan> plan;
  std::string kind;  // "file", "planner", "" (command line)
  std::size_t feasible = 0;
};

struct Prepared {
  Source src;
  RunSpec run;
  std::optional<PeakFigures> predicted;  // predict(): the plan's, or a dry run's
  std::vector<ExportFormat> formats;     // parsed --formats
};

// Validates the arguments and decides the run. Writes nothing.
Prepared prepare(const TrainArgs& a);
// Fills p.predicted: the plan's figures, else with --predict or `want` a dry run's.
void predict(Prepared& p, const TrainArgs& a, bool want = false);

// The CPU backend with no budget: the step's dry-run peak (and offload's pinned bytes) must fit
// this machine's available memory less a margin, checked before anything is allocated; else an
// InvalidArgument with the figures and the plan the planner finds for the memory there is.
void check_fits_machine(const Prepared& p, const TrainArgs& a);

// Prints how the plan was chosen (when it came from a file or the planner).
void print_plan_source(const char* command, const TrainArgs& a, const Prepared& p);

// RunSetup for the prepared run; a BudgetError becomes the flags' wording of it.
std::unique_ptr<RunSetup> open_run(const Prepared& p, const TrainArgs& a, bool record);
// One training step, the same way.
StepResult train_step(RunSetup& run, const TrainArgs& a, const Batch& b);

std::string progress_line(const StepResult& r, std::int64_t step, std::int64_t total,
                          double tokens_per_s, bool show_scale, bool tty);

// The run's report: the recording, the allocator's figures, GPU activity, plan vs measured;
// `command` ("train", "profile") names what made it.
ProfileReport finish_report(RunSetup& run, const Prepared& p, std::int64_t steps,
                            const char* command);
// Writes it and prints each path, the see_memory_usage line and plan vs measured.
void write_report(const ProfileReport& r, const std::string& dir,
                  const std::vector<ExportFormat>& formats);

}  // namespace memfit::cli
