#include "cli/train_command.h"

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/outputs.h"
#include "cli/run_args.h"
#include "cli/step_series.h"
#include "cli/terminal_text.h"
#include "core/comm/communicator.h"
#include "core/text_dataset.h"
#include "memory/error.h"
#include "memory/size.h"
#include "profiler/atomic_file.h"

namespace memfit::cli {

namespace {

struct TrainOnly {
  std::string save;
  std::string resume;
  std::string summary_json;
};

// The peaks as a plan's `predicted` map names them (peaks_json), with `prefix` in front.
void put_peaks(nlohmann::json& j, const std::string& prefix, const PeakFigures& p) {
  const nlohmann::json peaks = nlohmann::json::parse(peaks_json(p));  // outlives the loop
  for (const auto& [key, value] : peaks.items()) j[prefix + key] = value;
}

// A multi-rank run's state file for this rank: under ZeRO-1/2 each rank saves and resumes
// its own chunks, `<path>.rank<r>of<N>`; under ZeRO-0 every rank holds the same state and
// rank 0 alone writes `<path>` (and every rank resumes from it).
std::string rank_state_path(const std::string& path, const RunSpec& p) {
  if (path.empty() || p.ranks == 1 || p.trainer.zero_stage == 0) return path;
  return path + ".rank" + std::to_string(p.rank) + "of" + std::to_string(p.ranks);
}

int run_train(const TrainArgs& a, const TrainOnly& t) {
  for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--save", &t.save},
                                    {"--resume", &t.resume},
                                    {"--summary-json", &t.summary_json},
                                    {"--data", &a.data}}) {
    reject_empty(flag, given(a, flag), *value, "an empty file name");
  }
  if (given(a, "--formats") && a.report.empty()) {
    throw InvalidArgument("--formats " + a.formats +
                          " chooses the report's files: give --report DIR");
  }
  Prepared prep = prepare(a);
  const RunSpec& p = prep.run;
  // One report for a multi-rank run: rank 0's, with every rank's peak gathered into it.
  const bool lead = p.rank == 0;
  if (!lead) set_say_muted(true);
  const std::string save_path = lead || p.trainer.zero_stage > 0
                                    ? rank_state_path(t.save, p) : std::string();
  const std::string resume_path = rank_state_path(t.resume, p);
  const std::int64_t seq_len = p.resolved_seq_len();
  const TextDataset data(a.data);
  data.require_seq_len(seq_len);
  check_fits_machine(prep, a);  // before anything is allocated
  // The input is good: every target writable and no other run writing it, before step 1
  // (a bad run creates nothing, not even the report directory).
  const std::vector<OutputLock> held =
      claim_outputs({{"--save", save_path},
                     {"--summary-json", lead ? t.summary_json : std::string()},
                     {"--report", lead ? a.report : std::string(), /*dir=*/true}});
  print_plan_source("train", a, prep);
  predict(prep, a);
  const std::optional<PeakFigures>& predicted = prep.predicted;
  const bool report = lead && !a.report.empty();

  const std::unique_ptr<RunSetup> run = open_run(prep, a, report);
  Trainer& trainer = run->trainer();
  if (!resume_path.empty()) trainer.load(resume_path);
  const std::int64_t start = trainer.steps_attempted();

  say("memfit train: %s (%lld parameters) on %s (%lld bytes), backend %s\n", p.describe().c_str(),
      static_cast<long long>(run->model().parameter_count()), a.data.c_str(),
      static_cast<long long>(data.size()), run->runtime().name());
  say("  schedule %s, %s, loss scaling %s%s%s\n", trainer.schedule().name().c_str(),
      trainer.optimizer().name(), trainer.scaler().enabled() ? "on" : "off",
      p.alloc.budget ? (", budget " + format_bytes(p.alloc.budget)).c_str() : "",
      t.resume.empty() ? "" : (", resumed at step " + std::to_string(start)).c_str());
  if (p.ranks > 1) {
    say("  %d ranks (mpirun), ZeRO-%d: each rank steps on %lld of every %lld samples\n", p.ranks,
        p.trainer.zero_stage, static_cast<long long>(p.rank_batch()),
        static_cast<long long>(p.batch));
  }
  std::fflush(stdout);

  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  PeakFigures measured;
  StepSeries losses, grad_norms, step_seconds;
  std::int64_t clipped = 0;
  std::int64_t skipped = 0, tokens = 0, micro_batches = 0;
  double seconds = 0, last_scale = 1;
  for (std::int64_t i = 1; i <= a.steps; ++i) {
    // Every rank draws the same global batch (the same seed) and steps on its rows of it.
    const Batch b = rank_rows(data.sample(p.batch, seq_len, trainer.rng()), p.rank, p.ranks);
    const StepResult r = train_step(*run, a, b);
    measured.take_max(r.peaks);
    losses.add(r.loss);
    grad_norms.add(std::isfinite(r.grad_norm) ? r.grad_norm : -1.0);
    clipped += r.clipped ? 1 : 0;
    skipped += r.skipped ? 1 : 0;
    tokens += r.tokens;
    seconds += r.seconds;
    step_seconds.add(r.seconds);
    micro_batches = r.micro_batches;
    last_scale = r.loss_scale;
    const std::string line =
        progress_line(r, start + i, start + a.steps, static_cast<double>(r.tokens) / r.seconds,
                      trainer.scaler().enabled(), tty);
    if (lead) {
      std::printf(tty ? "\r%s\033[K" : "%s\n", shown(line).c_str());  // raw: our own escapes
      std::fflush(stdout);
    }
  }
  if (tty) say("\n");
  // Each output on its own: one that fails (a full disk) is written to the temp directory
  // instead, and the others are still written (cli/outputs.h).
  std::vector<std::string> failed;
  std::string saved_to = save_path;
  if (!save_path.empty()) {
    write_or_rescue(
        "--save", save_path, false,
        [&](const std::string& path) {
          trainer.save(path);
          saved_to = path;
        },
        failed);
  }

  const double tps = seconds > 0 ? static_cast<double>(tokens) / seconds : 0;
  say("  loss %.4f -> %.4f over %lld steps (%lld skipped), %.0f tokens/s, %.2f s\n", losses.first(),
      losses.last(), static_cast<long long>(a.steps), static_cast<long long>(skipped), tps,
      seconds);
  // Time per step: the median of the steps after the first (the first warms caches, the
  // allocator and the thread pools up), beside the plan's prediction.
  const double measured_step = steady_step_seconds(step_seconds);
  const double predicted_step = prep.src.plan ? prep.src.plan->predicted.step_seconds : 0;
  if (a.steps > 1) {
    say("  time per step %.3f s (median after the first, which took %.3f s)", measured_step,
        step_seconds.first());
    if (predicted_step > 0) {
      say("; predicted %.3f s (measured/predicted %.2f)", predicted_step,
          measured_step / predicted_step);
    }
    say("\n");
  }
  say("  peak reserved %s, allocated %s", format_bytes(measured.reserved).c_str(),
      format_bytes(measured.allocated).c_str());
  if (predicted) {
    say("; predicted (dry run) reserved %s, allocated %s (measured/predicted %.3f)",
        format_bytes(predicted->reserved).c_str(), format_bytes(predicted->allocated).c_str(),
        predicted->reserved ? double(measured.reserved) / double(predicted->reserved) : 0.0);
  }
  if (p.ranks > 1) {
    // Every rank's peak beside its own dry run's (its chunks differ by an element at most).
    Communicator& comm = *run->trainer().options().comm;
    const std::vector<double> m = gather_values(comm, static_cast<double>(measured.reserved));
    const std::vector<double> q =
        gather_values(comm, predicted ? static_cast<double>(predicted->reserved) : 0.0);
    say("\n  peak reserved by rank:%s\n", predicted ? "    measured    predicted" : "");
    for (int r = 0; r < p.ranks; ++r) {
      const auto mr = static_cast<std::size_t>(m[static_cast<std::size_t>(r)]);
      const auto qr = static_cast<std::size_t>(q[static_cast<std::size_t>(r)]);
      say("    rank %-17d %12s", r, format_bytes(mr).c_str());
      if (predicted) say(" %12s  %s", format_bytes(qr).c_str(), mr == qr ? "exact" : "differs");
      say("\n");
    }
  }
  say("\n  at the peak, by category%s:%s\n", p.ranks > 1 ? " (rank 0)" : "",
      predicted ? "    measured    predicted" : "");
  auto row = [&](const char* name, std::size_t m, std::size_t q) {
    if (m == 0 && (!predicted || q == 0)) return;
    say("    %-22s %12s", name, format_bytes(m).c_str());
    if (predicted) say(" %12s", format_bytes(q).c_str());
    say("\n");
  };
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    row(category_name(static_cast<Category>(c)), measured.at_peak[c],
        predicted ? predicted->at_peak[c] : 0);
  }
  row("(cached)", measured.cached(), predicted ? predicted->cached() : 0);
  row("(pinned host)", measured.host_pinned, predicted ? predicted->host_pinned : 0);
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const std::string name = std::string("  host ") + category_name(static_cast<Category>(c));
    row(name.c_str(), measured.host_at_peak[c], predicted ? predicted->host_at_peak[c] : 0);
  }
  if (p.ranks > 1) run->trainer().options().comm->barrier();  // every rank's state is written
  if (!save_path.empty()) {
    say("  state: %s%s\n", saved_to.c_str(),
        p.ranks > 1 && p.trainer.zero_stage > 0 ? " (and the other ranks' beside it)" : "");
  }
  std::string report_dir = a.report;
  if (report) {
    const ProfileReport r = finish_report(*run, prep, a.steps, "train");
    write_or_rescue(
        "--report", a.report, true,
        [&](const std::string& dir) {
          write_report(r, dir, prep.formats);
          report_dir = dir;
        },
        failed);
  }

  if (lead && !t.summary_json.empty()) {
    nlohmann::json j;
    j["ranks"] = p.ranks;
    j["zero_stage"] = p.trainer.zero_stage;
    const MemoryPolicy& pol = p.trainer.policy;
    j["model"] = p.model.name;
    j["backend"] = run->runtime().name();
    j["parameters"] = run->model().parameter_count();
    j["dtype"] = dtype_name(pol.dtype);
    j["checkpoint"] = pol.checkpoint.name();
    j["schedule"] = trainer.schedule().name();
    j["batch"] = p.batch;
    j["seq_len"] = seq_len;
    j["micro_batch"] = pol.micro_batch;
    j["accum"] = pol.accum;
    j["micro_batches"] = micro_batches;
    j["offload"] = pol.offload.optimizer;
    j["offload_gradients"] = pol.offload.gradients;
    j["offload_weights"] = pol.offload.weights;
    j["offload_activations"] = pol.offload.activations;
    j["optimizer"] = trainer.optimizer().name();
    j["loss_scaling"] = trainer.scaler().enabled();
    j["loss_scale"] = last_scale;
    j["seed"] = a.seed;
    j["lr"] = a.lr;
    j["data"] = a.data;
    j["data_bytes"] = data.size();
    j["start_step"] = start;
    j["steps"] = a.steps;
    j["skipped_steps"] = skipped;
    j["losses"] = losses.kept();  // every step's, or every losses_stride-th on long runs
    if (losses.stride() > 1) j["losses_stride"] = losses.stride();
    if (a.max_grad_norm > 0) {
      j["max_grad_norm"] = a.max_grad_norm;
      j["grad_norms"] = grad_norms.kept();  // -1: not finite (the step was skipped)
      j["clipped_steps"] = clipped;
    }
    j["first_loss"] = losses.first();
    j["final_loss"] = losses.last();
    j["seconds"] = seconds;
    j["step_seconds"] = step_seconds.kept();  // the same steps as "losses"
    j["measured_step_seconds"] = measured_step;  // median after the first step (0: one step)
    if (predicted_step > 0) j["predicted_step_seconds"] = predicted_step;
    j["tokens"] = tokens;
    j["tokens_per_second"] = tps;
    j["budget_bytes"] = p.alloc.budget;
    j["alloc_conf"] = p.alloc.to_string();
    put_peaks(j, "", measured);
    if (predicted) put_peaks(j, "predicted_", *predicted);
    if (prep.src.plan) {
      j["plan"] = nlohmann::json::parse(prep.src.plan->to_json());  // the plan file's document
      j["plan_source"] = prep.src.kind;
      j["why"] = prep.src.plan->why;
      if (prep.src.kind == "file") j["plan_file"] = a.plan_file;
    }
    j["allocator_stats"] = run->allocator().stats().as_map();
    if (!t.save.empty()) j["saved_to"] = saved_to;
    if (!t.resume.empty()) j["resumed_from"] = t.resume;
    if (report) j["report_dir"] = report_dir;
    // A file name need not be UTF-8: such bytes become U+FFFD rather than failing the dump.
    const std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    write_or_rescue(
        "--summary-json", t.summary_json, false,
        [&](const std::string& path) {
          write_file_atomic(path, text);
          say("  summary: %s\n", path.c_str());
        },
        failed);
  }
  finish_outputs(failed);
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<TrainArgs>();
  auto t = std::make_shared<TrainOnly>();
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a model on a text file with memory policies, under a budget");
  // A repeated option takes its last value, so scripts/demo.sh's defaults can be overridden.
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--data", a->data,
                  "a text file; tokens are its bytes (data/corpus.txt is bundled)")
      ->required();
  cmd->add_option("--steps", a->steps, "training steps to run")->required()->check(exact_int64());
  add_run_options(cmd, *a);
  cmd->add_option("--save", t->save, "write the training state here at the end (atomic)");
  cmd->add_option("--resume", t->resume, "continue from a saved training state");
  cmd->add_option("--summary-json", t->summary_json, "write the summary as JSON here");
  cmd->add_option("--report", a->report,
                  "record the run and write a profile report into this directory (--formats: "
                  "which files; as `memfit profile --out`)");
  cmd->callback([a, t, cmd, &exit_code] {
    collect_given(cmd, *a);
    exit_code = run_train(*a, *t);
  });
}

}  // namespace memfit::cli
