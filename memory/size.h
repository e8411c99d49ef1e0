// Byte sizes: parsing with units, printing for humans, overflow-checked arithmetic.
//
//   std::size_t b = parse_size("24GiB");      // 25769803776; "512MiB", "1.5GB", "4096" work too
//   format_bytes(3 << 20)                     // "3.00 MiB"
//   std::size_t n = checked_mul(rows, cols);  // throws InvalidArgument on overflow
//
// Units: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024), K/M/G/T as the
// binary ones (what users of nvidia-smi expect). Case-insensitive; spaces between number and
// unit are allowed. Anything else is an InvalidArgument that names the text and the units.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace memfit {

inline constexpr std::size_t kKiB = std::size_t{1} << 10;
inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kGiB = std::size_t{1} << 30;

std::size_t parse_size(std::string_view text);

// Two decimals and the largest binary unit below the value: "512 B", "1.50 KiB", "24.00 GiB".
std::string format_bytes(std::size_t bytes);

// a * b and a + b, throwing InvalidArgument (naming `what`) instead of wrapping around.
std::size_t checked_mul(std::size_t a, std::size_t b, const char* what = "size");
std::size_t checked_add(std::size_t a, std::size_t b, const char* what = "size");
// v rounded up to a multiple of `align` (> 0), throwing as checked_add does.
std::size_t checked_align_up(std::size_t v, std::size_t align, const char* what = "size");

}  // namespace memfit
