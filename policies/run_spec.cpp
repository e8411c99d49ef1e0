#include "policies/run_spec.h"

#include "memory/error.h"
#include "memory/size.h"

namespace memfit {

void RunSpec::validate() const {
  model.validate();
  trainer.policy.validate();
  if (batch < 1) throw InvalidArgument("batch " + std::to_string(batch) + " must be >= 1");
  const std::int64_t t = resolved_seq_len();
  checked_mul(
      checked_mul(static_cast<std::size_t>(batch), static_cast<std::size_t>(t), "batch * seq_len"),
      sizeof(std::int32_t), "batch * seq_len token bytes");
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    throw InvalidArgument("rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                          " ranks; valid: ranks >= 1 and 0 <= rank < ranks");
  }
  if (batch % ranks != 0) {
    throw InvalidArgument("global batch " + std::to_string(batch) + " over " +
                          std::to_string(ranks) + " ranks; valid: a multiple of " +
                          std::to_string(ranks) + " (every rank steps on the same number of "
                          "samples)");
  }
  const int z = trainer.zero_stage;
  if (z < 0 || z > 2) {
    throw InvalidArgument("zero_stage " + std::to_string(z) +
                          "; valid: 0 (data parallel), 1 (optimizer state sharded) or 2 "
                          "(gradients too)");
  }
  const OffloadSwitches& off = trainer.policy.offload;
  if (z > 0 && (off.gradients || off.weights || off.delayed_update)) {
    throw InvalidArgument("ZeRO-" + std::to_string(z) + " with offload " + off.describe() +
                          ": sharded gradient and weight offload and the delayed update are "
                          "not built yet; valid: ZeRO-1/2 with offload optimizer (and "
                          "activations), or any offload with ZeRO-0");
  }
  (void)trainer.policy.split(rank_batch());  // an accumulation count the batch cannot take
  (void)trainer.policy.checkpoint.schedule(static_cast<int>(model.layers));
}

std::string RunSpec::describe() const {
  std::string s = model.name + ", " + trainer.policy.describe() + ", batch " +
                  std::to_string(batch) + " x " + std::to_string(resolved_seq_len());
  if (ranks > 1 || trainer.zero_stage > 0) {
    s += ", rank " + std::to_string(rank) + " of " + std::to_string(ranks) + " ZeRO-" +
         std::to_string(trainer.zero_stage);
  }
  return s;
}

}  // namespace memfit
