#include "cli/train_setup.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "cli/plan_command.h"
#include "core/meta/meta_backend.h"
#include "core/text_dataset.h"
#include "memory/check.h"
#include "memory/null_provider.h"
#include "memory/size.h"
#include "policies/accumulation.h"
#include "policies/device_spec.h"
#include "policies/dry_run.h"
#include "policies/planner.h"
#include "profiler/atomic_file.h"

#if MEMFIT_HAVE_CUDA
#include "profiler/cuda/cupti_tracer.h"
#define MEMFIT_CLI_CUPTI 1
#else
#define MEMFIT_CLI_CUPTI 0
#endif

namespace memfit::cli {

// ---- options --------------------------------------------------------------------------------

bool given(const TrainArgs& a, const std::string& name) {
  return std::find(a.given.begin(), a.given.end(), name) != a.given.end();
}

namespace {

// The flags that choose a memory policy: with none of them, --budget plans.
const char* const kPolicyFlags[] = {"--dtype", "--checkpoint", "--micro-batch", "--accum",
                                    "--offload"};

}  // namespace

void add_run_options(CLI::App* cmd, TrainArgs& a) {
  cmd->add_option("--model", a.model,
                  "a built-in model (gpt-tiny, gpt-micro, gpt2, ...) or a YAML spec file "
                  "(required unless --plan)");
  cmd->add_option("--batch", a.batch, "global batch (sequences per step)")->capture_default_str();
  cmd->add_option("--micro-batch", a.micro_batch, "sequences per micro-batch (accumulated)");
  cmd->add_option("--accum", a.accum, "or: split the batch into this many micro-batches");
  cmd->add_option("--seq-len", a.seq_len, "tokens per sequence (default: the model's)");
  cmd->add_option("--dtype", a.dtype, "weights in use and activations: f32 | f16 | bf16")
      ->capture_default_str();
  cmd->add_option("--checkpoint", a.checkpoint, "none | all | sqrt | every:K")
      ->capture_default_str();
  cmd->add_flag("--offload", a.offload,
                "FP32 masters and Adam moments in pinned host memory, CPU AdamW");
  cmd->add_option("--budget", a.budget,
                  "allocator budget on the device (96MiB, 1GiB, ...); with no policy flag "
                  "(--dtype --checkpoint --micro-batch --accum --offload) memfit plans first: "
                  "the largest micro-batch, or with --batch the fastest plan for that batch");
  cmd->add_option("--device", a.device,
                  "when planning: the device preset or YAML file the plan is for (default cpu; "
                  "required with --backend cuda)");
  cmd->add_option("--plan", a.plan_file,
                  "train with a plan file from `memfit plan --out` (model, seq_len, batch, "
                  "policies); --lr, --seed, --budget still apply");
  cmd->add_option("--seed", a.seed, "initialization and data sampling")->capture_default_str();
  cmd->add_option("--lr", a.lr, "AdamW learning rate")->capture_default_str();
  cmd->add_option("--alloc-conf", a.alloc_conf,
                  "allocator settings, MEMFIT_ALLOC_CONF syntax (default: the variable)");
  cmd->add_flag("--predict", a.predict,
                "dry-run one step on the meta backend first; print its peak beside the measured");
  cmd->add_option("--backend", a.backend,
                  "cpu | cuda (CUDA builds with a GPU): where the model trains")
      ->capture_default_str();
  cmd->add_option("--formats", a.formats,
                  "report files, comma-separated: summary, csv, trace, pickle, html, or all")
      ->capture_default_str();
}

void collect_given(CLI::App* cmd, TrainArgs& a) {
  a.given.clear();
  for (const CLI::Option* o : cmd->get_options()) {
    if (o->count() > 0) a.given.push_back(o->get_name());
  }
  if (a.alloc_conf.empty()) {
    if (const char* env = std::getenv("MEMFIT_ALLOC_CONF")) a.alloc_conf = env;
  }
}

// ---- the run ----------------------------------------------------------------------------------

std::string Run::describe() const {
  std::string s = spec.name + ", " + dtype_name(dtype) + ", checkpoint " + trainer.checkpoint +
                  ", batch " + std::to_string(batch) + " x " + std::to_string(seq_len);
  if (trainer.micro_batch > 0) s += ", micro-batch " + std::to_string(trainer.micro_batch);
  if (trainer.accum > 0) s += ", accum " + std::to_string(trainer.accum);
  if (trainer.offload) s += ", offload";
  return s;
}

void Peaks::take_max(const StepResult& r) {
  reserved = std::max(reserved, r.peak_reserved);
  allocated = std::max(allocated, r.peak_allocated);
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    by_category[c] = std::max(by_category[c], r.peak_by_category[c]);
  }
}

// The real allocator and executor with no arithmetic, so the peak includes rounding and
// fragmentation; the backend's GEMM workspace is modelled as the run's backend makes it.
Peaks dry_run(const Run& p) {
  MetaBackend meta;
  NullProvider null;
  AllocatorConfig conf = p.conf;
  conf.budget = 0;
  CachingAllocator alloc(null, conf, &meta.stream_sync());
  meta.set_workspace_allocator(&alloc);  // the CPU run's GEMM scratch, or cuBLASLt's workspace
  if (p.backend == "cuda") meta.set_gemm_workspace_bytes(kGpuGemmWorkspaceBytes);
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

namespace {

std::string mib_ceil(std::size_t bytes) {
  return std::to_string((bytes + kMiB - 1) / kMiB) + "MiB";
}

void check_common(const TrainArgs& a) {
  if (a.steps < 1) throw InvalidArgument("--steps " + std::to_string(a.steps) + " must be >= 1");
  if (!std::isfinite(a.lr) || a.lr < 0) {
    throw InvalidArgument("--lr " + std::to_string(a.lr) + " must be a finite value >= 0");
  }
  if (a.backend != "cpu" && a.backend != "cuda") {
    throw InvalidArgument("--backend '" + a.backend + "': valid are cpu, cuda");
  }
  if (a.backend == "cuda") {
    std::string why;
    if (!cuda_runtime_available(&why)) {
      throw InvalidArgument("--backend cuda: " + why + "; valid here: --backend cpu");
    }
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
  if (a.backend == "cuda" && a.device.empty()) {
    throw InvalidArgument(
        "--budget with no policy flags plans for a device: with --backend cuda give --device "
        "(a preset such as h100-80g, or a YAML file), or give policy flags");
  }
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
// plan's (the device is limited to it).
Run run_from_plan(const Plan& plan, const TrainArgs& a, const std::string& where) {
  if (plan.ranks > 1) {
    throw InvalidArgument(where + " is a per-rank plan for " + std::to_string(plan.ranks) +
                          " data-parallel ranks; memfit trains one process (plan with "
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

}  // namespace

Prepared prepare(const TrainArgs& a) {
  check_common(a);
  Prepared out;
  out.formats = parse_formats(a.formats);  // checked even without a report: a typo is a typo
  out.src = choose(a);
  out.run = out.src.plan ? run_from_plan(*out.src.plan, a,
                                         out.src.kind == "file" ? "--plan " + a.plan_file
                                                                : std::string("the plan"))
                         : make_run(a);
  out.run.backend = a.backend;
  return out;
}

void predict(Prepared& p, const TrainArgs& a, bool want) {
  if (p.src.plan && p.src.plan->predicted.peak_reserved > 0) {
    p.predicted = plan_peaks(*p.src.plan);
  }
  if ((a.predict || want) && !p.predicted) p.predicted = dry_run(p.run);
}

void print_plan_source(const char* command, const TrainArgs& a, const Prepared& p) {
  if (!p.src.plan) return;
  const Plan& pl = *p.src.plan;
  if (p.src.kind == "planner") {
    std::printf("memfit %s: planned %s under %s on %s (%s): %zu plans fit\n", command,
                pl.model.name.c_str(), format_bytes(pl.budget).c_str(), pl.device.c_str(),
                given(a, "--batch") ? "fastest for --batch" : "largest micro-batch",
                p.src.feasible);
  } else {
    std::printf("memfit %s: plan %s (made for %s on %s)\n", command, a.plan_file.c_str(),
                format_bytes(pl.budget).c_str(), pl.device.c_str());
  }
  std::printf("  plan: %s; predicted peak reserved %s\n", describe_plan(pl).c_str(),
              format_bytes(pl.predicted.peak_reserved).c_str());
  if (!pl.why.empty()) std::printf("  why: %s\n", pl.why.c_str());
}

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

// ---- the session --------------------------------------------------------------------------

#if MEMFIT_CLI_CUPTI
class CuptiSession {
 public:
  CuptiSession() { tracer_.start(); }
  void finish(ProfileReport& r) {
    tracer_.stop();
    r.gpu = tracer_.take();
    r.gpu_dropped = tracer_.dropped();
  }

 private:
  CuptiTracer tracer_;
};
#else
class CuptiSession {
 public:
  void finish(ProfileReport&) {}
};
#endif

Session::Session() = default;
Session::Session(Session&&) noexcept = default;
Session::~Session() {
  // The trainer and model free their blocks into the allocator; the recorder stops listening
  // before the allocator goes (member order does the rest).
  trainer.reset();
  model.reset();
  cupti.reset();
  recorder.reset();
}

Session open_session(const Run& p, const std::string& budget_text, bool record) {
  Session s;
  s.env = make_runtime(p.backend, p.conf, {.worker_streams = p.trainer.offload});
  if (record) {
    s.recorder = std::make_unique<Recorder>(*s.env.alloc);
#if MEMFIT_CLI_CUPTI
    std::string why;
    if (s.env.name == "cuda") {
      if (CuptiTracer::available(&why)) {
        try {
          s.cupti = std::make_unique<CuptiSession>();
        } catch (const Error& e) {  // the run is still worth recording without GPU activity
          std::printf("  (no GPU activity in the report: CUPTI failed to start: %s)\n", e.what());
        }
      } else {
        std::printf("  (no GPU activity in the report: CUPTI unavailable: %s)\n", why.c_str());
      }
    }
#endif
  }
  s.ctx = std::make_unique<LayerContext>(
      LayerContext{*s.env.backend, *s.env.alloc, kDefaultStream, p.dtype});
  try {
    s.model = std::make_unique<Model>(p.spec, *s.ctx);
    s.trainer = std::make_unique<Trainer>(*s.model, *s.ctx, p.trainer);
  } catch (const OutOfMemory& e) {
    budget_too_small(p, budget_text, e);
  }
  return s;
}

StepResult train_step(Session& s, const Run& p, const std::string& budget_text, const Batch& b,
                      bool first) {
  try {
    return s.trainer->step(b);
  } catch (const OutOfMemory& e) {
    if (!first) throw;
    budget_too_small(p, budget_text, e);
  }
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

// ---- the report ---------------------------------------------------------------------------

ProfileReport finish_report(Session& s, const Prepared& p, std::int64_t steps) {
  MEMFIT_CHECK(s.recorder != nullptr);
  // Queued work (worker streams, GPU kernels) finishes before the figures are read.
  s.env.backend->synchronize(kDefaultStream);
  s.recorder->stop();
  ProfileReport r = make_report(s.recorder->recording(), *s.env.alloc, p.run.spec.name, s.env.name);
  r.steps = steps;
  r.device_total_bytes = s.env.device_total_bytes;
  if (s.cupti) s.cupti->finish(r);
  if (p.predicted) {
    r.plan.present = true;
    r.plan.predicted_peak_reserved = p.predicted->reserved;
    r.plan.predicted_peak_allocated = p.predicted->allocated;
    r.plan.description = p.src.plan ? describe_plan(*p.src.plan) + " (" +
                                          (p.src.kind == "file" ? "plan file" : "planner") + ")"
                                    : p.run.describe() + " (dry run)";
  }
  return r;
}

void write_report(const ProfileReport& r, const std::string& dir,
                  const std::vector<ExportFormat>& formats) {
  const std::vector<std::string> written = export_report(r, dir, formats);
  std::printf("  report in %s:\n", dir.c_str());
  for (std::size_t i = 0; i < written.size(); ++i) {
    static const char* const kOpensIn[] = {
        "peaks, plan vs measured, allocator stats",
        "a spreadsheet: bytes by category over time",
        "ui.perfetto.dev or chrome://tracing",
        "pytorch.org/memory_viz",
        "a browser",
    };
    std::printf("    %-16s %s\n", export_file_name(formats[i]),
                kOpensIn[static_cast<int>(formats[i])]);
  }
  std::printf("  %s\n", see_memory_usage_line(r.stats).c_str());
  if (r.plan.present) {
    const Recording& rec = r.recording;
    std::printf("  plan vs measured: peak reserved %s predicted, %s measured",
                format_bytes(r.plan.predicted_peak_reserved).c_str(),
                format_bytes(rec.peak_reserved).c_str());
    if (r.plan.predicted_peak_reserved > 0) {
      std::printf(" (measured/predicted %.3f)",
                  static_cast<double>(rec.peak_reserved) /
                      static_cast<double>(r.plan.predicted_peak_reserved));
    }
    std::printf("\n");
  }
  if (r.recording.dropped_events > 0 || r.recording.dropped_ranges > 0 || r.gpu_dropped > 0) {
    std::printf("  dropped: %llu allocator events, %llu ranges, %llu GPU records (peaks exact)\n",
                static_cast<unsigned long long>(r.recording.dropped_events),
                static_cast<unsigned long long>(r.recording.dropped_ranges),
                static_cast<unsigned long long>(r.gpu_dropped));
  }
}

}  // namespace memfit::cli
