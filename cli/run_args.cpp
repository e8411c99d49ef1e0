#include "cli/run_args.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "cli/terminal_text.h"
#include "core/comm/communicator.h"
#include "core/text_dataset.h"
#include "memory/size.h"
#include "policies/device_spec.h"
#include "policies/dry_run.h"
#include "policies/planner.h"
#include "policies/runtime_env.h"
#include "profiler/atomic_file.h"

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

namespace {

template <typename T>
CLI::Validator exact_integer(const char* desc) {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        T v{};
        const char* end = s.data() + s.size();
        const auto [p, ec] = std::from_chars(s.data(), end, v);
        if (s.empty() || ec != std::errc() || p != end) {
          return "'" + s + "' is not an integer from " +
                 std::to_string(std::numeric_limits<T>::min()) + " to " +
                 std::to_string(std::numeric_limits<T>::max());
        }
        return {};
      },
      desc);
}

}  // namespace

void reject_empty(const char* flag, bool given, const std::string& value, const char* what) {
  if (given && value.empty()) {
    throw InvalidArgument(std::string(flag) + " \"\": " + what +
                          "; valid: a value (leave the flag out for its default)");
  }
}

CLI::Validator exact_int32() { return exact_integer<std::int32_t>("INT"); }
CLI::Validator exact_int64() { return exact_integer<std::int64_t>("INT"); }
CLI::Validator exact_uint64() { return exact_integer<std::uint64_t>("UINT"); }

void add_run_options(CLI::App* cmd, TrainArgs& a) {
  cmd->add_option("--model", a.model,
                  "a built-in model (gpt-tiny, llama-micro, gpt2, llama-3.1-8b, ...), a YAML "
                  "spec file or a HuggingFace config.json (required unless --plan)");
  cmd->add_option("--batch", a.batch, "global batch (sequences per step)")
      ->capture_default_str()
      ->check(exact_int64());
  cmd->add_option("--micro-batch", a.micro_batch, "sequences per micro-batch (accumulated)")
      ->check(exact_int64());
  cmd->add_option("--accum", a.accum, "or: split the batch into this many micro-batches")
      ->check(exact_int64());
  cmd->add_option("--seq-len", a.seq_len, "tokens per sequence (default: the model's)")
      ->check(exact_int64());
  cmd->add_option("--dtype", a.dtype, "weights in use and activations: f32 | f16 | bf16")
      ->capture_default_str();
  cmd->add_option("--checkpoint", a.checkpoint, "none | all | sqrt | every:K")
      ->capture_default_str();
  cmd->add_option("--loss", a.loss,
                  "chunked (the loss's logits in chunks of rows, recomputed in the backward: "
                  "never more memory) | whole (all saved; one GEMM less)")
      ->capture_default_str();
  cmd->add_option("--offload", a.offload,
                  "to pinned host memory: optimizer (FP32 masters and Adam moments, CPU AdamW; "
                  "what a bare --offload means), gradients (FP32 gradients streamed out stage "
                  "by stage through two device buckets), weights (working weights fetched for "
                  "each block's use into two device buffers; not with a delayed update), "
                  "activations (checkpointed block inputs, copied out in the forward and "
                  "fetched back one recompute ahead; needs a checkpoint schedule to move "
                  "anything), all, or a comma-separated list; gradients and weights need the "
                  "optimizer's")
      ->expected(0, 1);
  cmd->add_option("--budget", a.budget,
                  "allocator budget on the device (96MiB, 1GiB, ...); with no policy flag "
                  "(--dtype --checkpoint --micro-batch --accum --offload) memfit plans first: "
                  "the largest micro-batch, or with --batch the fastest plan for that batch");
  cmd->add_option("--host-budget", a.host_budget,
                  "pinned host memory offload may take (64GiB, ...); a plan that pins more does "
                  "not fit; default: this machine's available memory less a margin of a tenth "
                  "of its memory (at least 1 GiB), and less --budget on the CPU backend");
  cmd->add_option("--device", a.device,
                  "when planning: the device preset or YAML file the plan is for (default cpu; "
                  "required with --backend cuda)");
  cmd->add_option("--plan", a.plan_file,
                  "train with a plan file from `memfit plan --out` (model, seq_len, batch, "
                  "policies); --lr, --clip-grad-norm, --seed, --budget still apply");
  cmd->add_option("--seed", a.seed, "initialization and data sampling")
      ->capture_default_str()
      ->check(exact_uint64());
  cmd->add_option("--lr", a.lr, "AdamW learning rate")->capture_default_str();
  cmd->add_option("--clip-grad-norm", a.max_grad_norm,
                  "clip the gradients' global L2 norm to this (PyTorch's clip_grad_norm_), on "
                  "the device or on the host under --offload gradients; 0: off")
      ->capture_default_str();
  cmd->add_option("--alloc-conf", a.alloc_conf,
                  "allocator settings, MEMFIT_ALLOC_CONF syntax (default: the variable; with "
                  "--plan, the plan's alloc_conf when neither is given)");
  cmd->add_flag("--predict", a.predict,
                "dry-run one step on the meta backend first; print its peak beside the measured");
  cmd->add_option("--backend", a.backend,
                  "cpu | cuda (CUDA builds with a GPU): where the model trains")
      ->capture_default_str();
  cmd->add_option("--formats", a.formats,
                  "report files, comma-separated: summary, csv, trace, pickle, html, or all")
      ->capture_default_str();
  cmd->add_option("--ranks", a.ranks,
                  "data-parallel ranks, launched by mpirun (mpirun -np N memfit train ... "
                  "--ranks N); each rank steps on its share of every global --batch; default: "
                  "the launch's")
      ->check(exact_int32());
  cmd->add_option("--zero", a.zero,
                  "ZeRO stage over the ranks: 0 (each rank holds everything), 1 (FP32 masters "
                  "and Adam moments sharded by rank), 2 (gradients too)")
      ->capture_default_str()
      ->check(exact_int32());
  cmd->add_flag("--no-overlap", a.no_overlap,
                "with ranks: sum each backward stage's gradients before the next stage starts "
                "instead of beside it (ZeRO-2 then holds one stage's gradients less)");
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

std::int64_t seq_len_flag(const ModelSpec& spec, std::int64_t requested) {
  try {
    return spec.resolve_seq_len(requested);
  } catch (const InvalidArgument& e) {
    // Its message starts "seq_len N: ..."; the flag is spelled --seq-len.
    throw InvalidArgument("--" + std::string(e.what()).replace(0, 7, "seq-len"));
  }
}

std::size_t parse_budget(const std::string& text, const char* flag) {
  const std::size_t b = parse_size(text);
  if (b == 0)
    throw InvalidArgument(std::string(flag) + " " + text + " must be positive (e.g. 96MiB)");
  return b;
}

std::string use_measured_cpu_rates(PlannerOptions& o, const std::string& device_arg,
                                   bool remeasure) {
  if (device_arg != "cpu" || o.calibrate) return "";
  std::string note;
  o.cpu_rates = CpuRates::cached(&note, remeasure);
  o.device = o.cpu_rates->apply(o.device);
  return note;
}

bool planner_chooses_allocator(const std::string& alloc_conf) {
  return alloc_conf.find("expandable_segments") == std::string::npos;
}

namespace {

void check_common(const TrainArgs& a) {
  if (a.steps < 1) throw InvalidArgument("--steps " + std::to_string(a.steps) + " must be >= 1");
  // A flag given with 0 or "" is a mistake, not "not given" (its default): say so.
  for (const auto& [flag, value] :
       {std::pair<const char*, std::int64_t>{"--micro-batch", a.micro_batch},
        {"--accum", a.accum},
        {"--seq-len", a.seq_len}}) {
    if (given(a, flag) && value < 1) {
      throw InvalidArgument(std::string(flag) + " " + std::to_string(value) +
                            "; valid: 1 or more (leave the flag out for its default)");
    }
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, const std::string*>{"--budget", &a.budget},
        {"--host-budget", &a.host_budget},
        {"--alloc-conf", &a.alloc_conf},
        {"--plan", &a.plan_file},
        {"--model", &a.model},
        {"--report", &a.report},
        {"--out", &a.report},
        {"--device", &a.device}}) {
    reject_empty(flag, given(a, flag), *value);
  }
  // Past 1e6 AdamW's step size stops being a number worth training with (1e308 overflows it
  // to -inf); std::to_string would print 1e308 as 309 digits, so the text is %g.
  if (!std::isfinite(a.lr) || a.lr < 0 || a.lr > 1e6) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", a.lr);
    throw InvalidArgument(std::string("--lr ") + text + "; valid: a learning rate in [0, 1e6]");
  }
  if (!std::isfinite(a.max_grad_norm) || a.max_grad_norm < 0) {
    throw InvalidArgument("--clip-grad-norm " + std::to_string(a.max_grad_norm) +
                          "; valid: a finite norm > 0, or 0 for no clipping");
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

DeviceKind backend_kind(const TrainArgs& a) {
  return a.backend == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
}

// --host-budget, or this machine's default for the backend and device budget.
std::size_t host_budget_of(const TrainArgs& a, std::size_t device_budget) {
  if (!a.host_budget.empty()) return parse_budget(a.host_budget, "--host-budget");
  return default_host_budget(backend_kind(a), device_budget);
}

std::string host_budget_label(const TrainArgs& a, std::size_t budget) {
  if (!a.host_budget.empty()) return "--host-budget " + a.host_budget;
  return "the default host budget " + format_bytes(budget) +
         ": available memory less a margin; --host-budget sets it";
}

void require_text_vocab(const ModelSpec& spec, const std::string& where) {
  if (spec.vocab < TextDataset::kVocab) {
    throw InvalidArgument(where + ": model " + spec.name + " has vocab " +
                          std::to_string(spec.vocab) + "; byte-level text needs vocab >= " +
                          std::to_string(TextDataset::kVocab) + " (gpt-tiny has 256)");
  }
}

}  // namespace

ModelSpec load_model(const std::string& name) {
  std::vector<std::string> notes;
  ModelSpec spec = ModelSpec::load(name, &notes);
  for (const std::string& n : notes) say_to(stderr, "note: %s\n", n.c_str());
  return spec;
}

LossMode parse_loss_flag(const std::string& text) {
  LossMode m = LossMode::kChunked;
  if (!parse_loss_mode(text, &m)) {
    throw InvalidArgument("--loss " + text +
                          ": valid: chunked (the logits in chunks of rows, recomputed in the "
                          "backward) or whole (all of them saved)");
  }
  return m;
}

namespace {

ModelSpec load_text_model(const std::string& name) {
  if (name.empty()) {
    throw InvalidArgument(
        "--model is required (a built-in name, a YAML spec or a HuggingFace config.json), or "
        "--plan FILE");
  }
  ModelSpec spec = load_model(name);
  require_text_vocab(spec, "--model " + name);
  return spec;
}

// The policy flags, parsed once into the library's typed policy.
RunSpec run_from_flags(const TrainArgs& a) {
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
  RunSpec r;
  r.model = load_text_model(a.model);
  r.batch = a.batch;
  r.seq_len = seq_len_flag(r.model, a.seq_len);
  MemoryPolicy& p = r.trainer.policy;
  p.dtype = parse_dtype(a.dtype);
  p.checkpoint = Checkpointing::parse(a.checkpoint, static_cast<int>(r.model.layers));
  if (p.checkpoint.needs_solving()) {
    throw InvalidArgument(
        "--checkpoint optimal is solved per micro-batch by the planner: give --budget with no "
        "policy flags, or `memfit plan --out plan.yaml` and --plan plan.yaml");
  }
  p.micro_batch = std::min(a.micro_batch, a.batch);
  p.accum = a.accum;
  p.loss = parse_loss_flag(a.loss);
  if (given(a, "--offload")) {
    p.offload = OffloadSwitches::parse(a.offload.empty() ? "optimizer" : a.offload);
  }
  r.alloc = parse_alloc_conf(a.alloc_conf);
  if (!a.budget.empty()) r.alloc.budget = parse_budget(a.budget);
  return r;
}

// --budget with no policy flags: the planner's recommendation for this model and budget
// (largest micro-batch, or with --batch the fastest way to train that global batch).
Plan plan_for_budget(const TrainArgs& a, std::size_t& feasible) {
  if (a.backend == "cuda" && a.device.empty()) {
    throw InvalidArgument(
        "--budget with no policy flags plans for a device: with --backend cuda give --device "
        "(a preset such as h100-80g, or a YAML file), or give policy flags");
  }
  PlannerOptions o;
  o.spec = load_text_model(a.model);
  o.device = DeviceSpec::load(a.device.empty() ? "cpu" : a.device);
  use_measured_cpu_rates(o, a.device.empty() ? "cpu" : a.device);
  o.budget = parse_budget(a.budget);
  o.seq_len = seq_len_flag(o.spec, a.seq_len);
  o.alloc_conf = parse_alloc_conf(a.alloc_conf);  // the settings this run's allocator gets
  o.choose_allocator = planner_chooses_allocator(a.alloc_conf);
  o.loss = parse_loss_flag(a.loss);
  o.host_budget = host_budget_of(a, o.budget);  // this machine's host memory
  // One rank of a multi-rank run plans for its own rank (set_ranks checks the launch after).
  o.ranks = given(a, "--ranks") ? std::max(1, a.ranks) : launch_info().world_size;
  o.zero_stage = o.ranks > 1 ? a.zero : 0;
  o.overlap_comm = !a.no_overlap;
  if (given(a, "--batch")) {
    if (a.batch < 1) throw InvalidArgument("--batch " + std::to_string(a.batch) + " must be >= 1");
    o.global_batch = a.batch;
  }
  const PlanResult r = plan(o);
  feasible = r.candidates.size();
  return r.recommended;
}

// A plan (from a file or the planner) as a run: Plan::run_spec, with the learning rate and
// seed from the command line; --budget replaces the plan's budget, and --alloc-conf (or
// MEMFIT_ALLOC_CONF) the allocator settings the plan assumed, when given.
RunSpec run_from_plan(const Plan& plan, const TrainArgs& a, const std::string& where) {
  RunSpec r;
  try {
    r = plan.run_spec();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(where + ": " + e.what());
  }
  require_text_vocab(r.model, where);
  const std::size_t budget = r.alloc.budget;
  if (!a.alloc_conf.empty()) r.alloc = parse_alloc_conf(a.alloc_conf);
  r.alloc.budget = a.budget.empty() ? budget : parse_budget(a.budget);
  return r;
}

Source choose(const TrainArgs& a) {
  Source s;
  if (!a.plan_file.empty()) {
    for (const char* f : {"--model", "--seq-len", "--batch", "--device", "--dtype", "--checkpoint",
                          "--micro-batch", "--accum", "--offload", "--loss"}) {
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

// The library's diagnosis, with the flags that make each alternative.
std::string budget_text(const BudgetError& e, const TrainArgs& a, const RunSpec& run) {
  const BudgetDiagnosis& d = e.diagnosis();
  return diagnosis_text(d, run, "--budget " + a.budget + " (" + format_bytes(d.budget) + ")",
                        [](const BudgetDiagnosis::Alternative& alt) -> std::string {
                          using Change = BudgetDiagnosis::Change;
                          switch (alt.change) {
                            case Change::kCheckpointAll:
                              return "--checkpoint all";
                            case Change::kMicroBatch:
                              return "--micro-batch " +
                                     std::to_string(alt.spec.trainer.policy.micro_batch);
                            case Change::kBF16:
                              return "--dtype bf16";
                            case Change::kOffload:
                              return "--offload all";
                            case Change::kAllOfThese:
                              break;
                          }
                          return alt.label;  // "all of these"
                        });
}

// The ranks of this launch (core/comm: mpirun's environment) as the run's: --ranks must agree
// with them (or a plan's ranks must), --zero (or the plan's stage) sets the ZeRO stage.
void set_ranks(Prepared& out, const TrainArgs& a) {
  const LaunchInfo l = launch_info();
  const Plan* plan = out.src.kind == "file" ? &*out.src.plan : nullptr;
  if (given(a, "--zero") && plan != nullptr) {
    throw InvalidArgument("--zero with --plan " + a.plan_file +
                          ": the plan fixes the ZeRO stage (zero_stage); drop --zero or edit "
                          "the plan");
  }
  if (a.no_overlap && plan != nullptr) {
    throw InvalidArgument("--no-overlap with --plan " + a.plan_file +
                          ": the plan fixes it (overlap_comm); drop --no-overlap or edit the "
                          "plan");
  }
  if (given(a, "--zero") && (a.zero < 0 || a.zero > 2)) {
    throw InvalidArgument("--zero " + std::to_string(a.zero) +
                          ": valid: 0 (data parallel), 1 (optimizer state sharded) or 2 "
                          "(gradients too)");
  }
  if (given(a, "--ranks") && a.ranks < 1) {
    throw InvalidArgument("--ranks " + std::to_string(a.ranks) + ": valid: 1 or more");
  }
  int ranks = l.world_size;
  std::string from = "the launch";
  if (plan != nullptr && plan->ranks > 1) ranks = plan->ranks, from = "--plan " + a.plan_file;
  if (given(a, "--ranks")) ranks = a.ranks, from = "--ranks";
  if (ranks != l.world_size) {
    const std::string launch =
        l.launcher.empty() ? std::string("one process, not launched by mpirun")
                           : std::to_string(l.world_size) + " processes by " + l.launcher;
    throw InvalidArgument(from + " says " + std::to_string(ranks) + " ranks, but this run is " +
                          launch + "; valid: mpirun -np " + std::to_string(ranks) +
                          " memfit train ... (as many processes as ranks)");
  }
  out.run.ranks = ranks;
  out.run.rank = l.rank;
  if (given(a, "--zero")) out.run.trainer.zero_stage = a.zero;
  if (a.no_overlap) out.run.trainer.overlap_comm = false;
  if (ranks > 1 && out.run.batch % ranks != 0) {
    throw InvalidArgument("--batch " + std::to_string(out.run.batch) + " over " +
                          std::to_string(ranks) + " ranks: valid: a multiple of " +
                          std::to_string(ranks) + " (each rank steps on batch / ranks samples)");
  }
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
                         : run_from_flags(a);
  out.run.trainer.adamw.lr = a.lr;
  out.run.trainer.max_grad_norm = a.max_grad_norm;
  out.run.trainer.seed = a.seed;
  out.run.device = backend_kind(a);
  out.run.trainer.host_budget = host_budget_of(a, out.run.alloc.budget);
  set_ranks(out, a);
  out.run.validate();
  return out;
}

void predict(Prepared& p, const TrainArgs& a, bool want) {
  if (p.src.plan && p.src.plan->predicted.peaks.reserved > 0) {
    p.predicted = p.src.plan->predicted.peaks;
  }
  // Each rank of a multi-rank run predicts its own peak (its chunks), by its own dry run.
  const bool own = p.run.ranks > 1 && (a.predict || want || p.predicted);
  if (own || ((a.predict || want) && !p.predicted)) {
    RunSpec unbudgeted = p.run;
    unbudgeted.alloc.budget = 0;
    p.predicted = dry_run(unbudgeted).step;
  }
}

void check_fits_machine(const Prepared& p, const TrainArgs& a) {
  if (p.run.device != DeviceKind::kCpu || p.run.alloc.budget > 0) return;
  const HostMemory mem = host_memory();
  if (mem.available == 0) return;  // /proc/meminfo unreadable: nothing to check against
  // The same margin the host budget keeps (policies/runtime_env.h): filling the machine to the
  // last byte stalls or kills it.
  const std::size_t margin = std::max(kGiB, mem.total / 10);
  const std::size_t usable = mem.available > margin ? mem.available - margin : 0;
  RunSpec unbudgeted = p.run;
  unbudgeted.alloc.budget = 0;
  const DryRunResult d = dry_run(unbudgeted);
  const std::size_t tokens = 2 * sizeof(std::int32_t) * static_cast<std::size_t>(p.run.batch) *
                             static_cast<std::size_t>(p.run.resolved_seq_len());
  const std::size_t need =
      std::max(d.step.reserved, d.setup_peak_reserved) + d.host_pinned + tokens;
  if (need <= usable) return;
  std::string msg = p.run.describe() + " needs " + format_bytes(need) +
                    " on the cpu backend (a dry run of one step: " +
                    format_bytes(std::max(d.step.reserved, d.setup_peak_reserved)) +
                    " for the step, " + format_bytes(d.host_pinned) +
                    " pinned for offload), but this machine has " + format_bytes(mem.available) +
                    " available, " + format_bytes(usable) + " after a margin of " +
                    format_bytes(margin) + "; nothing was allocated.";
  try {
    PlannerOptions o;
    o.spec = p.run.model;
    o.device = DeviceSpec::load("cpu");
    use_measured_cpu_rates(o, "cpu");
    o.budget = usable;
    o.seq_len = p.run.resolved_seq_len();
    o.alloc_conf = p.run.alloc;
    o.alloc_conf.budget = 0;
    o.loss = p.run.trainer.policy.loss;
    o.host_budget = host_budget_of(a, usable);
    o.global_batch = p.run.batch;  // the fastest way to this run's batch
    const PlanResult r = plan(o);
    const std::string budget = std::to_string(usable >> 20) + "MiB";
    msg += "\nWhat fits here for a batch of " + std::to_string(p.run.batch) + ": " +
           r.recommended.describe() + " (`memfit plan --model " +
           (a.model.empty() ? p.run.model.name : a.model) + " --device cpu --budget " + budget +
           " --global-batch " + std::to_string(p.run.batch) +
           "`); to train with it, give --budget " + budget + " and no policy flags.";
  } catch (const InvalidArgument& e) {
    const std::string why = e.what();
    msg += "\nNo plan fits in " + format_bytes(usable) + " either (" +
           why.substr(0, why.find('\n')) + "): a smaller model or a shorter --seq-len.";
  }
  throw InvalidArgument(msg);
}

void print_plan_source(const char* command, const TrainArgs& a, const Prepared& p) {
  if (!p.src.plan) return;
  const Plan& pl = *p.src.plan;
  if (p.src.kind == "planner") {
    say("memfit %s: planned %s under %s on %s (%s): %zu plans fit\n", command,
        pl.model.name.c_str(), format_bytes(pl.budget).c_str(), pl.device.c_str(),
        given(a, "--batch") ? "fastest for --batch" : "largest micro-batch", p.src.feasible);
  } else {
    say("memfit %s: plan %s (made for %s on %s)\n", command, a.plan_file.c_str(),
        format_bytes(pl.budget).c_str(), pl.device.c_str());
  }
  say("  plan: %s; predicted peak reserved %s\n", pl.describe().c_str(),
      format_bytes(pl.predicted.peaks.reserved).c_str());
  if (!pl.why.empty()) say("  why: %s\n", pl.why.c_str());
}

std::unique_ptr<RunSetup> open_run(const Prepared& p, const TrainArgs& a, bool record) {
  try {
    auto run = std::make_unique<RunSetup>(p.run, RunSetupOptions{.record = record});
    for (const std::string& n : run->notes()) say("  (%s)\n", n.c_str());
    return run;
  } catch (const BudgetError& e) {
    throw InvalidArgument(budget_text(e, a, p.run));
  } catch (const HostBudgetError& e) {
    throw InvalidArgument(std::string(e.what()) + " [" + host_budget_label(a, e.budget()) + "]");
  }
}

StepResult train_step(RunSetup& run, const TrainArgs& a, const Batch& b) {
  try {
    return run.step(b);
  } catch (const BudgetError& e) {
    throw InvalidArgument(budget_text(e, a, run.spec()));
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
                format_bytes(r.peaks.reserved).c_str(), format_bytes(r.peaks.allocated).c_str());
  std::string s = buf;
  if (show_scale) s += "  scale " + std::to_string(static_cast<long long>(r.loss_scale));
  if (r.grad_norm > 0 && std::isfinite(r.grad_norm)) {
    char g[64];
    std::snprintf(g, sizeof g, "  grad norm %.3g%s", r.grad_norm, r.clipped ? " (clipped)" : "");
    s += g;
  }
  if (r.skipped) s += "  (skipped: inf/NaN gradients)";
  return s;
}

// ---- the report ---------------------------------------------------------------------------

ProfileReport finish_report(RunSetup& run, const Prepared& p, std::int64_t steps,
                            const char* command) {
  ProfileReport r = run.finish_report(steps);
  r.command = command;
  if (p.predicted) {
    r.plan.present = true;
    r.plan.predicted_peak_reserved = p.predicted->reserved;
    r.plan.predicted_peak_allocated = p.predicted->allocated;
    r.plan.predicted_host_pinned = p.predicted->host_pinned;
    r.plan.description = p.src.plan ? p.src.plan->describe() + " (" +
                                          (p.src.kind == "file" ? "plan file" : "planner") + ")"
                                    : p.run.describe() + " (dry run)";
  }
  return r;
}

void write_report(const ProfileReport& r, const std::string& dir,
                  const std::vector<ExportFormat>& formats) {
  const std::vector<std::string> written = export_report(r, dir, formats);
  say("  report in %s:\n", dir.c_str());
  for (std::size_t i = 0; i < written.size(); ++i) {
    static const char* const kOpensIn[] = {
        "the steps' and the whole run's peaks, plan vs measured, allocator stats",
        "a spreadsheet: one row per allocator event, with the totals after it",
        "ui.perfetto.dev, chrome://tracing or speedscope",
        "pytorch.org/memory_viz",
        "a browser (any screen): chart with hover readout and zoom, tables",
    };
    say("    %-16s %s\n", export_file_name(formats[i]), kOpensIn[static_cast<int>(formats[i])]);
  }
  say("  DeepSpeed's see_memory_usage line: %s\n", see_memory_usage_line(r.stats).c_str());
  const Recording& rec = r.recording;
  if (rec.peak.allocated > rec.steps_peak().allocated ||
      rec.peak_reserved > rec.steps_peak_reserved()) {
    const std::string_view phase = interned_name(rec.peak.phase);
    say("  whole run (setup included): peak reserved %s, allocated %s (%s)\n",
        format_bytes(rec.peak_reserved).c_str(), format_bytes(rec.peak.allocated).c_str(),
        phase.empty() ? "outside any phase" : std::string(phase).c_str());
  }
  if (r.plan.present) {
    say("  plan vs measured (the steps' peak): peak reserved %s predicted, %s measured",
        format_bytes(r.plan.predicted_peak_reserved).c_str(),
        format_bytes(rec.steps_peak_reserved()).c_str());
    if (r.plan.predicted_peak_reserved > 0) {
      say(" (measured/predicted %.3f)", static_cast<double>(rec.steps_peak_reserved()) /
                                            static_cast<double>(r.plan.predicted_peak_reserved));
    }
    say("\n");
  }
  if (r.recording.dropped_events > 0 || r.recording.dropped_ranges > 0 || r.gpu_dropped > 0) {
    say("  dropped: %llu allocator events, %llu ranges, %llu GPU records (peaks exact)\n",
        static_cast<unsigned long long>(r.recording.dropped_events),
        static_cast<unsigned long long>(r.recording.dropped_ranges),
        static_cast<unsigned long long>(r.gpu_dropped));
  }
}

}  // namespace memfit::cli
