// Plan: one training configuration the planner chose (or a user wrote), with what it predicts;
// written as YAML or JSON (one document: `memfit plan --format json`, `--out plan.json`,
// `--out plan.yaml` and `memfit train --summary-json`'s "plan" are all Plan::to_json /
// to_yaml) and read back by `memfit train --plan FILE` or a program's own loop.
//
//   Plan p = Plan::load("plan.yaml");                 // .yaml/.yml or .json by extension
//   RunSetup run(p.run_spec());                       // policies/run_setup.h: train it
//   std::cout << p.describe();                        // "bf16, checkpoint optimal, ..."
//
// Keys (JSON the same names): model (a ModelSpec map), device, device_kind (cpu|cuda),
// budget_bytes, seq_len, global_batch, micro_batch, accum_steps, activation_dtype
// (f32|f16|bf16), checkpoint (none|all|sqrt|every:K|optimal|ops), schedule (the op list of an
// explicit schedule: a solved optimal one, or ops), offload: {optimizer, gradients, weights,
// activations, delayed_update},
// ranks, zero_stage, overlap_comm (whether the gradient sums overlap the backward: they hold
// a stage's gradients one stage longer; absent reads as true), alloc_conf (the allocator settings the prediction assumed, in
// MEMFIT_ALLOC_CONF syntax without the budget; "" = the defaults; absent reads as ""),
// predicted: {peak_reserved_bytes, peak_allocated_bytes, peak_by_category
// (bytes by category at the reserved peak), cached_bytes_at_peak (reserved, not allocated,
// then: the two add up to peak_reserved_bytes), category_peaks (each category's own peak),
// host_pinned_bytes, host_pinned_by_category (those bytes by category: they add up to
// host_pinned_bytes), step_seconds, tokens_per_second}, why.
// Also read, as earlier versions wrote them: `offload: true|false` (the optimizer switch),
// a top-level `delayed_update`, and an op list in `checkpoint` (read as ops).
// Reading validates everything (ConfigError naming file, line and key).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/model_spec.h"
#include "memory/alloc_conf.h"
#include "memory/peak_figures.h"
#include "policies/device_spec.h"
#include "policies/policy.h"
#include "policies/run_spec.h"

namespace memfit {

struct Prediction {
  PeakFigures peaks;  // per rank; host_pinned: offload's pinned host bytes
  double step_seconds = 0;
  double tokens_per_second = 0;
};

struct Plan {
  ModelSpec model;
  std::string device = "cpu";  // the device preset or file it was planned for
  DeviceKind device_kind = DeviceKind::kCpu;
  std::size_t budget = 0;
  std::int64_t seq_len = 0;
  std::int64_t global_batch = 0;  // micro_batch * accum_steps * ranks (the last may be smaller)
  std::int64_t accum_steps = 1;
  MemoryPolicy policy;  // policy.micro_batch: the micro-batch (>= 1); policy.accum unused
  int ranks = 1;
  int zero_stage = 0;  // 0, 1 (optimizer state sharded), 2 (+ gradients)
  bool overlap_comm = true;  // TrainerOptions::overlap_comm (ranks > 1)
  AllocatorConfig alloc;  // what the dry runs used; its budget is unused (`budget` above)
  Prediction predicted;
  std::string why;

  // What RunSetup / dry_run take: model, policy, global batch, seq_len, budget, device kind,
  // ranks, zero_stage and overlap_comm (rank 0: each process of a multi-rank run sets its own rank); adamw,
  // scaler and seed at their defaults.
  RunSpec run_spec() const;
  // One line: "bf16, checkpoint optimal, offload optimizer, micro-batch 8 x 4 accumulated
  // (global batch 32)"; the one description every table, report and message uses.
  std::string describe() const;

  std::string to_yaml() const;
  std::string to_json() const;
  static Plan from_yaml_string(std::string_view text, std::string_view source = "<string>");
  static Plan from_json_string(std::string_view text, std::string_view source = "<string>");
  static Plan load(const std::string& path);
  void save(const std::string& path) const;  // atomic (temp + rename); format by extension
};

// PeakFigures as a JSON object, with the names a plan's `predicted` map uses
// (peak_reserved_bytes, peak_allocated_bytes, peak_by_category, cached_bytes_at_peak,
// category_peaks, host_pinned_bytes, host_pinned_by_category; categories without bytes left
// out): the one writer, for `memfit train --summary-json` too.
std::string peaks_json(const PeakFigures& p);

}  // namespace memfit
