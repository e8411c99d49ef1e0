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
  (void)trainer.policy.split(batch);  // an accumulation count the batch cannot take
  (void)trainer.policy.checkpoint.schedule(static_cast<int>(model.layers));
}

std::string RunSpec::describe() const {
  return model.name + ", " + trainer.policy.describe() + ", batch " + std::to_string(batch) +
         " x " + std::to_string(resolved_seq_len());
}

}  // namespace memfit
