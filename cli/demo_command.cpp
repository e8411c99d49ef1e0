#include "cli/demo_command.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "memory/alloc_conf.h"
#include "memory/gpt_trace.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/null_provider.h"
#include "memory/size.h"
#include "memory/trace_replay.h"

namespace memfit::cli {

namespace {

struct DemoOptions {
  std::string model = "gpt2";
  std::int64_t micro_batch = 4;
  std::int64_t seq_len = 1024;
  std::int64_t steps = 3;
  std::string dtype = "bf16";
  std::string budget = "24GiB";
  std::string alloc_conf;
  std::string out = "memfit-demo.json";
};

GptTraceSpec spec_for(const DemoOptions& o, std::int64_t micro_batch) {
  GptTraceSpec s;
  if (o.model == "gpt2") {
    s.layers = 12, s.hidden = 768, s.heads = 12;
  } else if (o.model == "gpt2-medium") {
    s.layers = 24, s.hidden = 1024, s.heads = 16;
  } else if (o.model == "gpt2-large") {
    s.layers = 36, s.hidden = 1280, s.heads = 20;
  } else if (o.model == "gpt2-xl") {
    s.layers = 48, s.hidden = 1600, s.heads = 25;
  } else {
    throw InvalidArgument("--model '" + o.model +
                          "': valid models are gpt2, gpt2-medium, gpt2-large, gpt2-xl");
  }
  s.seq_len = o.seq_len;
  s.max_seq_len = std::max<std::int64_t>(1024, o.seq_len);
  s.micro_batch = micro_batch;
  s.steps = o.steps;
  if (o.dtype == "f32") {
    s.act_bytes = 4, s.mixed_precision = false;
  } else if (o.dtype == "bf16" || o.dtype == "f16") {
    s.act_bytes = 2, s.mixed_precision = true;
  } else {
    throw InvalidArgument("--dtype '" + o.dtype + "': valid values are f32, f16, bf16");
  }
  return s;
}

// One replay of the trace for `micro_batch` under `config`; OOMs are counted, not thrown.
ReplayResult run_once(const DemoOptions& o, std::int64_t micro_batch, const AllocatorConfig& config,
                      AllocatorStats* stats_out = nullptr) {
  const AllocTrace trace = make_gpt_training_trace(spec_for(o, micro_batch));
  NullProvider null;
  CachingAllocator alloc(null, config);
  ReplayResult r = replay(trace, alloc);  // frees the persistent state after measuring
  if (stats_out) *stats_out = alloc.stats();
  return r;
}

bool fits(const DemoOptions& o, std::int64_t micro_batch, const AllocatorConfig& config) {
  return run_once(o, micro_batch, config).num_ooms == 0;
}

int run_demo(const DemoOptions& o) {
  AllocatorConfig config = parse_alloc_conf(o.alloc_conf);
  const std::size_t budget = parse_size(o.budget);
  if (budget == 0) throw InvalidArgument("--budget must be positive (e.g. 24GiB)");
  if (o.micro_batch <= 0 || o.seq_len <= 0 || o.steps <= 0) {
    throw InvalidArgument("--micro-batch, --seq-len and --steps must be positive");
  }

  // 1. Unbudgeted replay: what the step needs, by category.
  AllocatorStats stats;
  const ReplayResult r = run_once(o, o.micro_batch, config, &stats);
  std::printf("memfit demo: %s, seq %lld, micro-batch %lld, %s activations, %lld steps\n",
              o.model.c_str(), static_cast<long long>(o.seq_len),
              static_cast<long long>(o.micro_batch), o.dtype.c_str(),
              static_cast<long long>(o.steps));
  std::printf("  %zu allocations replayed through the caching allocator (%.0f ns/op)\n",
              r.num_allocs, r.ns_per_op);
  std::printf("  peak live (requested) %12s\n", format_bytes(r.peak_live_bytes).c_str());
  std::printf("  peak allocated        %12s\n", format_bytes(r.peak_allocated_bytes).c_str());
  std::printf("  peak reserved         %12s   reserved/live %.3f (1.00 is the limit)\n",
              format_bytes(r.peak_reserved_bytes).c_str(), r.reserved_over_live);
  std::printf("  provider calls after the first step: %lld allocs, %lld frees\n",
              static_cast<long long>(r.provider_allocs_after_first_step),
              static_cast<long long>(r.provider_frees_after_first_step));
  std::printf("  peak by category:\n");
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const auto peak = stats.category_bytes[c].peak;
    if (peak > 0) {
      std::printf("    %-16s %12s\n", category_name(static_cast<Category>(c)),
                  format_bytes(static_cast<std::size_t>(peak)).c_str());
    }
  }

  // 2. Under the budget: the largest micro-batch whose replay never runs out of memory.
  AllocatorConfig budgeted = config;
  budgeted.budget = budget;
  std::int64_t lo = 0, hi = 1;
  while (hi <= 4096 && fits(o, hi, budgeted)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (fits(o, mid, budgeted) ? lo : hi) = mid;
  }
  if (lo == 0) {
    // A budget too small for anything is a user error: say what one sample needs.
    AllocatorStats one;
    const ReplayResult r1 = run_once(o, 1, config, &one);
    throw InvalidArgument("--budget " + o.budget + " (" + format_bytes(budget) +
                          ") is too small: " + o.model + " at micro-batch 1 reserves " +
                          format_bytes(r1.peak_reserved_bytes) + " (" +
                          format_bytes(r1.peak_live_bytes) + " live); give --budget " +
                          std::to_string((r1.peak_reserved_bytes + kMiB - 1) / kMiB) +
                          "MiB or more");
  }
  std::printf("  budget %s: largest micro-batch that fits is %lld\n", format_bytes(budget).c_str(),
              static_cast<long long>(lo));

  nlohmann::json j;
  j["model"] = o.model;
  j["seq_len"] = o.seq_len;
  j["micro_batch"] = o.micro_batch;
  j["dtype"] = o.dtype;
  j["alloc_conf"] = config.to_string();
  j["peak_live_bytes"] = r.peak_live_bytes;
  j["peak_allocated_bytes"] = r.peak_allocated_bytes;
  j["peak_reserved_bytes"] = r.peak_reserved_bytes;
  j["reserved_over_live"] = r.reserved_over_live;
  j["provider_allocs_after_first_step"] = r.provider_allocs_after_first_step;
  j["budget_bytes"] = budget;
  j["max_micro_batch_under_budget"] = lo;
  j["allocator_stats"] = stats.as_map();
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    if (!f) throw InvalidArgument("--out '" + o.out + "': cannot open for writing");
    f << j.dump(2) << "\n";
    std::printf("  report: %s\n", o.out.c_str());
  }
  return 0;
}

}  // namespace

void add_demo_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Replay a bundled GPT-2 training trace through the allocator under a budget");
  cmd->add_option("--model", opts->model, "gpt2 | gpt2-medium | gpt2-large | gpt2-xl")
      ->capture_default_str();
  cmd->add_option("--micro-batch", opts->micro_batch, "samples per step")->capture_default_str();
  cmd->add_option("--seq-len", opts->seq_len, "tokens per sample")->capture_default_str();
  cmd->add_option("--steps", opts->steps, "training steps to replay")->capture_default_str();
  cmd->add_option("--dtype", opts->dtype, "activation dtype: f32 | f16 | bf16")
      ->capture_default_str();
  cmd->add_option("--budget", opts->budget, "memory budget (24GiB, 512MiB, ...)")
      ->capture_default_str();
  cmd->add_option("--alloc-conf", opts->alloc_conf,
                  "allocator settings, MEMFIT_ALLOC_CONF syntax (default: the variable)");
  cmd->add_option("--out", opts->out, "JSON report path ('' for none)")->capture_default_str();
  cmd->callback([opts, &exit_code] {
    if (opts->alloc_conf.empty()) {
      if (const char* env = std::getenv("MEMFIT_ALLOC_CONF")) opts->alloc_conf = env;
    }
    exit_code = run_demo(*opts);
  });
}

}  // namespace memfit::cli
