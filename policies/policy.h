// MemoryPolicy: the one typed value that decides how a training step uses memory: activation
// (and working weight) dtype, checkpointing, offload switches, micro-batch and accumulation.
// It is parsed once at the edge (CLI flags, a plan file) and passed as this value to the
// planner, the dry run and the Trainer; nothing turns it back into text to parse again.
//
//   MemoryPolicy p;
//   p.dtype = DType::kBF16;
//   p.checkpoint = Checkpointing::every(2);          // or Checkpointing::parse("every:2", n)
//   p.offload.optimizer = true;
//   p.micro_batch = 4;                               // or p.accum = 4 (not both)
//   p.validate();                                    // InvalidArgument naming what is wrong
//   Schedule s = p.checkpoint.schedule(model.num_blocks());
//   std::vector<std::int64_t> sizes = p.micro_batches(/*batch=*/16);   // {4, 4, 4, 4}
//
// Checkpointing is one of: a rule that gives a Schedule for any number of blocks (none, all,
// sqrt, every:K); the `optimal` solver (the planner solves it per micro-batch: until solved
// it has no schedule); or an explicit op list (a solved optimal schedule keeps the name
// "optimal"; one a user wrote is named "ops"). Its text forms, for flags and plan files:
// name() ("none", "every:2", "optimal", "ops") and, for explicit schedules, ops_text()
// (Schedule::str()). Offload is a set of switches, each one a field: the optimizer's FP32
// masters and Adam moments, and on top of it the FP32 gradients and the working weights; and,
// on their own, the checkpointed activations.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/layers/lm_head.h"  // LossMode
#include "core/schedule.h"
#include "policies/accumulation.h"

namespace memfit {

class Checkpointing {
 public:
  enum class Kind : std::uint8_t { kNone, kAll, kSqrt, kEvery, kOptimal, kOps };

  Checkpointing() = default;  // none
  static Checkpointing none() { return Checkpointing(Kind::kNone); }
  static Checkpointing all() { return Checkpointing(Kind::kAll); }
  static Checkpointing sqrt() { return Checkpointing(Kind::kSqrt); }
  static Checkpointing every(int k);  // InvalidArgument unless k >= 1
  static Checkpointing optimal() { return Checkpointing(Kind::kOptimal); }
  // The optimal solver's answer for one micro-batch: runs `s`, still named "optimal".
  static Checkpointing solved(Schedule s);
  // An explicit op list (Schedule::parse's format), named "ops".
  static Checkpointing ops(Schedule s);

  // At the edge: "none", "all", "sqrt", "every:K", "optimal", or an op list validated for
  // `blocks` blocks. InvalidArgument listing the valid forms.
  static Checkpointing parse(std::string_view text, int blocks);
  // A plan file's pair: the name and, when explicit, the op list ("" for none).
  static Checkpointing from_parts(std::string_view name, std::string_view ops_text, int blocks);

  Kind kind() const { return kind_; }
  int every_k() const { return every_; }
  bool is_rule() const { return kind_ != Kind::kOptimal && kind_ != Kind::kOps; }
  bool needs_solving() const { return kind_ == Kind::kOptimal && !schedule_; }
  bool has_ops() const { return schedule_.has_value(); }

  // The schedule an Executor runs on `blocks` blocks. InvalidArgument for an unsolved
  // optimal (the planner solves it), or an explicit schedule that is not valid for `blocks`.
  Schedule schedule(int blocks) const;
  std::string name() const;      // "none", "all", "sqrt", "every:K", "optimal", "ops"
  std::string ops_text() const;  // the explicit op list (Schedule::str()), "" for rules

  bool operator==(const Checkpointing& o) const;

 private:
  explicit Checkpointing(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kNone;
  int every_ = 0;
  std::optional<Schedule> schedule_;
};

// What moves to pinned host memory. Each switch is independent; all off: nothing leaves the
// device.
struct OffloadSwitches {
  bool optimizer = false;       // FP32 masters + Adam moments on the host, CPU AdamW
  bool gradients = false;       // FP32 gradients on the host, streamed out stage by stage
                                // through a ring of device buckets; needs optimizer
  bool weights = false;         // working weights on the host, fetched for each use of a unit
                                // into a ring of device buffers; needs optimizer, not with
                                // delayed_update
  bool activations = false;     // checkpointed block inputs on the host between the forward
                                // that keeps them and the recompute that reads them
                                // (policies/offload_activation_stash.h); independent of the
                                // others; a schedule without checkpoints (none) has nothing
                                // to move
  bool delayed_update = false;  // the optimizer's: ZeRO-Offload's one-step delayed update (DPU;
                                // changes the math); needs optimizer
  bool any() const { return optimizer || gradients || weights || activations; }
  // "off" | "optimizer" | "optimizer,gradients" ...: the switches on, in this order;
  // ", delayed update" follows when on.
  std::string describe() const;
  // A comma-separated list of switches: optimizer, gradients, weights, activations, all (every
  // switch above but the delayed update), off (or none). Gradients or weights without optimizer
  // turn the optimizer on (they need it). InvalidArgument names the bad word and the valid ones.
  static OffloadSwitches parse(std::string_view text);
  bool operator==(const OffloadSwitches&) const = default;
};

struct MemoryPolicy {
  DType dtype = DType::kF32;  // weights in use and activations; masters, gradients, moments FP32
  Checkpointing checkpoint;
  OffloadSwitches offload;
  std::int64_t micro_batch = 0;  // samples per micro-batch; 0: the whole batch at once
  std::int64_t accum = 0;        // or: this many micro-batches (split_batch); 0: unused
  // The loss's logits (core/layers/lm_head.h): chunked (the default; never more memory than
  // whole, and the same when the vocabulary is no wider than the model) or whole (saved, as
  // memfit before chunking; one GEMM less per step).
  LossMode loss = LossMode::kChunked;

  // InvalidArgument: a negative micro-batch or accumulation count, both given, delayed update,
  // gradient or weight offload without optimizer offload, weight offload with delayed update.
  void validate() const;
  // The micro-batch sizes of one step of `batch` samples (policies/accumulation.h's splits);
  // split(): the same as {size, count, last}, in O(1).
  std::vector<std::int64_t> micro_batches(std::int64_t batch) const;
  Split split(std::int64_t batch) const;
  // One line: "bf16, checkpoint every:2, offload optimizer, micro-batch 4" (", whole logits"
  // when loss is kWhole).
  std::string describe() const;
  bool operator==(const MemoryPolicy&) const = default;
};

}  // namespace memfit
