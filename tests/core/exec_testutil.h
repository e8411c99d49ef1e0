// Helpers for the model, schedule and executor tests.
#pragma once

#include <random>

#include "core/schedule.h"

namespace memfit::testing {

// A random valid schedule for n blocks: random keeps in the forward phase, then for each
// backward (n-1 down to 0) that lacks saved state, a recomputation from the nearest held input
// with random keeps on the way. Every op's needs are met by construction (validate() agrees).
Schedule random_schedule(int n, std::mt19937& rng);

}  // namespace memfit::testing
