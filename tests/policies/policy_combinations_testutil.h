// Every valid memory policy combination, for tests that must cover each one: the offload switch
// sets MemoryPolicy::validate() accepts (it is the one authority on which combine), crossed with
// dtypes and checkpoint rules. Header-only.
//
//   for (const MemoryPolicy& p : testing::every_policy({DType::kF32}, {Checkpointing::all()})) ...
#pragma once

#include <string>
#include <vector>

#include "memory/error.h"
#include "policies/policy.h"

namespace memfit::testing {

// Each set of offload switches (optimizer, gradients, weights, activations, delayed update)
// that validate() accepts, in a fixed order: all off first.
inline std::vector<OffloadSwitches> valid_offload_switches() {
  std::vector<OffloadSwitches> out;
  for (int bits = 0; bits < 32; ++bits) {
    MemoryPolicy p;
    p.offload.optimizer = (bits & 1) != 0;
    p.offload.gradients = (bits & 2) != 0;
    p.offload.weights = (bits & 4) != 0;
    p.offload.activations = (bits & 8) != 0;
    p.offload.delayed_update = (bits & 16) != 0;
    try {
      p.validate();
    } catch (const InvalidArgument&) {
      continue;  // a combination the trainer refuses: nothing to cover
    }
    out.push_back(p.offload);
  }
  return out;
}

// dtypes x checkpoint rules x valid_offload_switches(), micro-batching left to the caller.
inline std::vector<MemoryPolicy> every_policy(const std::vector<DType>& dtypes,
                                              const std::vector<Checkpointing>& rules) {
  std::vector<MemoryPolicy> out;
  for (DType dt : dtypes) {
    for (const Checkpointing& ck : rules) {
      for (const OffloadSwitches& off : valid_offload_switches()) {
        MemoryPolicy p;
        p.dtype = dt;
        p.checkpoint = ck;
        p.offload = off;
        out.push_back(p);
      }
    }
  }
  return out;
}

}  // namespace memfit::testing
