// memfit's error types.
//
// Errors a user can cause (bad sizes, bad config, exhausted budget, a failing CUDA call) throw
// a subclass of memfit::Error whose message says what went wrong, where, and what would be
// valid. Broken internal invariants are MEMFIT_CHECK failures (memory/check.h), a different
// type on purpose: they are bugs in memfit, not in the caller's input.
//
//   try { allocator.allocate(n, Category::kActivation); }
//   catch (const memfit::OutOfMemory& e) { std::cerr << e.what(); }  // stats in the message
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "memory/category.h"

namespace memfit {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A caller passed a value outside the valid range (zero/absurd size, foreign pointer, ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A configuration string or file is malformed; the message names the key and the valid range.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A CUDA, cuBLAS, cuDNN or CUPTI call failed; the message names the call and the code.
class CudaError : public Error {
 public:
  using Error::Error;
};

// A collective among ranks failed (MPI, NCCL); the message names the call, the rank and the
// transport's reason.
class CommError : public Error {
 public:
  using Error::Error;
};

// Reading or writing a file failed (cannot create, short write, rename); the message names
// the file and the operating system's reason.
class IoError : public Error {
 public:
  using Error::Error;
};

// Figures the allocator knew when it gave up; carried by OutOfMemory for programs that want
// to react (a planner lowering the batch) rather than parse the message.
struct OomInfo {
  std::size_t requested_bytes = 0;   // what the caller asked for (before rounding)
  std::size_t allocated_bytes = 0;   // bytes in live blocks
  std::size_t reserved_bytes = 0;    // bytes held from the provider (segments)
  std::size_t budget_bytes = 0;      // 0 when no budget is set
  std::size_t largest_free_block = 0;
  std::vector<std::pair<Category, std::size_t>> top_categories;  // largest first
  bool host = false;  // pinned host memory (offload) ran out or over its budget, not the device's
};

class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& what, OomInfo info) : Error(what), info_(std::move(info)) {}
  const OomInfo& info() const { return info_; }

 private:
  OomInfo info_;
};

}  // namespace memfit
