#include "policies/policy.h"

#include <utility>

#include "memory/error.h"
#include "policies/accumulation.h"

namespace memfit {

Checkpointing Checkpointing::every(int k) {
  if (k < 1) throw InvalidArgument("checkpoint every:" + std::to_string(k) + ": K must be >= 1");
  Checkpointing c(Kind::kEvery);
  c.every_ = k;
  return c;
}

Checkpointing Checkpointing::solved(Schedule s) {
  Checkpointing c(Kind::kOptimal);
  c.schedule_ = std::move(s);
  return c;
}

Checkpointing Checkpointing::ops(Schedule s) {
  Checkpointing c(Kind::kOps);
  c.schedule_ = std::move(s);
  return c;
}

Checkpointing Checkpointing::parse(std::string_view text, int blocks) {
  if (text == "optimal") return optimal();
  Schedule s;
  try {
    s = Schedule::parse(text, blocks);  // the rules and the op-list form, validated
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    if (what.rfind("checkpoint schedule '", 0) != 0) throw;  // an op list with a bad op
    throw InvalidArgument("checkpoint '" + std::string(text) +
                          "': unknown; valid: none, all, sqrt, every:K (K an integer >= 1), "
                          "optimal, or an op list (\"F0:input R0:all B0\")");
  }
  const std::string& name = s.name();
  if (name == "none") return none();
  if (name == "all") return all();
  if (name == "sqrt") return sqrt();
  constexpr std::string_view kEvery = "every:";
  if (name.rfind(kEvery, 0) == 0) return every(std::stoi(name.substr(kEvery.size())));
  return ops(std::move(s));
}

Checkpointing Checkpointing::from_parts(std::string_view name, std::string_view ops_text,
                                        int blocks) {
  if (ops_text.empty()) {
    Checkpointing c = parse(name, blocks);
    return c;
  }
  Schedule s = Schedule::parse(ops_text, blocks);
  if (name == "optimal") return solved(std::move(s));
  if (name == "ops") return ops(std::move(s));
  throw InvalidArgument("checkpoint '" + std::string(name) +
                        "' with an explicit schedule: valid names for one are optimal (a "
                        "solver's answer) and ops");
}

Schedule Checkpointing::schedule(int blocks) const {
  switch (kind_) {
    case Kind::kNone:
      return Schedule::none(blocks);
    case Kind::kAll:
      return Schedule::all(blocks);
    case Kind::kSqrt:
      return Schedule::sqrt_n(blocks);
    case Kind::kEvery:
      return Schedule::every(blocks, every_);
    case Kind::kOptimal:
    case Kind::kOps:
      break;
  }
  if (!schedule_) {
    throw InvalidArgument(
        "checkpoint optimal is solved for each micro-batch by the planner; it has no schedule "
        "until then (plan first, or choose none, all, sqrt or every:K)");
  }
  schedule_->validate(blocks);
  return *schedule_;
}

std::string Checkpointing::name() const {
  switch (kind_) {
    case Kind::kNone:
      return "none";
    case Kind::kAll:
      return "all";
    case Kind::kSqrt:
      return "sqrt";
    case Kind::kEvery:
      return "every:" + std::to_string(every_);
    case Kind::kOptimal:
      return "optimal";
    case Kind::kOps:
      return "ops";
  }
  return "none";
}

std::string Checkpointing::ops_text() const { return schedule_ ? schedule_->str() : std::string(); }

bool Checkpointing::operator==(const Checkpointing& o) const {
  if (kind_ != o.kind_ || every_ != o.every_ || has_ops() != o.has_ops()) return false;
  return !schedule_ || schedule_->ops() == o.schedule_->ops();
}

std::string OffloadSwitches::describe() const {
  if (!any()) return "off";
  std::string s;
  if (optimizer) s = "optimizer";
  if (gradients) s += s.empty() ? "gradients" : ",gradients";
  if (weights) s += s.empty() ? "weights" : ",weights";
  if (activations) s += s.empty() ? "activations" : ",activations";
  if (delayed_update) s += " (delayed update)";
  return s;
}

OffloadSwitches OffloadSwitches::parse(std::string_view text) {
  constexpr const char* kValid =
      "optimizer, gradients, weights, activations, all, off (a comma-separated list)";
  OffloadSwitches o;
  bool off = false;
  std::size_t pos = 0;
  do {
    const std::size_t comma = text.find(',', pos);
    const std::string_view word =
        text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    if (word == "optimizer") {
      o.optimizer = true;
    } else if (word == "gradients") {
      o.gradients = o.optimizer = true;
    } else if (word == "weights") {
      o.weights = o.optimizer = true;
    } else if (word == "activations") {
      o.activations = true;
    } else if (word == "all") {
      o.activations = o.weights = o.gradients = o.optimizer = true;
    } else if (word == "off" || word == "none") {
      off = true;
    } else {
      throw InvalidArgument("offload '" + std::string(text) + "': unknown switch '" +
                            std::string(word) + "'; valid: " + kValid);
    }
    pos = comma == std::string_view::npos ? text.size() + 1 : comma + 1;
  } while (pos <= text.size());
  if (off && o.any()) {
    throw InvalidArgument("offload '" + std::string(text) +
                          "': 'off' with other switches; valid: " + kValid);
  }
  return o;
}

void MemoryPolicy::validate() const {
  if (micro_batch < 0) {
    throw InvalidArgument("micro-batch " + std::to_string(micro_batch) +
                          " must be >= 1 (or 0: the whole batch at once)");
  }
  if (accum < 0) {
    throw InvalidArgument("accumulation count " + std::to_string(accum) +
                          " must be >= 1 (or 0: unused)");
  }
  if (micro_batch > 0 && accum > 0) {
    throw InvalidArgument(
        "give a micro-batch size or an accumulation count, not both (micro-batch " +
        std::to_string(micro_batch) + ", accum " + std::to_string(accum) + ")");
  }
  if (offload.delayed_update && !offload.optimizer) {
    throw InvalidArgument(
        "delayed update (ZeRO-Offload's delayed parameter update) needs the optimizer offloaded");
  }
  if (offload.gradients && !offload.optimizer) {
    throw InvalidArgument(
        "gradient offload needs the optimizer offloaded (the CPU AdamW reads the gradients on "
        "the host)");
  }
  if (offload.weights && !offload.optimizer) {
    throw InvalidArgument(
        "weight offload needs the optimizer offloaded (the CPU AdamW writes the weights on the "
        "host)");
  }
  if (offload.weights && offload.delayed_update) {
    throw InvalidArgument(
        "weight offload with a delayed update: the update in flight would rewrite the weights "
        "the next step fetches from the host; valid: one of the two");
  }
}

std::vector<std::int64_t> MemoryPolicy::micro_batches(std::int64_t batch) const {
  return sizes_of(split(batch));
}

Split MemoryPolicy::split(std::int64_t batch) const {
  if (accum > 0) return split_shape(batch, accum);
  if (micro_batch > 0) return micro_batch_shape(batch, micro_batch);
  if (batch < 1) throw InvalidArgument("batch " + std::to_string(batch) + " must be >= 1");
  return {batch, 1, batch};
}

std::string MemoryPolicy::describe() const {
  std::string s = std::string(dtype_name(dtype)) + ", checkpoint " + checkpoint.name() +
                  ", offload " + offload.describe();
  if (micro_batch > 0) s += ", micro-batch " + std::to_string(micro_batch);
  if (accum > 0) s += ", accum " + std::to_string(accum);
  if (loss == LossMode::kWhole) s += ", whole logits";
  return s;
}

}  // namespace memfit
