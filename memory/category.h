// What an allocation is for. Every allocation names its Category at the source (layers,
// optimizers, the executor), so reports need no after-the-fact inference.
//
//   Category c = parse_category("optimizer_state");   // throws InvalidArgument on a bad name
//   std::cout << category_name(c);                     // "optimizer_state"
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace memfit {

enum class Category : std::uint8_t {
  kParameter = 0,
  kGradient,
  kOptimizerState,
  kActivation,
  kTemporary,
  kInput,
  kWorkspace,
  kUnknown,
};

inline constexpr std::size_t kCategoryCount = 8;
using CategoryBytes = std::array<std::size_t, kCategoryCount>;  // bytes by category_index()

// Lower-case names as they appear in reports and in memory_viz ("parameter", "gradient",
// "optimizer_state", "activation", "temporary", "input", "workspace", "unknown").
const char* category_name(Category c);

// Inverse of category_name; throws InvalidArgument listing the valid names.
Category parse_category(std::string_view name);

inline constexpr std::size_t category_index(Category c) { return static_cast<std::size_t>(c); }

inline std::size_t total_bytes(const CategoryBytes& b) {
  std::size_t sum = 0;
  for (std::size_t x : b) sum += x;
  return sum;
}

}  // namespace memfit
