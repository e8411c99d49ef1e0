// Fixtures the policies tests share: a small GPT the planner and dry-run proofs search over.
#pragma once

#include <cstdint>

#include "core/model_spec.h"

namespace memfit::testing {

// vocab 512, seq_len 64, hidden 64, 4 heads: small enough to dry-run hundreds of times.
inline ModelSpec small_gpt(std::int64_t layers) {
  ModelSpec s;
  s.name = "small-gpt";
  s.vocab = 512;
  s.seq_len = 64;
  s.layers = layers;
  s.hidden = 64;
  s.heads = 4;
  return s;
}

}  // namespace memfit::testing
