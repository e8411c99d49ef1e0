#include "policies/collective_cost.h"

namespace memfit {

Collectives collective_cost(const RunSpec& run, const DeviceSpec& device) {
  Collectives c;
  if (run.ranks <= 1) return c;
  const double n = run.ranks;
  const double share = (n - 1) / n;  // of each tensor, what a rank sends
  const double grads = 4.0 * static_cast<double>(run.model.parameter_count());
  const double weights = static_cast<double>(dtype_size(run.trainer.policy.dtype)) *
                         static_cast<double>(run.model.parameter_count());
  const double micro_batches =
      static_cast<double>(run.trainer.policy.split(run.rank_batch()).count);
  switch (run.trainer.zero_stage) {
    case 0:
      c.bytes = 2 * share * grads;
      break;
    case 1:
      c.bytes = share * grads + share * weights;
      break;
    default:
      c.bytes = micro_batches * share * grads + share * weights;
      break;
  }
  if (device.rank_link > 0) c.seconds = c.bytes / device.rank_link;
  return c;
}

}  // namespace memfit
