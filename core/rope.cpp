#include "core/rope.h"

#include <cmath>
#include <string>

#include "memory/error.h"

namespace memfit {

RopeFreqs rope_frequencies(std::int64_t hs, float theta, const RopeScaling& s) {
  if (hs < 2 || hs % 2 != 0 || hs > Backend::kMaxAttentionHeadSize) {
    throw InvalidArgument("rope_frequencies: head size " + std::to_string(hs) +
                          "; valid: even, 2 to " + std::to_string(Backend::kMaxAttentionHeadSize));
  }
  if (!std::isfinite(theta) || !(theta > 1.0f)) {
    throw InvalidArgument("rope_frequencies: rope_theta " + std::to_string(theta) +
                          "; valid: finite, > 1");
  }
  RopeFreqs f;
  f.half = hs / 2;
  for (std::int64_t i = 0; i < f.half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(hs);
    f.inv_freq[i] = 1.0f / std::pow(theta, exponent);
  }
  if (s.kind == RopeScaling::Kind::kNone) return f;
  const bool ok = std::isfinite(s.factor) && s.factor > 0.0f && std::isfinite(s.low_freq_factor) &&
                  s.low_freq_factor > 0.0f && std::isfinite(s.high_freq_factor) &&
                  s.high_freq_factor > s.low_freq_factor && s.original_max_position_embeddings > 0;
  if (!ok) {
    throw InvalidArgument(
        "rope_frequencies: llama3 rope_scaling factor " + std::to_string(s.factor) +
        ", low_freq_factor " + std::to_string(s.low_freq_factor) + ", high_freq_factor " +
        std::to_string(s.high_freq_factor) + ", original_max_position_embeddings " +
        std::to_string(s.original_max_position_embeddings) +
        "; valid: finite and > 0, high_freq_factor > low_freq_factor");
  }
  const float old_len = static_cast<float>(s.original_max_position_embeddings);
  const float low_wavelen = old_len / s.low_freq_factor;
  const float high_wavelen = old_len / s.high_freq_factor;
  const float pi = 3.14159265358979323846f;
  for (std::int64_t i = 0; i < f.half; ++i) {
    const float freq = f.inv_freq[i];
    const float wavelen = 2.0f * pi / freq;
    float out = wavelen > low_wavelen ? freq / s.factor : freq;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {  // between: interpolate
      const float smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      out = (1.0f - smooth) * out / s.factor + smooth * out;
    }
    f.inv_freq[i] = out;
  }
  return f;
}

}  // namespace memfit
