// Rotary position embedding frequencies (Su et al. 2021, "RoFormer"), as HuggingFace's Llama
// computes them, for Backend::rope (core/backend.h).
//
//   RopeScaling s;                              // none: theta^(-2i/hs)
//   s.kind = RopeScaling::Kind::kLlama3; s.factor = 8; ...   // Llama 3.1's long-context rule
//   RopeFreqs f = rope_frequencies(/*hs=*/128, /*theta=*/500000.0f, s);
//
// Arithmetic in FP32 as transformers' `_compute_default_rope_parameters` and
// `_compute_llama3_parameters` (modeling_rope_utils.py): inv_freq[i] = 1 / theta^(2i / hs),
// then, for llama3, with wavelen = 2 pi / inv_freq: wavelengths above
// original_max_position_embeddings / low_freq_factor are divided by `factor`, those below
// original_max_position_embeddings / high_freq_factor kept, and those between interpolated
// smoothly. InvalidArgument for an odd or out-of-range hs, theta <= 1 or not finite, or llama3
// parameters that are not finite and positive with high_freq_factor > low_freq_factor.
#pragma once

#include <cstdint>

#include "core/backend.h"

namespace memfit {

struct RopeScaling {
  enum class Kind : std::uint8_t { kNone, kLlama3 };
  Kind kind = Kind::kNone;
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  std::int64_t original_max_position_embeddings = 8192;
};

RopeFreqs rope_frequencies(std::int64_t hs, float theta, const RopeScaling& scaling = {});

}  // namespace memfit
