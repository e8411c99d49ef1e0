#include "memory/alloc_conf.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <string>
#include <system_error>

#include "memory/error.h"
#include "memory/size.h"

namespace memfit {

namespace {

constexpr std::size_t kMaxSplitMbLimit = std::size_t{1} << 30;  // 2^30 MiB = 2^50 bytes

constexpr const char* kKeys[] = {
    "max_split_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "budget",
    "separate_persistent_pools",
    "release_before_growth",
    "expandable_segments",
};
constexpr int kKeyCount = static_cast<int>(std::size(kKeys));
constexpr const char* kValidKeys =
    "max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold, budget, "
    "separate_persistent_pools, release_before_growth, expandable_segments";

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

[[noreturn]] void fail(std::string_view text, const std::string& what) {
  throw ConfigError("alloc conf '" + std::string(text) + "': " + what);
}

[[noreturn]] void bad_value(std::string_view text, std::string_view key, std::string_view value,
                            const char* valid) {
  fail(text, "key '" + std::string(key) + "': invalid value '" + std::string(value) +
                 "'; valid: " + valid);
}

// Whole-string unsigned integer; no sign, no spaces, no suffix.
bool parse_uint(std::string_view v, std::size_t& out) {
  if (v.empty() || v.front() < '0' || v.front() > '9') return false;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), out);
  return r.ec == std::errc() && r.ptr == v.data() + v.size();
}

// true|false, and PyTorch's True|False.
bool parse_bool(std::string_view text, std::string_view key, std::string_view v) {
  if (v == "true" || v == "True") return true;
  if (v == "false" || v == "False") return false;
  bad_value(text, key, v, "true or false");
}

}  // namespace

AllocatorConfig parse_alloc_conf(std::string_view text) {
  AllocatorConfig cfg;
  if (trim(text).empty()) return cfg;
  bool seen[kKeyCount] = {};
  std::string_view rest = text;
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view entry = trim(rest.substr(0, comma));
    if (entry.empty()) {
      fail(text, "empty entry (a stray ','); expected key:value pairs separated by ',', keys: " +
                     std::string(kValidKeys));
    }
    const std::size_t colon = entry.find(':');
    if (colon == std::string_view::npos) {
      fail(text, "entry '" + std::string(entry) +
                     "' has no ':'; expected key:value, keys: " + kValidKeys);
    }
    const std::string_view key = trim(entry.substr(0, colon));
    const std::string_view value = trim(entry.substr(colon + 1));
    int index = 0;
    while (index < kKeyCount && key != kKeys[index]) ++index;
    if (index == kKeyCount) {
      fail(text, "unknown key '" + std::string(key) + "'; valid keys: " + kValidKeys);
    }
    if (seen[index]) fail(text, "key '" + std::string(key) + "' given twice");
    seen[index] = true;
    if (value.empty()) fail(text, "key '" + std::string(key) + "' has an empty value");

    switch (index) {
      case 0: {
        static constexpr const char* kValid = "an integer number of MiB in [1, 1073741824]";
        std::size_t mb = 0;
        if (!parse_uint(value, mb) || mb < 1 || mb > kMaxSplitMbLimit) {
          bad_value(text, key, value, kValid);
        }
        cfg.max_split_size = mb << 20;
        break;
      }
      case 1: {
        static constexpr const char* kValid = "0 (off) or a power of two in [1, 64]";
        std::size_t n = 0;
        if (!parse_uint(value, n) || n > 64 || (n & (n - 1)) != 0) {
          bad_value(text, key, value, kValid);
        }
        cfg.roundup_power2_divisions = static_cast<int>(n);
        break;
      }
      case 2: {
        static constexpr const char* kValid = "a number F with 0 < F < 1, e.g. 0.8";
        double f = 0;
        const auto r = std::from_chars(value.data(), value.data() + value.size(), f);
        if (r.ec != std::errc() || r.ptr != value.data() + value.size() || !std::isfinite(f) ||
            !(f > 0 && f < 1)) {
          bad_value(text, key, value, kValid);
        }
        cfg.garbage_collection_threshold = f;
        break;
      }
      case 3: {
        try {
          cfg.budget = parse_size(value);
        } catch (const InvalidArgument& e) {
          bad_value(text, key, value,
                    "a byte size with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, "
                    "K, M, G, T), e.g. 24GiB or 512MiB; 0 = unlimited");
        }
        break;
      }
      case 4:
        cfg.separate_persistent_pools = parse_bool(text, key, value);
        break;
      case 5:
        cfg.release_before_growth = parse_bool(text, key, value);
        break;
      case 6:
        cfg.expandable_segments = parse_bool(text, key, value);
        break;
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return cfg;
}

AllocatorConfig alloc_conf_from_env() {
  const char* env = std::getenv("MEMFIT_ALLOC_CONF");
  if (env == nullptr) return AllocatorConfig{};
  try {
    return parse_alloc_conf(env);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("MEMFIT_ALLOC_CONF: ") + e.what());
  }
}

std::string AllocatorConfig::to_string() const {
  std::string out;
  const auto add = [&out](const char* key, const std::string& value) {
    if (!out.empty()) out += ',';
    out += key;
    out += ':';
    out += value;
  };
  // A max_split_size set from code need not be whole MiB; the text form rounds it up.
  if (max_split_size != 0)
    add("max_split_size_mb", std::to_string((max_split_size + (1 << 20) - 1) >> 20));
  if (roundup_power2_divisions != 0) {
    add("roundup_power2_divisions", std::to_string(roundup_power2_divisions));
  }
  if (garbage_collection_threshold != 0) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, garbage_collection_threshold);
    add("garbage_collection_threshold", std::string(buf, r.ptr));
  }
  if (budget != 0) add("budget", std::to_string(budget));
  const AllocatorConfig defaults;
  if (separate_persistent_pools != defaults.separate_persistent_pools) {
    add("separate_persistent_pools", separate_persistent_pools ? "true" : "false");
  }
  if (release_before_growth != defaults.release_before_growth) {
    add("release_before_growth", release_before_growth ? "true" : "false");
  }
  if (expandable_segments) add("expandable_segments", "True");
  return out;
}

}  // namespace memfit
