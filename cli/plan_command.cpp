#include "cli/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/outputs.h"
#include "cli/run_args.h"
#include "cli/terminal_text.h"
#include "core/model_spec.h"
#include "memory/alloc_conf.h"
#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"
#include "policies/device_rates.h"
#include "policies/device_spec.h"
#include "policies/planner.h"
#include "policies/runtime_env.h"
#include "profiler/atomic_file.h"

namespace memfit::cli {

namespace {

struct PlanArgs {
  std::string model;
  std::string device;
  std::string budget;
  std::string host_budget;  // "": no host limit (the plan is usually for another machine)
  std::int64_t seq_len = 0;
  std::int64_t global_batch = 0;
  int ranks = 1;
  int zero = 0;
  bool no_overlap = false;
  bool calibrate = false;
  std::string format = "table";
  std::string out;
  std::int64_t top = 0;
  std::string alloc_conf;
  bool measure_context = false;
  bool measure = false;
  std::string device_out;  // --measure on a CUDA device: the measured device file
  std::string loss = "chunked";
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Short forms that keep a table row on one line.
std::string short_bytes(std::size_t b) {
  char buf[32];
  if (b == 0) return "0";
  if (b < kMiB) {
    std::snprintf(buf, sizeof buf, "%.0fK", double(b) / double(kKiB));
  } else if (b < kGiB) {
    std::snprintf(buf, sizeof buf, "%.1fM", double(b) / double(kMiB));
  } else {
    std::snprintf(buf, sizeof buf, "%.2fG", double(b) / double(kGiB));
  }
  return buf;
}

std::string short_seconds(double s) {
  char buf[32];
  if (s <= 0) return "-";
  if (s < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.0fus", s * 1e6);
  } else if (s < 1) {
    std::snprintf(buf, sizeof buf, "%.1fms", s * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.2fs", s);
  }
  return buf;
}

std::string short_rate(double r) {
  char buf[32];
  if (r <= 0) return "-";
  if (r >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2fM", r / 1e6);
  } else if (r >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.1fk", r / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", r);
  }
  return buf;
}

// "off", "opt" (the optimizer's), "opt+grad" (and its gradients), "opt+wt" (and the weights),
// "o+g+w" (all three), "all" (and the checkpointed activations), "act" (activations only);
// "+dpu": the delayed update.
const char* offload_column(const OffloadSwitches& o) {
  if (!o.any()) return "off";
  if (o.activations) {
    if (o.gradients && o.weights) return "all";
    if (!o.optimizer) return "act";
    return o.gradients ? "o+g+a" : o.weights ? "o+w+a" : "opt+act";
  }
  if (o.gradients && o.weights) return "o+g+w";
  if (o.weights) return "opt+wt";
  if (o.gradients) return o.delayed_update ? "o+g+dpu" : "opt+grad";
  return o.delayed_update ? "opt+dpu" : "opt";
}

// The breakdown columns are the bytes by category at the moment of the reserved peak plus the
// cached bytes then, so each row's columns add up to its peak.
void print_table(const PlanResult& r, std::int64_t top) {
  say("%-5s %-10s %-8s %6s %5s | %9s = %8s %8s %8s %8s %8s %8s | %8s | %9s %9s\n", "dtype",
      "checkpoint", "offload", "micro", "accum", "peak res.", "params", "grads", "optim", "activ",
      "other", "cached", "host", "step", "tokens/s");
  say("%s\n", std::string(140, '-').c_str());
  std::int64_t rows = 0;
  for (const Plan& p : r.candidates) {
    if (top > 0 && rows == top) break;
    ++rows;
    const PeakFigures& k = p.predicted.peaks;
    const std::size_t other = k.at_peak_of(Category::kTemporary) + k.at_peak_of(Category::kInput) +
                              k.at_peak_of(Category::kWorkspace) + k.at_peak_of(Category::kUnknown);
    say("%-5s %-10s %-8s %6lld %5lld | %9s = %8s %8s %8s %8s %8s %8s | %8s | %9s %9s\n",
        dtype_name(p.policy.dtype), p.policy.checkpoint.name().c_str(),
        offload_column(p.policy.offload), static_cast<long long>(p.policy.micro_batch),
        static_cast<long long>(p.accum_steps), short_bytes(k.reserved).c_str(),
        short_bytes(k.at_peak_of(Category::kParameter)).c_str(),
        short_bytes(k.at_peak_of(Category::kGradient)).c_str(),
        short_bytes(k.at_peak_of(Category::kOptimizerState)).c_str(),
        short_bytes(k.at_peak_of(Category::kActivation)).c_str(), short_bytes(other).c_str(),
        short_bytes(k.cached()).c_str(), short_bytes(k.host_pinned).c_str(),
        short_seconds(p.predicted.step_seconds).c_str(),
        short_rate(p.predicted.tokens_per_second).c_str());
  }
  if (rows < static_cast<std::int64_t>(r.candidates.size())) {
    say("(%lld more; --top 0 shows all)\n",
        static_cast<long long>(r.candidates.size()) - static_cast<long long>(rows));
  }
  // ZeRO-1/2 with optimizer, gradient or weight offload (not built yet): one line, not one a
  // combination; --format json lists each.
  std::size_t not_offered = 0;
  for (const std::string& s : r.infeasible) {
    if (s.find(kNotOfferedWithZero) != std::string::npos) {
      ++not_offered;
      continue;
    }
    say("does not fit: %s\n", s.c_str());
  }
  if (not_offered > 0) {
    say("not offered: %zu combinations with optimizer, gradient or weight offload (%s; "
        "--format json lists them)\n",
        not_offered, kNotOfferedWithZero);
  }
}

void validate(const PlanArgs& a) {
  if (a.model.empty()) {
    throw InvalidArgument("--model is required: a preset (" + join(ModelSpec::preset_names()) +
                          ") or a YAML spec file or a HuggingFace config.json");
  }
  if (a.device.empty()) {
    throw InvalidArgument("--device is required: a preset (" + join(DeviceSpec::preset_names()) +
                          ") or a YAML device file");
  }
  if (a.format != "table" && a.format != "json" && a.format != "yaml") {
    throw InvalidArgument("--format '" + a.format + "': valid are table, json, yaml");
  }
  if (!a.out.empty() && !ends_with(a.out, ".yaml") && !ends_with(a.out, ".yml") &&
      !ends_with(a.out, ".json")) {
    throw InvalidArgument("--out '" + a.out +
                          "': the format follows the extension; valid are .yaml, .yml, .json");
  }
  if (a.global_batch < 0) {
    throw InvalidArgument("--global-batch " + std::to_string(a.global_batch) + " must be >= 1");
  }
  if (a.ranks < 1) throw InvalidArgument("--ranks " + std::to_string(a.ranks) + " must be >= 1");
  if (a.zero < 0 || a.zero > 2) {
    throw InvalidArgument("--zero " + std::to_string(a.zero) +
                          ": valid are 0 (no sharding), 1 (optimizer state), 2 (+ gradients)");
  }
  if (a.zero > 0 && a.ranks == 1) {
    throw InvalidArgument("--zero " + std::to_string(a.zero) +
                          " shards across data-parallel ranks: give --ranks N (N >= 2) with it");
  }
  if (a.top < 0) throw InvalidArgument("--top " + std::to_string(a.top) + " must be >= 0");
  if (a.measure && a.calibrate) {
    throw InvalidArgument(
        "--measure and --calibrate: give one (--measure measures the device's "
        "rates, --calibrate fits the cost model from profiled steps)");
  }
  if (!a.device_out.empty()) {
    if (!a.measure || a.device == "cpu") {
      throw InvalidArgument("--device-out '" + a.device_out +
                            "' is where --measure with a CUDA device (h100-80g, a kind-cuda "
                            "file) writes the measured device; give it with those (--device cpu "
                            "--measure keeps this CPU's rates in its cache instead)");
    }
    if (!ends_with(a.device_out, ".yaml") && !ends_with(a.device_out, ".yml")) {
      throw InvalidArgument("--device-out '" + a.device_out +
                            "': a device file is YAML; valid: a path ending in .yaml or .yml");
    }
  }
}

// --measure with any device but `cpu`: this machine's GPU is measured against that device.
bool measures_gpu(const PlanArgs& a) { return a.measure && a.device != "cpu"; }

// For --measure on a GPU, before anything runs or is written: the device must be kind cuda and
// this machine must have a usable GPU. Returns where the measured device file goes:
// --device-out, else "<device name>-measured.yaml" in the current directory (characters other
// than letters, digits, '.', '_' and '-' of the name become '_').
std::string measured_device_path(const PlanArgs& a) {
  const DeviceSpec d = DeviceSpec::load(a.device);
  if (d.kind != DeviceKind::kCuda) {
    throw InvalidArgument("--measure with --device " + a.device +
                          ": a kind-cpu device's rates are this machine's CPU's; valid: "
                          "--device cpu --measure, or a CUDA device on a machine with its GPU");
  }
  std::string why;
  if (!cuda_runtime_available(&why)) {
    throw InvalidArgument("--measure with --device " + a.device +
                          " measures this machine's GPU, and there is none here (" + why +
                          "); without --measure " + d.name +
                          "'s own rates are used, and --device cpu --measure measures this "
                          "machine's CPU");
  }
  if (!a.device_out.empty()) return a.device_out;
  std::string name = d.name;
  for (char& c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return name + "-measured.yaml";
}

// "3.35 T" + unit, "52.1 G" + unit: SI prefixes, as device files accept them.
std::string si_rate(double v, const char* unit) {
  char buf[48];
  static constexpr const char* kPrefix[] = {"P", "T", "G", "M", "k"};
  static constexpr double kFactor[] = {1e15, 1e12, 1e9, 1e6, 1e3};
  const char* prefix = "";
  double x = v;
  for (std::size_t i = 0; i < std::size(kFactor); ++i) {
    if (v >= kFactor[i]) {
      prefix = kPrefix[i];
      x = v / kFactor[i];
      break;
    }
  }
  std::snprintf(buf, sizeof buf, x < 10 ? "%.2f %s%s" : "%.1f %s%s", x, prefix, unit);
  return buf;
}

// What --measure measured on this GPU, beside the figures of the file it was measured against.
void print_measured(const MeasuredDevice& m, std::FILE* to) {
  say_to(to,
         "measured on this GPU in %.1f s (GEMMs of %lld^3, f32 %lld^3 without TF32; copies of "
         "%s; each the median of %d):\n",
         m.rates.seconds, static_cast<long long>(m.options.gemm_size),
         static_cast<long long>(m.options.gemm_size_f32),
         format_bytes(static_cast<std::size_t>(m.options.copy_bytes)).c_str(), m.options.reps);
  const std::string file_col = m.file.name + "'s file";
  say_to(to, "  %-14s %16s %16s %7s\n", "figure", "measured", file_col.c_str(), "ratio");
  for (const MeasuredFigure& f : m.figures()) {
    const char* unit = f.key.rfind("flops", 0) == 0 ? "FLOP/s" : "B/s";
    const std::string got =
        f.bytes ? format_bytes(static_cast<std::size_t>(f.measured)) : si_rate(f.measured, unit);
    const std::string had =
        f.bytes ? format_bytes(static_cast<std::size_t>(f.file)) : si_rate(f.file, unit);
    say_to(to, "  %-14s %16s %16s %6.2fx\n", f.key.c_str(), got.c_str(), had.c_str(), f.ratio());
  }
  say_to(to,
         "  (mem_bandwidth: bytes read + written by device copies; host_link: the slower\n"
         "   direction of pinned copies: host to device %s, device to host %s)\n",
         si_rate(m.rates.host_to_device, "B/s").c_str(),
         si_rate(m.rates.device_to_host, "B/s").c_str());
  const double total = static_cast<double>(m.device_total_bytes);
  const double file_memory = static_cast<double>(m.file.memory_bytes);
  if (total > 0 && (total < 0.9 * file_memory || total > 1.1 * file_memory)) {
    say_to(to,
           "  note: this GPU has %s, %s's file says %s: the file's memory is kept (is %s the "
           "device file for this GPU?)\n",
           format_bytes(m.device_total_bytes).c_str(), m.file.name.c_str(),
           format_bytes(m.file.memory_bytes).c_str(), m.file.name.c_str());
  }
}

// --measure-context: what the CUDA context and the backend's library handles take on this
// machine's GPU (cudaMemGetInfo, CudaBackend::context_info via RuntimeEnv) replaces the
// device file's estimate. Returns the figure the file had.
std::size_t measure_context(DeviceSpec& device) {
  std::string why;
  if (!cuda_runtime_available(&why)) {
    throw InvalidArgument("--measure-context needs a CUDA device here (" + why +
                          "); without it the device's own context figure is used (" +
                          format_bytes(device.context_bytes) + " for " + device.name + ")");
  }
  const std::size_t before = device.context_bytes;
  const RuntimeEnv env = make_runtime(DeviceKind::kCuda, AllocatorConfig{});
  device.context_bytes = env.context_bytes;
  return before;
}

PlannerOptions planner_options(const PlanArgs& a, std::size_t* context_was = nullptr,
                               std::string* rates_note = nullptr,
                               MeasuredDevice* measured = nullptr) {
  PlannerOptions o;
  o.spec = load_model(a.model);
  o.loss = parse_loss_flag(a.loss);
  o.device = DeviceSpec::load(a.device);
  if (a.measure_context && !measures_gpu(a)) {  // --measure measures the context too
    const std::size_t was = measure_context(o.device);
    if (context_was != nullptr) *context_was = was;
  }
  if (!a.budget.empty()) {
    o.budget = parse_budget(a.budget);
    if (o.budget > o.device.memory_bytes) {
      throw InvalidArgument("--budget " + a.budget + " (" + format_bytes(o.budget) +
                            ") is more than " + o.device.name + " has (" +
                            format_bytes(o.device.memory_bytes) + "; usable " +
                            format_bytes(o.device.usable_bytes()) + " after its context)");
    }
  }
  if (!a.host_budget.empty()) o.host_budget = parse_budget(a.host_budget, "--host-budget");
  o.seq_len = seq_len_flag(o.spec, a.seq_len);
  o.global_batch = a.global_batch;
  o.ranks = a.ranks;
  o.zero_stage = a.zero;
  o.overlap_comm = !a.no_overlap;
  o.calibrate = a.calibrate;
  const std::string note = use_measured_cpu_rates(o, a.device, a.measure);
  if (rates_note != nullptr) *rates_note = note;
  // The allocator's tuning is part of the prediction: the same settings `memfit train` uses.
  o.alloc_conf = parse_alloc_conf(a.alloc_conf);
  o.choose_allocator = planner_chooses_allocator(a.alloc_conf);
  if (measures_gpu(a)) {  // last: every other flag is checked before the GPU is busy
    MEMFIT_CHECK(measured != nullptr);
    *measured = measure_cuda_device(o.device);
    o.device = measured->measured;
    if (context_was != nullptr) *context_was = measured->file.context_bytes;
  }
  return o;
}

// Beside the largest micro-batch: the fastest plan that fits, and what the last few percent
// of the batch cost in throughput (PlanResult::fastest, near_largest).
void print_trade_offs(const PlanResult& r) {
  const Plan& rec = r.recommended;
  const double tps = rec.predicted.tokens_per_second;
  if (r.fastest) {
    const Plan& f = *r.fastest;
    say("  fastest that fits: %s (%s tokens/s predicted, %.2fx the recommended plan's)\n",
        f.describe().c_str(), short_rate(f.predicted.tokens_per_second).c_str(),
        tps > 0 ? f.predicted.tokens_per_second / tps : 0.0);
  }
  if (r.near_largest) {
    const Plan& n = *r.near_largest;
    const double fewer = 1.0 - double(n.policy.micro_batch) / double(rec.policy.micro_batch);
    const double cost = n.predicted.tokens_per_second > 0
                            ? 1.0 - tps / n.predicted.tokens_per_second
                            : 0.0;
    say("  the last %.1f%% of the batch cost %.0f%% of the throughput: %s runs at %s tokens/s\n",
        100.0 * fewer, 100.0 * cost, n.describe().c_str(),
        short_rate(n.predicted.tokens_per_second).c_str());
  }
}

int run_plan(const PlanArgs& a) {
  validate(a);
  const std::string device_out = measures_gpu(a) ? measured_device_path(a) : "";
  // Before measuring and planning.
  const std::vector<OutputLock> held =
      claim_outputs({{"--out", a.out}, {"--device-out", device_out}});
  std::size_t context_was = 0;
  std::string rates_note;
  MeasuredDevice measured;
  const PlannerOptions o = planner_options(a, &context_was, &rates_note, &measured);
  if (measures_gpu(a)) {
    // Written before planning: the measurement stands whether or not anything fits. stderr
    // when stdout carries JSON or YAML, so it stays parseable.
    std::FILE* to = a.format == "table" ? stdout : stderr;
    print_measured(measured, to);
    std::vector<std::string> failed;
    write_or_rescue(
        "--device-out", device_out, false,
        [&](const std::string& path) {
          write_file_atomic(path, measured.to_yaml());
          say_to(to, "measured device written to %s: plan with --device %s\n\n", path.c_str(),
                 path.c_str());
        },
        failed);
    finish_outputs(failed);
  }
  const PlanResult r = plan(o);
  MEMFIT_CHECK(!r.candidates.empty());  // the planner throws when nothing fits
  const Plan& rec = r.recommended;

  if (a.format == "json") {
    // Each plan is Plan::to_json's document: what --out plan.json writes, key for key.
    auto doc = [](const Plan& p) { return nlohmann::ordered_json::parse(p.to_json()); };
    nlohmann::ordered_json j;
    j["recommended"] = doc(rec);
    j["candidates"] = nlohmann::ordered_json::array();
    for (const Plan& p : r.candidates) j["candidates"].push_back(doc(p));
    j["infeasible"] = r.infeasible;
    j["fastest"] = r.fastest ? doc(*r.fastest) : nullptr;
    j["near_largest"] = r.near_largest ? doc(*r.near_largest) : nullptr;
    say("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (a.format == "yaml") {
    say("%s", rec.to_yaml().c_str());
  } else {
    const std::size_t budget = o.budget ? o.budget : o.device.usable_bytes();
    say("memfit plan: %s (%lld parameters, seq_len %lld) on %s, budget %s%s, %s\n",
        o.spec.name.c_str(), static_cast<long long>(o.spec.parameter_count()),
        static_cast<long long>(rec.seq_len), o.device.name.c_str(), format_bytes(budget).c_str(),
        o.budget ? "" : " (the device's memory less its context)",
        o.global_batch > 0 ? ("fastest global batch of " + std::to_string(o.global_batch)).c_str()
                           : "largest micro-batch");
    if (a.measure_context) {
      say("  context measured on this GPU: %s (%s's file says %s)\n",
          format_bytes(o.device.context_bytes).c_str(), o.device.name.c_str(),
          format_bytes(context_was).c_str());
    }
    if (o.ranks > 1) {
      // The planner dry-runs rank 0 (the largest ZeRO shards): no rank reserves more.
      say("  per rank: rank 0 of %d data-parallel ranks, ZeRO stage %d, each stepping on "
          "micro x accum samples of the global batch; time is one rank's compute plus its "
          "collectives at %s/s (rank_link)\n",
          o.ranks, o.zero_stage, format_bytes(static_cast<std::size_t>(o.device.rank_link)).c_str());
    }
    say("  peaks are dry runs of one step through the real allocator; time is %s\n\n",
        o.calibrate ? "calibrated on this machine"
        : o.cpu_rates
            ? ("the dry run's ops at this CPU's measured rates (" + rates_note + ")").c_str()
        : measures_gpu(a) ? "analytic (flops and bytes / the rates measured on this GPU)"
                          : "analytic (flops and bytes / rates)");
    print_table(r, a.top);
    say("(columns after '=': bytes at the moment of the peak, adding up to it; host: pinned host "
        "bytes; each category's own peak: --format json, predicted.category_peaks)\n");
    say("\nrecommended: %s\n  predicted peak reserved %s, %s per step, %s tokens/s\n",
        rec.describe().c_str(), format_bytes(rec.predicted.peaks.reserved).c_str(),
        short_seconds(rec.predicted.step_seconds).c_str(),
        short_rate(rec.predicted.tokens_per_second).c_str());
    const PeakFigures& pk = rec.predicted.peaks;
    // Per parameter: what the model's size sets (activation offload's room follows the batch).
    const std::size_t acts = pk.host_at_peak[category_index(Category::kActivation)];
    say("  pinned host memory: %s (%.1f bytes per parameter%s)%s\n",
        format_bytes(pk.host_pinned).c_str(),
        static_cast<double>(pk.host_pinned - std::min(pk.host_pinned, acts)) /
            static_cast<double>(o.spec.parameter_count()),
        acts > 0 ? (" + " + format_bytes(acts) + " of offloaded checkpoints").c_str() : "",
        o.host_budget > 0 ? (" of a host budget of " + format_bytes(o.host_budget)).c_str()
                          : "; no host budget given (--host-budget)");
    std::string parts;
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      if (pk.host_at_peak[c] == 0) continue;
      parts += (parts.empty() ? "" : ", ") + std::string(category_name(static_cast<Category>(c))) +
               " " + format_bytes(pk.host_at_peak[c]);
    }
    if (!parts.empty()) say("    by category: %s\n", parts.c_str());
    const std::string conf = rec.alloc.to_string();
    say("  allocator: %s segments%s%s (`memfit train --plan` uses these settings)\n",
        rec.alloc.expandable_segments ? "expandable" : "fixed",
        conf.empty() ? ", defaults" : ": ", conf.c_str());
    say("  why: %s\n", rec.why.c_str());
    print_trade_offs(r);
  }
  if (!a.out.empty()) {
    std::vector<std::string> failed;
    write_or_rescue(
        "--out", a.out, false,
        [&](const std::string& path) {
          rec.save(path);
          // stderr when stdout carries JSON or YAML, so it stays parseable.
          say_to(a.format == "table" ? stdout : stderr, "plan written to %s\n", path.c_str());
        },
        failed);
    finish_outputs(failed);
  }
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Find the dtype, checkpointing, micro-batch, accumulation and offload that fit a budget");
  cmd->add_option("--model", a->model,
                  "a built-in model (gpt2, gpt2-xl, llama-3.1-8b, mistral-7b, qwen3-8b, ...), "
                  "a YAML spec file or a HuggingFace config.json (required)");
  cmd->add_option("--device", a->device,
                  "a device preset (h100-80g, a100-40g, cpu, ...; `memfit devices` lists them) "
                  "or a YAML device file (required)");
  cmd->add_option("--budget", a->budget,
                  "memory budget (24GiB, 512MiB); default: the device's memory less its context");
  cmd->add_option("--host-budget", a->host_budget,
                  "pinned host memory a plan may take (offload); default: no limit, the host "
                  "bytes of each plan are printed");
  cmd->add_option("--seq-len", a->seq_len, "tokens per sequence (default: the model's)")
      ->check(exact_int64());
  cmd->add_option("--loss", a->loss,
                  "chunked (the loss's logits in chunks of rows, recomputed in the backward: "
                  "never more memory, one more head GEMM) | whole (all saved)")
      ->capture_default_str();
  cmd->add_option("--global-batch", a->global_batch,
                  "throughput mode: the fastest plan for this many sequences per step")
      ->check(exact_int64());
  cmd->add_option("--ranks", a->ranks,
                  "data-parallel ranks: each plan is rank 0's dry run (per-rank bytes and "
                  "micro-batch; --global-batch is all ranks')")
      ->capture_default_str()
      ->check(exact_int32());
  cmd->add_option("--zero", a->zero,
                  "ZeRO stage with --ranks: 0, 1 (optimizer state), 2 (+ grads); 1 and 2 "
                  "with optimizer offload, not gradient or weight offload")
      ->capture_default_str()
      ->check(exact_int32());
  cmd->add_flag("--no-overlap", a->no_overlap,
                "with --ranks: plan the gradient sums to finish before the next backward stage "
                "instead of beside it (ZeRO-2 then holds one stage's gradients less)");
  cmd->add_flag("--calibrate", a->calibrate,
                "fit the cost model from profiled steps on this machine instead of analytic");
  cmd->add_option("--format", a->format, "table | json | yaml (the recommended plan)")
      ->capture_default_str();
  cmd->add_option("--out", a->out, "write the recommended plan here (.yaml/.yml or .json)");
  cmd->add_option("--top", a->top, "table rows to show (0: all)")
      ->capture_default_str()
      ->check(exact_int64());
  cmd->add_option("--alloc-conf", a->alloc_conf,
                  "allocator settings for the dry runs, MEMFIT_ALLOC_CONF syntax (default: the "
                  "variable); unless it names expandable_segments, the best plan is also tried "
                  "with expandable_segments:True and recommended that way when it fits more");
  cmd->add_flag("--measure-context", a->measure_context,
                "CUDA builds with a GPU: measure what the CUDA context and cuBLASLt/cuDNN handles "
                "take (cudaMemGetInfo) and use it instead of the device's context figure");
  cmd->add_flag("--measure", a->measure,
                "--device cpu: measure this machine's CPU rates again (GEMM per dtype and size, "
                "each op, memcpy, AdamW; a few seconds) and rewrite the cache; without it they "
                "are measured once per machine and build, then read from the cache "
                "($MEMFIT_CACHE_DIR, else $XDG_CACHE_HOME/memfit, else ~/.cache/memfit). A CUDA "
                "device (h100-80g, a kind-cuda file), on a machine with a GPU: measure this "
                "GPU's GEMM flops per dtype, memory bandwidth, pinned host link and context "
                "(a second or two), print them beside the device's figures, write the device "
                "with them (--device-out) and plan with it");
  cmd->add_option("--device-out", a->device_out,
                  "with --measure on a CUDA device: the measured device file to write (.yaml or "
                  ".yml; default: <device name>-measured.yaml in the current directory); later "
                  "plans take it as --device FILE");
  cmd->callback([a, cmd, &exit_code] {
    for (const char* flag : {"--model", "--device", "--budget", "--host-budget", "--out",
                             "--alloc-conf", "--format", "--loss", "--device-out"}) {
      reject_empty(flag, cmd->count(flag) > 0, cmd->get_option(flag)->as<std::string>());
    }
    if (a->alloc_conf.empty()) {
      if (const char* env = std::getenv("MEMFIT_ALLOC_CONF")) a->alloc_conf = env;
    }
    exit_code = run_plan(*a);
  });
}

}  // namespace memfit::cli
