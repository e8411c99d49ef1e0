#include "cli/train_command.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/plan_command.h"
#include "core/cpu/cpu_backend.h"
#include "core/meta/meta_backend.h"
#include "core/model.h"
#include "core/text_dataset.h"
#include "memory/alloc_conf.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "memory/size.h"
#include "policies/accumulation.h"
#include "policies/device_spec.h"
#include "policies/plan.h"
#include "policies/planner.h"
#include "policies/trainer.h"

namespace memfit::cli {

namespace {

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
  std::string save;
  std::string resume;
  std::string summary_json;
  std::string alloc_conf;
  bool predict = false;
  std::string plan_file;
  std::string device;
  std::vector<std::string> given;  // the options given on the command line
};

bool given(const TrainArgs& a, const std::string& name) {
  return std::find(a.given.begin(), a.given.end(), name) != a.given.end();
}

// The flags that choose a memory policy: with none of them, --budget plans.
const char* const kPolicyFlags[] = {"--dtype", "--checkpoint", "--micro-batch", "--accum",
                                    "--offload"};

// Everything that decides a step's memory: what a dry run needs to reproduce it.
struct Run {
  ModelSpec spec;
  DType dtype = DType::kF32;
  TrainerOptions trainer;
  std::int64_t batch = 0;
  std::int64_t seq_len = 0;
  AllocatorConfig conf;  // conf.budget: the budget, 0 for none

  std::string describe() const {
    std::string s = spec.name + ", " + dtype_name(dtype) + ", checkpoint " + trainer.checkpoint +
                    ", batch " + std::to_string(batch) + " x " + std::to_string(seq_len);
    if (trainer.micro_batch > 0) s += ", micro-batch " + std::to_string(trainer.micro_batch);
    if (trainer.accum > 0) s += ", accum " + std::to_string(trainer.accum);
    if (trainer.offload) s += ", offload";
    return s;
  }
};

struct Peaks {
  std::size_t reserved = 0;
  std::size_t allocated = 0;
  std::array<std::size_t, kCategoryCount> by_category{};

  void take_max(const StepResult& r) {
    reserved = std::max(reserved, r.peak_reserved);
    allocated = std::max(allocated, r.peak_allocated);
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      by_category[c] = std::max(by_category[c], r.peak_by_category[c]);
    }
  }
};

// One step of the plan on the meta backend over a NullProvider, unbudgeted: the real
// allocator and executor with no arithmetic, so the peak includes rounding and fragmentation.
Peaks dry_run(const Run& p) {
  MetaBackend meta;
  NullProvider null;
  AllocatorConfig conf = p.conf;
  conf.budget = 0;
  CachingAllocator alloc(null, conf, &meta.stream_sync());
  meta.set_workspace_allocator(&alloc);  // the CPU run's GEMM scratch, as below
  LayerContext ctx{meta, alloc, kDefaultStream, p.dtype};
  Model model(p.spec, ctx);
  Trainer trainer(model, ctx, p.trainer);
  Batch b;
  b.batch = p.batch;
  b.seq_len = p.seq_len;
  b.tokens.assign(static_cast<std::size_t>(p.batch * p.seq_len), 0);
  b.targets = b.tokens;
  Peaks peaks;
  peaks.take_max(trainer.step(b));
  return peaks;
}

std::string mib_ceil(std::size_t bytes) {
  return std::to_string((bytes + kMiB - 1) / kMiB) + "MiB";
}

// The first step did not fit: say what this plan needs and what the usual alternatives would.
[[noreturn]] void budget_too_small(const Run& p, const std::string& budget_text,
                                   const OutOfMemory& oom) {
  std::string msg = "--budget " + budget_text + " (" + format_bytes(p.conf.budget) +
                    ") is too small for step one of " + p.describe() + " (" + oom.what() + ")";
  try {
    const Peaks need = dry_run(p);
    msg += "\n  a dry run of this plan reserves " + format_bytes(need.reserved) +
           " at its peak: give --budget " + mib_ceil(need.reserved) +
           " or more, or change the plan (dry-run peaks):";
    struct Alt {
      std::string label;
      Run plan;
    };
    std::vector<Alt> alts;
    auto add = [&](std::string label, auto change) {
      Run q = p;
      change(q);
      alts.push_back({std::move(label), q});
    };
    if (p.trainer.checkpoint != "all")
      add("--checkpoint all", [](Run& q) { q.trainer.checkpoint = "all"; });
    if (p.batch > 1) {
      const std::int64_t mb = std::max<std::int64_t>(1, p.batch / 4);
      add("--micro-batch " + std::to_string(mb), [mb](Run& q) {
        q.trainer.micro_batch = mb;
        q.trainer.accum = 0;
      });
    }
    if (p.dtype == DType::kF32) add("--dtype bf16", [](Run& q) { q.dtype = DType::kBF16; });
    if (!p.trainer.offload) add("--offload", [](Run& q) { q.trainer.offload = true; });
    add("all of these", [&](Run& q) {
      q.trainer.checkpoint = "all";
      q.trainer.micro_batch = 1;
      q.trainer.accum = 0;
      if (q.dtype == DType::kF32) q.dtype = DType::kBF16;
      q.trainer.offload = true;
    });
    for (const Alt& a : alts) {
      const Peaks n = dry_run(a.plan);
      msg += "\n    " + a.label + ": " + format_bytes(n.reserved) +
             (n.reserved <= p.conf.budget ? " (fits)" : "");
    }
  } catch (const Error& e) {
    msg += "\n  (the dry run failed too: " + std::string(e.what()) + ")";
  }
  throw InvalidArgument(msg);
}

std::string progress_line(const StepResult& r, std::int64_t step, std::int64_t total,
                          double tokens_per_s, bool show_scale, bool tty) {
  char buf[256];
  std::string bar;
  if (tty) {
    constexpr int kWidth = 20;
    const auto done = static_cast<int>(kWidth * step / std::max<std::int64_t>(1, total));
    bar = "[" + std::string(static_cast<std::size_t>(done), '#') +
          std::string(static_cast<std::size_t>(kWidth - done), '.') + "] ";
  }
  std::snprintf(buf, sizeof buf,
                "%sstep %*lld/%lld  loss %.4f  %8.0f tok/s  peak %s reserved, %s allocated",
                bar.c_str(), static_cast<int>(std::to_string(total).size()),
                static_cast<long long>(step), static_cast<long long>(total), r.loss, tokens_per_s,
                format_bytes(r.peak_reserved).c_str(), format_bytes(r.peak_allocated).c_str());
  std::string s = buf;
  if (show_scale) s += "  scale " + std::to_string(static_cast<long long>(r.loss_scale));
  if (r.skipped) s += "  (skipped: inf/NaN gradients)";
  return s;
}

nlohmann::json by_category_json(const std::array<std::size_t, kCategoryCount>& a) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t c = 0; c < kCategoryCount; ++c)
    j[category_name(static_cast<Category>(c))] = a[c];
  return j;
}

void check_common(const TrainArgs& a) {
  if (a.steps < 1) throw InvalidArgument("--steps " + std::to_string(a.steps) + " must be >= 1");
  if (!std::isfinite(a.lr) || a.lr < 0) {
    throw InvalidArgument("--lr " + std::to_string(a.lr) + " must be a finite value >= 0");
  }
}

ModelSpec load_text_model(const std::string& name, const char* where) {
  ModelSpec spec = ModelSpec::load(name);
  if (spec.vocab < TextDataset::kVocab) {
    throw InvalidArgument(std::string(where) + " " + name + " has vocab " +
                          std::to_string(spec.vocab) + "; byte-level text needs vocab >= " +
                          std::to_string(TextDataset::kVocab) + " (gpt-tiny has 256)");
  }
  return spec;
}

Run make_run(const TrainArgs& a) {
  if (a.model.empty()) {
    throw InvalidArgument("--model is required (a built-in name or a YAML spec), or --plan FILE");
  }
  if (given(a, "--device")) {
    throw InvalidArgument("--device " + a.device +
                          " is for planning: give --budget and no policy flags (--dtype, "
                          "--checkpoint, --micro-batch, --accum, --offload), or use --plan");
  }
  if (a.batch < 1) throw InvalidArgument("--batch " + std::to_string(a.batch) + " must be >= 1");
  if (a.micro_batch < 0 || a.accum < 0) {
    throw InvalidArgument("--micro-batch and --accum must be >= 1 when given");
  }
  if (a.micro_batch > 0 && a.accum > 0) {
    throw InvalidArgument("give --micro-batch or --accum, not both");
  }
  Run p;
  p.spec = load_text_model(a.model, "--model");
  p.dtype = parse_dtype(a.dtype);
  p.batch = a.batch;
  p.seq_len = a.seq_len > 0 ? a.seq_len : p.spec.seq_len;
  if (a.seq_len < 0 || p.seq_len > p.spec.seq_len) {
    throw InvalidArgument("--seq-len " + std::to_string(a.seq_len) + ": valid is 1.." +
                          std::to_string(p.spec.seq_len) + " (the model's seq_len)");
  }
  checked_mul(static_cast<std::size_t>(p.batch), static_cast<std::size_t>(p.seq_len),
              "--batch * seq_len");
  p.trainer.checkpoint = a.checkpoint;
  Schedule::parse(a.checkpoint,
                  static_cast<int>(p.spec.layers));  // the error names the valid specs
  p.trainer.micro_batch = std::min(a.micro_batch, a.batch);
  p.trainer.accum = a.accum;
  if (a.accum > 0) split_batch(a.batch, a.accum);  // says which batch sizes split into K
  p.trainer.offload = a.offload;
  p.trainer.adamw.lr = a.lr;
  p.trainer.seed = a.seed;
  p.conf = parse_alloc_conf(a.alloc_conf);
  if (!a.budget.empty()) {
    p.conf.budget = parse_size(a.budget);
    if (p.conf.budget == 0) throw InvalidArgument("--budget must be positive (e.g. 96MiB)");
  }
  return p;
}

// --budget with no policy flags: the planner's recommendation for this model and budget
// (largest micro-batch, or with --batch the fastest way to train that global batch).
Plan plan_for_budget(const TrainArgs& a, std::size_t& feasible) {
  if (a.model.empty())
    throw InvalidArgument("--model is required (a built-in name or a YAML spec)");
  PlannerOptions o;
  o.spec = load_text_model(a.model, "--model");
  o.device = DeviceSpec::load(a.device.empty() ? "cpu" : a.device);
  o.budget = parse_size(a.budget);
  if (o.budget == 0) throw InvalidArgument("--budget must be positive (e.g. 96MiB)");
  if (a.seq_len < 0 || a.seq_len > o.spec.seq_len) {
    throw InvalidArgument("--seq-len " + std::to_string(a.seq_len) + ": valid is 1.." +
                          std::to_string(o.spec.seq_len) + " (the model's seq_len)");
  }
  o.seq_len = a.seq_len;
  o.alloc_conf = parse_alloc_conf(a.alloc_conf);  // the settings this run's allocator gets
  if (given(a, "--batch")) {
    if (a.batch < 1) throw InvalidArgument("--batch " + std::to_string(a.batch) + " must be >= 1");
    o.global_batch = a.batch;
  }
  const PlanResult r = plan(o);
  feasible = r.candidates.size();
  return r.recommended;
}

// A plan (from a file or the planner) as a run: its model, seq_len, global batch and
// policies; learning rate and seed from the command line; --budget, when given, replaces the
// plan's (the CPU "device" is limited to it).
Run run_from_plan(const Plan& plan, const TrainArgs& a, const std::string& where) {
  if (plan.ranks > 1) {
    throw InvalidArgument(where + " is a per-rank plan for " + std::to_string(plan.ranks) +
                          " data-parallel ranks; memfit train runs one process (plan with "
                          "--ranks 1)");
  }
  Run p;
  p.spec = plan.model;
  if (p.spec.vocab < TextDataset::kVocab) {
    throw InvalidArgument(
        where + ": model " + p.spec.name + " has vocab " + std::to_string(p.spec.vocab) +
        "; byte-level text needs vocab >= " + std::to_string(TextDataset::kVocab));
  }
  p.dtype = plan.dtype;
  p.seq_len = plan.seq_len > 0 ? plan.seq_len : p.spec.seq_len;
  p.batch = plan.global_batch > 0
                ? plan.global_batch
                : static_cast<std::int64_t>(checked_mul(static_cast<std::size_t>(plan.micro_batch),
                                                        static_cast<std::size_t>(plan.accum_steps),
                                                        "micro_batch * accum_steps"));
  p.trainer = plan.trainer_options();
  p.trainer.adamw.lr = a.lr;
  p.trainer.seed = a.seed;
  p.conf = parse_alloc_conf(a.alloc_conf);
  p.conf.budget = plan.budget;
  if (!a.budget.empty()) {
    p.conf.budget = parse_size(a.budget);
    if (p.conf.budget == 0) throw InvalidArgument("--budget must be positive (e.g. 96MiB)");
  }
  return p;
}

// Where the policies come from: a plan file, the planner, or the command line.
struct Source {
  std::optional<Plan> plan;
  std::string kind;  // "file", "planner", "" (command line)
  std::size_t feasible = 0;
};

Source choose(const TrainArgs& a) {
  Source s;
  if (!a.plan_file.empty()) {
    for (const char* f : {"--model", "--seq-len", "--batch", "--device", "--dtype", "--checkpoint",
                          "--micro-batch", "--accum", "--offload"}) {
      if (given(a, f)) {
        throw InvalidArgument(std::string(f) + " with --plan " + a.plan_file +
                              ": the plan fixes the model, seq_len, batch and policies; drop " + f +
                              " or edit the plan");
      }
    }
    s.plan = Plan::load(a.plan_file);
    s.kind = "file";
    return s;
  }
  const bool policy = std::any_of(std::begin(kPolicyFlags), std::end(kPolicyFlags),
                                  [&](const char* f) { return given(a, f); });
  if (!a.budget.empty() && !policy) {
    s.plan = plan_for_budget(a, s.feasible);
    s.kind = "planner";
  }
  return s;
}

Peaks plan_peaks(const Plan& plan) {
  Peaks k;
  k.reserved = plan.predicted.peak_reserved;
  k.allocated = plan.predicted.peak_allocated;
  k.by_category = plan.predicted.peak_by_category;
  return k;
}

int run_train(const TrainArgs& a) {
  check_common(a);
  const Source src = choose(a);
  const Run p = src.plan ? run_from_plan(*src.plan, a,
                                         src.kind == "file" ? "--plan " + a.plan_file
                                                            : std::string("the plan"))
                         : make_run(a);
  const TextDataset data(a.data);
  data.require_seq_len(p.seq_len);

  std::optional<Peaks> predicted;
  if (src.plan) {
    const Plan& pl = *src.plan;
    if (src.kind == "planner") {
      std::printf("memfit train: planned %s under %s on %s (%s): %zu plans fit\n",
                  pl.model.name.c_str(), format_bytes(pl.budget).c_str(), pl.device.c_str(),
                  given(a, "--batch") ? "fastest for --batch" : "largest micro-batch",
                  src.feasible);
    } else {
      std::printf("memfit train: plan %s (made for %s on %s)\n", a.plan_file.c_str(),
                  format_bytes(pl.budget).c_str(), pl.device.c_str());
    }
    std::printf("  plan: %s; predicted peak reserved %s\n", describe_plan(pl).c_str(),
                format_bytes(pl.predicted.peak_reserved).c_str());
    if (!pl.why.empty()) std::printf("  why: %s\n", pl.why.c_str());
    if (pl.predicted.peak_reserved > 0) predicted = plan_peaks(pl);
  }
  if (a.predict && !predicted) predicted = dry_run(p);

  CpuBackend be({.worker_streams = p.trainer.offload});
  HostProvider host;
  CachingAllocator alloc(host, p.conf, &be.stream_sync());
  // The CPU GEMM's f16/bf16 widening scratch counts against the budget, as a device's GEMM
  // workspace would; the dry runs (this file's and the planner's) make the same allocations.
  be.set_workspace_allocator(&alloc);
  LayerContext ctx{be, alloc, kDefaultStream, p.dtype};
  std::unique_ptr<Model> model;
  std::unique_ptr<Trainer> trainer;
  try {
    model = std::make_unique<Model>(p.spec, ctx);
    trainer = std::make_unique<Trainer>(*model, ctx, p.trainer);
  } catch (const OutOfMemory& e) {
    budget_too_small(p, a.budget, e);
  }
  if (!a.resume.empty()) trainer->load(a.resume);
  const std::int64_t start = trainer->steps_attempted();

  std::printf("memfit train: %s (%lld parameters) on %s (%lld bytes)\n", p.describe().c_str(),
              static_cast<long long>(model->parameter_count()), a.data.c_str(),
              static_cast<long long>(data.size()));
  std::printf("  schedule %s, %s, loss scaling %s%s%s\n", trainer->schedule().name().c_str(),
              trainer->optimizer().name(), trainer->scaler().enabled() ? "on" : "off",
              p.conf.budget ? (", budget " + format_bytes(p.conf.budget)).c_str() : "",
              a.resume.empty() ? "" : (", resumed at step " + std::to_string(start)).c_str());
  std::fflush(stdout);

  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  Peaks measured;
  std::vector<double> losses;
  std::int64_t skipped = 0, tokens = 0, micro_batches = 0;
  double seconds = 0, last_scale = 1;
  for (std::int64_t i = 1; i <= a.steps; ++i) {
    const Batch b = data.sample(p.batch, p.seq_len, trainer->rng());
    StepResult r;
    try {
      r = trainer->step(b);
    } catch (const OutOfMemory& e) {
      if (i > 1) throw;
      budget_too_small(p, a.budget, e);
    }
    measured.take_max(r);
    losses.push_back(r.loss);
    skipped += r.skipped ? 1 : 0;
    tokens += r.tokens;
    seconds += r.seconds;
    micro_batches = r.micro_batches;
    last_scale = r.loss_scale;
    const std::string line =
        progress_line(r, start + i, start + a.steps, static_cast<double>(r.tokens) / r.seconds,
                      trainer->scaler().enabled(), tty);
    std::printf(tty ? "\r%s\033[K" : "%s\n", line.c_str());
    std::fflush(stdout);
  }
  if (tty) std::printf("\n");
  if (!a.save.empty()) trainer->save(a.save);

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
  if (!a.save.empty()) std::printf("  state: %s\n", a.save.c_str());

  if (!a.summary_json.empty()) {
    nlohmann::json j;
    j["model"] = p.spec.name;
    j["parameters"] = model->parameter_count();
    j["dtype"] = dtype_name(p.dtype);
    j["checkpoint"] = p.trainer.checkpoint;
    j["schedule"] = trainer->schedule().name();
    j["batch"] = p.batch;
    j["seq_len"] = p.seq_len;
    j["micro_batch"] = p.trainer.micro_batch;
    j["accum"] = p.trainer.accum;
    j["micro_batches"] = micro_batches;
    j["offload"] = p.trainer.offload;
    j["optimizer"] = trainer->optimizer().name();
    j["loss_scaling"] = trainer->scaler().enabled();
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
    if (src.plan) {
      j["plan"] = plan_json(*src.plan);
      j["plan_source"] = src.kind;
      j["why"] = src.plan->why;
      if (src.kind == "file") j["plan_file"] = a.plan_file;
    }
    j["allocator_stats"] = alloc.stats().as_map();
    if (!a.save.empty()) j["saved_to"] = a.save;
    if (!a.resume.empty()) j["resumed_from"] = a.resume;
    std::ofstream f(a.summary_json);
    if (!f)
      throw InvalidArgument("--summary-json '" + a.summary_json + "': cannot open for writing");
    f << j.dump(2) << "\n";
    if (!f) throw InvalidArgument("--summary-json '" + a.summary_json + "': write failed");
    std::printf("  summary: %s\n", a.summary_json.c_str());
  }
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a model on a text file on the CPU with memory policies, under a budget");
  // A repeated option takes its last value, so scripts/demo.sh's defaults can be overridden.
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--model", a->model,
                  "a built-in model (gpt-tiny, gpt-micro, gpt2, ...) or a YAML spec file "
                  "(required unless --plan)");
  cmd->add_option("--data", a->data,
                  "a text file; tokens are its bytes (data/corpus.txt is bundled)")
      ->required();
  cmd->add_option("--steps", a->steps, "training steps to run")->required();
  cmd->add_option("--batch", a->batch, "global batch (sequences per step)")->capture_default_str();
  cmd->add_option("--micro-batch", a->micro_batch, "sequences per micro-batch (accumulated)");
  cmd->add_option("--accum", a->accum, "or: split the batch into this many micro-batches");
  cmd->add_option("--seq-len", a->seq_len, "tokens per sequence (default: the model's)");
  cmd->add_option("--dtype", a->dtype, "weights in use and activations: f32 | f16 | bf16")
      ->capture_default_str();
  cmd->add_option("--checkpoint", a->checkpoint, "none | all | sqrt | every:K")
      ->capture_default_str();
  cmd->add_flag("--offload", a->offload,
                "FP32 masters and Adam moments in pinned host memory, CPU AdamW");
  cmd->add_option("--budget", a->budget,
                  "allocator budget on the CPU device (96MiB, 1GiB, ...); with no policy flag "
                  "(--dtype --checkpoint --micro-batch --accum --offload) memfit plans first: "
                  "the largest micro-batch, or with --batch the fastest plan for that batch");
  cmd->add_option("--device", a->device,
                  "when planning: the device preset or YAML file the plan is for (default cpu)");
  cmd->add_option("--plan", a->plan_file,
                  "train with a plan file from `memfit plan --out` (model, seq_len, batch, "
                  "policies); --lr, --seed, --budget still apply");
  cmd->add_option("--seed", a->seed, "initialization and data sampling")->capture_default_str();
  cmd->add_option("--lr", a->lr, "AdamW learning rate")->capture_default_str();
  cmd->add_option("--save", a->save, "write the training state here at the end (atomic)");
  cmd->add_option("--resume", a->resume, "continue from a saved training state");
  cmd->add_option("--summary-json", a->summary_json, "write the summary as JSON here");
  cmd->add_option("--alloc-conf", a->alloc_conf,
                  "allocator settings, MEMFIT_ALLOC_CONF syntax (default: the variable)");
  cmd->add_flag("--predict", a->predict,
                "dry-run one step on the meta backend first; print its peak beside the measured");
  cmd->callback([a, cmd, &exit_code] {
    a->given.clear();
    for (const CLI::Option* o : cmd->get_options()) {
      if (o->count() > 0) a->given.push_back(o->get_name());
    }
    if (a->alloc_conf.empty()) {
      if (const char* env = std::getenv("MEMFIT_ALLOC_CONF")) a->alloc_conf = env;
    }
    exit_code = run_train(*a);
  });
}

}  // namespace memfit::cli
