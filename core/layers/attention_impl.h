// AttentionImpl: which algorithm computes causal attention (core/layers/attention.h):
// kFlash, the tiled O(T)-memory one and the default, or kMaterialized, the (T, T)
// probabilities stored. A model spec's `attention:` key names them.
//
//   AttentionImpl a;
//   if (!parse_attention_impl("materialized", &a)) ...;   // false for any other text
//   attention_impl_name(a);                                // "materialized"
#pragma once

#include <cstdint>
#include <string_view>

namespace memfit {

enum class AttentionImpl : std::uint8_t { kFlash, kMaterialized };

const char* attention_impl_name(AttentionImpl impl);  // "flash", "materialized"
// "flash" or "materialized" into *out (true); anything else leaves *out and returns false.
bool parse_attention_impl(std::string_view text, AttentionImpl* out);

}  // namespace memfit
