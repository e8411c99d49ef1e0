#include "memory/size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

#include "memory/error.h"

namespace memfit {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

[[noreturn]] void bad_size(std::string_view text, const char* why) {
  throw InvalidArgument("invalid size '" + std::string(text) + "': " + why +
                        "; expected a non-negative number with an optional unit "
                        "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, K, M, G, T), e.g. 24GiB");
}

}  // namespace

std::size_t parse_size(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const std::size_t num_begin = i;
  bool seen_digit = false, seen_dot = false;
  while (i < text.size()) {
    const char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
    ++i;
  }
  if (!seen_digit) bad_size(text, "no number");
  const std::string number(text.substr(num_begin, i - num_begin));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::size_t unit_end = text.size();
  while (unit_end > i && std::isspace(static_cast<unsigned char>(text[unit_end - 1]))) --unit_end;
  const std::string_view unit = text.substr(i, unit_end - i);

  struct Unit {
    const char* name;
    double scale;
  };
  static constexpr Unit kUnits[] = {
      {"", 1.0},         {"B", 1.0},        {"KB", 1e3},       {"MB", 1e6},
      {"GB", 1e9},       {"TB", 1e12},      {"KiB", 1024.0},   {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"K", 1024.0}, {"M", 1048576.0},
      {"G", 1073741824.0},   {"T", 1099511627776.0},
  };
  double scale = -1;
  for (const Unit& u : kUnits) {
    if (iequals(unit, u.name)) {
      scale = u.scale;
      break;
    }
  }
  if (scale < 0) bad_size(text, "unknown unit");

  // Integers without a unit are parsed exactly; anything with a fraction goes through double.
  if (!seen_dot && scale == 1.0) {
    std::size_t v = 0;
    for (char c : number) {
      const std::size_t d = static_cast<std::size_t>(c - '0');
      if (v > (std::numeric_limits<std::size_t>::max() - d) / 10) bad_size(text, "too large");
      v = v * 10 + d;
    }
    return v;
  }
  const double v = std::strtod(number.c_str(), nullptr) * scale;
  if (!std::isfinite(v) || v >= 18446744073709551616.0) bad_size(text, "too large");
  return static_cast<std::size_t>(std::llround(v));
}

std::string format_bytes(std::size_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kNames[u]);
  return buf;
}

std::size_t checked_mul(std::size_t a, std::size_t b, const char* what) {
  std::size_t r;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw InvalidArgument(std::string(what) + " overflows: " + std::to_string(a) + " * " +
                          std::to_string(b) + " exceeds 2^64-1 bytes");
  }
  return r;
}

std::size_t checked_add(std::size_t a, std::size_t b, const char* what) {
  std::size_t r;
  if (__builtin_add_overflow(a, b, &r)) {
    throw InvalidArgument(std::string(what) + " overflows: " + std::to_string(a) + " + " +
                          std::to_string(b) + " exceeds 2^64-1 bytes");
  }
  return r;
}

std::size_t checked_align_up(std::size_t v, std::size_t align, const char* what) {
  return checked_add(v, align - 1, what) / align * align;
}

}  // namespace memfit
