#include "memory/category.h"

#include <string>

#include "memory/error.h"

namespace memfit {

namespace {
constexpr const char* kNames[kCategoryCount] = {
    "parameter", "gradient", "optimizer_state", "activation",
    "temporary", "input",    "workspace",       "unknown",
};
}  // namespace

const char* category_name(Category c) {
  const std::size_t i = category_index(c);
  return i < kCategoryCount ? kNames[i] : "invalid";
}

Category parse_category(std::string_view name) {
  for (std::size_t i = 0; i < kCategoryCount; ++i) {
    if (name == kNames[i]) return static_cast<Category>(i);
  }
  std::string valid;
  for (std::size_t i = 0; i < kCategoryCount; ++i) {
    valid += (i ? ", " : "");
    valid += kNames[i];
  }
  throw InvalidArgument("unknown memory category '" + std::string(name) + "'; valid: " + valid);
}

}  // namespace memfit
