// Whole-file reads with a size limit: the one way memfit reads a file a user names (model,
// device and plan files, HF config.json, training data, traces, pickles, training states).
//
//   std::string text = read_file_bounded<ConfigError>(path, kMaxConfigFileBytes, "model spec");
//
// A file someone hands memfit may be anything: /dev/zero, a FIFO nobody writes to, a directory,
// a 50 GB checkpoint passed by mistake. read_file_bounded refuses, before reading a byte,
// anything that is not a regular file (naming what it is: a directory, a FIFO, a character
// device, ...) and a regular file whose size is over `limit`; it then reads at most limit + 1
// bytes, so a file that reports a small size and keeps growing (/proc files report 0) is
// refused too. The error (type E, default IoError) reads
//   "<what> '<path>': <reason>; valid: a regular file of at most <limit>"
// A file that cannot be opened or read gives the OS's reason (strerror).
//
// The limits, one per kind of file (README "Limits"):
//   kMaxConfigFileBytes  4 MiB   model/device/plan YAML, plan JSON, HF config.json (a few KB
//                                each; yaml-cpp needs ~75 bytes of memory per byte of input)
//   kMaxTraceFileBytes   1 GiB   text allocation traces (about 30 bytes per operation)
//   kMaxDataFileBytes    4 GiB   byte-level training text (held in memory whole)
//   pickles: PickleLimits::max_input_bytes (profiler/pickle.h, 2 GiB)
// Thread-safe (no shared state).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "memory/error.h"

namespace memfit {

inline constexpr std::size_t kMaxConfigFileBytes = std::size_t{4} << 20;
inline constexpr std::size_t kMaxTraceFileBytes = std::size_t{1} << 30;
inline constexpr std::size_t kMaxDataFileBytes = std::size_t{4} << 30;

struct BoundedRead {
  std::string bytes;
  std::string error;     // empty on success; else the whole message
  bool refused = false;  // the error is memfit's refusal (not a regular file, over the limit),
                         // not the OS failing to open or read it
};

// The non-throwing form: the message in .error instead of an exception.
BoundedRead try_read_file_bounded(const std::string& path, std::size_t limit,
                                  std::string_view what);

template <class E = IoError>
std::string read_file_bounded(const std::string& path, std::size_t limit, std::string_view what) {
  BoundedRead r = try_read_file_bounded(path, limit, what);
  if (!r.error.empty()) throw E(r.error);
  return std::move(r.bytes);
}

// "4 MiB", "1 GiB", "1234 bytes": a limit as the messages print it.
std::string limit_text(std::size_t bytes);

}  // namespace memfit
