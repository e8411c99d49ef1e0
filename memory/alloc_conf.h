// Tuning of the caching allocator, from code or from the MEMFIT_ALLOC_CONF environment
// variable, in the syntax of PyTorch's PYTORCH_CUDA_ALLOC_CONF:
//
//   MEMFIT_ALLOC_CONF="max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.8"
//   AllocatorConfig cfg = parse_alloc_conf(std::getenv("MEMFIT_ALLOC_CONF"));
//
// Keys (all optional; unknown keys are errors, so a typo never passes silently):
//   max_split_size_mb:N             blocks larger than N MiB are never split (N >= 1; default:
//                                   unlimited). Limits fragmentation by big blocks.
//   roundup_power2_divisions:N      round requests up to the nearest of N divisions between
//                                   powers of two (N = 0 or a power of two in [1, 64]; default
//                                   0 = round to 512 bytes only).
//   garbage_collection_threshold:F  when reserved memory exceeds F * budget, release cached
//                                   blocks oldest-first before asking the provider (0 < F < 1;
//                                   needs a budget; default off).
//   budget:SIZE                     byte budget for reserved memory (units as parse_size:
//                                   24GiB, 512MiB); like set_per_process_memory_fraction.
//   separate_persistent_pools:B     true|false (default true): gradients and optimizer state
//                                   get segments of their own, so long-lived blocks never pin
//                                   a segment made for a transient tensor.
//   release_before_growth:B         true|false (default true): before reserved memory grows
//                                   past its high-water mark for a transient block, return
//                                   cached transient segments wholly free and too small for it.
//   expandable_segments:B           True|False (default False): per pool and stream, one
//                                   reserved address range whose pages are mapped as it
//                                   grows, instead of fixed-size segments (PyTorch's key;
//                                   caching_allocator.h says how memfit's differs).
// (separate_persistent_pools and release_before_growth are memfit policies, not PyTorch's;
// caching_allocator.h gives the figures.)
// roundup_power2_divisions:1 rounds to powers of two (PyTorch treats 1 as off).
// Errors are ConfigError naming the key, the value and the valid range.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace memfit {

struct AllocatorConfig {
  std::size_t max_split_size = 0;           // bytes; 0 = unlimited
  int roundup_power2_divisions = 0;         // 0 = off
  double garbage_collection_threshold = 0;  // 0 = off
  std::size_t budget = 0;                   // bytes of reserved memory; 0 = unlimited
  bool separate_persistent_pools = true;    // memfit policy, see caching_allocator.h
  bool release_before_growth = true;        // memfit policy, see caching_allocator.h
  bool expandable_segments = false;         // mapped pages in reserved ranges
  bool debug_checks = false;                // whole-structure checks after every operation

  // "max_split_size_mb:128,..." form of this config (keys at their defaults omitted;
  // debug_checks has no key).
  std::string to_string() const;
};

// Parses the MEMFIT_ALLOC_CONF syntax; empty text gives the defaults.
AllocatorConfig parse_alloc_conf(std::string_view text);

// parse_alloc_conf(getenv("MEMFIT_ALLOC_CONF")), defaults when the variable is unset. The
// error message names the variable.
AllocatorConfig alloc_conf_from_env();

}  // namespace memfit
