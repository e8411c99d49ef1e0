// Plan: one training configuration the planner chose (or a user wrote), with what it predicts;
// written as YAML or JSON and read back by `memfit train --plan FILE` and by Trainer.
//
//   Plan p = Plan::load("plan.yaml");                 // .yaml/.yml or .json by extension
//   TrainerOptions o = p.trainer_options();           // checkpoint, micro-batch, accum, offload
//   LayerContext ctx{be, alloc, kDefaultStream, p.dtype};
//
// YAML keys (JSON the same names): model (a ModelSpec map), device, budget_bytes, seq_len,
// global_batch, micro_batch, accum_steps, activation_dtype (f32|f16|bf16), checkpoint (a
// solver name or a Schedule::parse string; an optimal schedule is written as its op list),
// offload, delayed_update, ranks, zero_stage, and predicted: {peak_reserved_bytes,
// peak_allocated_bytes, peak_by_category, step_seconds, tokens_per_second}, why.
// Reading validates everything (ConfigError naming file, line and key).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/model_spec.h"
#include "memory/category.h"
#include "policies/trainer.h"

namespace memfit {

struct Prediction {
  std::size_t peak_reserved = 0;
  std::size_t peak_allocated = 0;
  std::array<std::size_t, kCategoryCount> peak_by_category{};
  double step_seconds = 0;
  double tokens_per_second = 0;
};

struct Plan {
  ModelSpec model;
  std::string device = "cpu";
  std::size_t budget = 0;
  std::int64_t seq_len = 0;
  std::int64_t global_batch = 0;  // micro_batch * accum_steps
  std::int64_t micro_batch = 1;
  std::int64_t accum_steps = 1;
  DType dtype = DType::kF32;
  std::string checkpoint = "none";
  bool offload = false;
  bool delayed_update = false;
  int ranks = 1;
  int zero_stage = 0;  // 0, 1 (optimizer state sharded), 2 (+ gradients)
  Prediction predicted;
  std::string why;

  TrainerOptions trainer_options() const;  // adamw/scaler/seed left at their defaults

  std::string to_yaml() const;
  std::string to_json() const;
  static Plan from_yaml_string(std::string_view text, std::string_view source = "<string>");
  static Plan from_json_string(std::string_view text, std::string_view source = "<string>");
  static Plan load(const std::string& path);
  void save(const std::string& path) const;  // atomic (temp + rename); format by extension
};

}  // namespace memfit
