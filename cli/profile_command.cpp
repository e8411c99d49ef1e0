#include "cli/profile_command.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/outputs.h"
#include "cli/run_args.h"
#include "cli/terminal_text.h"
#include "core/text_dataset.h"
#include "memory/size.h"
#include "profiler/atomic_file.h"

namespace memfit::cli {

namespace {

// Bytes from a fixed linear congruential generator (Knuth's MMIX constants): enough text to
// sample windows from, the same every run.
TextDataset synthetic_data(std::int64_t seq_len) {
  const std::size_t n = static_cast<std::size_t>(std::max<std::int64_t>(seq_len * 64, 1 << 16));
  std::string text(n, '\0');
  std::uint64_t x = 0x6d656d666974ULL;  // "memfit"
  for (char& c : text) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    c = static_cast<char>(x >> 56);
  }
  return TextDataset::from_text(std::move(text), "<pseudo-random bytes>");
}

int run_profile(const TrainArgs& a) {
  if (a.report.empty()) throw InvalidArgument("--out DIR is required");
  Prepared prep = prepare(a);
  if (prep.run.ranks > 1) {
    throw InvalidArgument("memfit profile records one process; for " +
                          std::to_string(prep.run.ranks) + " ranks use mpirun -np " +
                          std::to_string(prep.run.ranks) +
                          " memfit train ... --report DIR (rank 0 records)");
  }
  const RunSpec& p = prep.run;
  const std::int64_t seq_len = p.resolved_seq_len();
  const TextDataset data = a.data.empty() ? synthetic_data(seq_len) : TextDataset(a.data);
  data.require_seq_len(seq_len);
  check_fits_machine(prep, a);  // before anything is allocated
  // Input checked: the report directory (created now), locked for this run.
  const std::vector<OutputLock> held = claim_outputs({{"--out", a.report, /*dir=*/true}});
  print_plan_source("profile", a, prep);
  // Plan vs measured whenever there is something to compare against: a plan, or a budget the
  // command line's policies must fit (a dry run says what they should take).
  predict(prep, a, !a.budget.empty());

  const std::unique_ptr<RunSetup> run = open_run(prep, a, /*record=*/true);
  say("memfit profile: %s (%lld parameters), backend %s, %lld steps on %s\n", p.describe().c_str(),
      static_cast<long long>(run->model().parameter_count()), run->runtime().name(),
      static_cast<long long>(a.steps), data.source().c_str());
  std::fflush(stdout);
  for (std::int64_t i = 1; i <= a.steps; ++i) {
    const Batch b = data.sample(p.batch, seq_len, run->trainer().rng());
    const StepResult r = train_step(*run, a, b);
    say("%s\n", progress_line(r, i, a.steps, static_cast<double>(r.tokens) / r.seconds,
                              run->trainer().scaler().enabled(), /*tty=*/false)
                    .c_str());
    std::fflush(stdout);
  }
  const ProfileReport r = finish_report(*run, prep, a.steps, "profile");
  std::vector<std::string> failed;
  write_or_rescue(
      "--out", a.report, true, [&](const std::string& dir) { write_report(r, dir, prep.formats); },
      failed);
  finish_outputs(failed);
  return 0;
}

}  // namespace

void add_profile_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "Train a few steps with the profiler on and write a memory report");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--steps", a->steps, "training steps to record")
      ->required()
      ->check(exact_int64());
  cmd->add_option("--out", a->report,
                  "the report's directory (created): summary.json, timeline.csv, trace.json, "
                  "snapshot.pickle, report.html")
      ->required();
  cmd->add_option("--data", a->data,
                  "a text file to train on (default: pseudo-random bytes; memory is the same)");
  add_run_options(cmd, *a);
  cmd->callback([a, cmd, &exit_code] {
    collect_given(cmd, *a);
    exit_code = run_profile(*a);
  });
}

}  // namespace memfit::cli
