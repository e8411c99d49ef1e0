#include "core/layers/attention_impl.h"

namespace memfit {

const char* attention_impl_name(AttentionImpl impl) {
  return impl == AttentionImpl::kFlash ? "flash" : "materialized";
}

bool parse_attention_impl(std::string_view text, AttentionImpl* out) {
  for (AttentionImpl a : {AttentionImpl::kFlash, AttentionImpl::kMaterialized}) {
    if (text == attention_impl_name(a)) {
      *out = a;
      return true;
    }
  }
  return false;
}

}  // namespace memfit
