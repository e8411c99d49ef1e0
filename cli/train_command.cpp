#include "cli/train_command.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/plan_command.h"
#include "cli/train_setup.h"
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

nlohmann::json by_category_json(const std::array<std::size_t, kCategoryCount>& a) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t c = 0; c < kCategoryCount; ++c)
    j[category_name(static_cast<Category>(c))] = a[c];
  return j;
}

int run_train(const TrainArgs& a, const TrainOnly& t) {
  if (given(a, "--formats") && a.report.empty()) {
    throw InvalidArgument("--formats " + a.formats +
                          " chooses the report's files: give --report DIR");
  }
  Prepared prep = prepare(a);
  const Run& p = prep.run;
  const TextDataset data(a.data);
  data.require_seq_len(p.seq_len);
  print_plan_source("train", a, prep);
  predict(prep, a);
  const std::optional<Peaks>& predicted = prep.predicted;
  const bool report = !a.report.empty();
  if (report) ensure_writable_dir(a.report);  // before training: a bad directory costs nothing

  Session s = open_session(p, a.budget, report);
  Trainer& trainer = *s.trainer;
  if (!t.resume.empty()) trainer.load(t.resume);
  const std::int64_t start = trainer.steps_attempted();

  std::printf("memfit train: %s (%lld parameters) on %s (%lld bytes), backend %s\n",
              p.describe().c_str(), static_cast<long long>(s.model->parameter_count()),
              a.data.c_str(), static_cast<long long>(data.size()), s.env.name.c_str());
  std::printf("  schedule %s, %s, loss scaling %s%s%s\n", trainer.schedule().name().c_str(),
              trainer.optimizer().name(), trainer.scaler().enabled() ? "on" : "off",
              p.conf.budget ? (", budget " + format_bytes(p.conf.budget)).c_str() : "",
              t.resume.empty() ? "" : (", resumed at step " + std::to_string(start)).c_str());
  std::fflush(stdout);

  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  Peaks measured;
  std::vector<double> losses;
  std::int64_t skipped = 0, tokens = 0, micro_batches = 0;
  double seconds = 0, last_scale = 1;
  for (std::int64_t i = 1; i <= a.steps; ++i) {
    const Batch b = data.sample(p.batch, p.seq_len, trainer.rng());
    const StepResult r = train_step(s, p, a.budget, b, i == 1);
    measured.take_max(r);
    losses.push_back(r.loss);
    skipped += r.skipped ? 1 : 0;
    tokens += r.tokens;
    seconds += r.seconds;
    micro_batches = r.micro_batches;
    last_scale = r.loss_scale;
    const std::string line =
        progress_line(r, start + i, start + a.steps, static_cast<double>(r.tokens) / r.seconds,
                      trainer.scaler().enabled(), tty);
    std::printf(tty ? "\r%s\033[K" : "%s\n", line.c_str());
    std::fflush(stdout);
  }
  if (tty) std::printf("\n");
  if (!t.save.empty()) trainer.save(t.save);

  const double tps = seconds > 0 ? static_cast<double>(tokens) / seconds : 0;
  std::printf("  loss %.4f -> %.4f over %lld steps (%lld skipped), %.0f tokens/s, %.2f s\n",
              losses.front(), losses.back(), static_cast<long long>(a.steps),
              static_cast<long long>(skipped), tps, seconds);
  std::printf("  peak reserved %s, allocated %s", format_bytes(measured.reserved).c_str(),
              format_bytes(measured.allocated).c_str());
  if (predicted) {
    std::printf(
        "; predicted (dry run) reserved %s, allocated %s (measured/predicted %.3f)",
        format_bytes(predicted->reserved).c_str(), format_bytes(predicted->allocated).c_str(),
        predicted->reserved ? double(measured.reserved) / double(predicted->reserved) : 0.0);
  }
  std::printf("\n  peak by category:%s\n", predicted ? "     measured    predicted" : "");
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    if (measured.by_category[c] == 0 && (!predicted || predicted->by_category[c] == 0)) continue;
    std::printf("    %-16s %12s", category_name(static_cast<Category>(c)),
                format_bytes(measured.by_category[c]).c_str());
    if (predicted) std::printf(" %12s", format_bytes(predicted->by_category[c]).c_str());
    std::printf("\n");
  }
  if (!t.save.empty()) std::printf("  state: %s\n", t.save.c_str());
  if (report) write_report(finish_report(s, prep, a.steps), a.report, prep.formats);

  if (!t.summary_json.empty()) {
    nlohmann::json j;
    j["model"] = p.spec.name;
    j["backend"] = s.env.name;
    j["parameters"] = s.model->parameter_count();
    j["dtype"] = dtype_name(p.dtype);
    j["checkpoint"] = p.trainer.checkpoint;
    j["schedule"] = trainer.schedule().name();
    j["batch"] = p.batch;
    j["seq_len"] = p.seq_len;
    j["micro_batch"] = p.trainer.micro_batch;
    j["accum"] = p.trainer.accum;
    j["micro_batches"] = micro_batches;
    j["offload"] = p.trainer.offload;
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
    j["losses"] = losses;
    j["first_loss"] = losses.front();
    j["final_loss"] = losses.back();
    j["seconds"] = seconds;
    j["tokens"] = tokens;
    j["tokens_per_second"] = tps;
    j["budget_bytes"] = p.conf.budget;
    j["alloc_conf"] = p.conf.to_string();
    j["peak_reserved_bytes"] = measured.reserved;
    j["peak_allocated_bytes"] = measured.allocated;
    j["peak_by_category"] = by_category_json(measured.by_category);
    if (predicted) {
      j["predicted_peak_reserved_bytes"] = predicted->reserved;
      j["predicted_peak_allocated_bytes"] = predicted->allocated;
      j["predicted_peak_by_category"] = by_category_json(predicted->by_category);
    }
    if (prep.src.plan) {
      j["plan"] = plan_json(*prep.src.plan);
      j["plan_source"] = prep.src.kind;
      j["why"] = prep.src.plan->why;
      if (prep.src.kind == "file") j["plan_file"] = a.plan_file;
    }
    j["allocator_stats"] = s.env.alloc->stats().as_map();
    if (!t.save.empty()) j["saved_to"] = t.save;
    if (!t.resume.empty()) j["resumed_from"] = t.resume;
    if (report) j["report_dir"] = a.report;
    write_file_atomic(t.summary_json, j.dump(2) + "\n");
    std::printf("  summary: %s\n", t.summary_json.c_str());
  }
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
  cmd->add_option("--steps", a->steps, "training steps to run")->required();
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
