// What every memfit fuzz harness shares: the input as text, and the one rule for exceptions.
//
//   extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
//     memfit::fuzz::run([&] { memfit::ModelSpec::from_yaml_string(memfit::fuzz::text(data, size));
//     }); return 0;
//   }
//
// A reader may refuse its input only with a memfit::Error (ConfigError, InvalidArgument,
// IoError, TrainStateError, ...): run() swallows those. Anything else (another exception, a
// MEMFIT_CHECK failure, a crash, a sanitizer report, a leak, a timeout, running out of memory)
// escapes and is a finding: libFuzzer saves the input, and it goes in fuzz/regressions/.
// property() turns a broken promise of an accepted input (a round trip that fails) into an
// abort naming it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "memory/error.h"

namespace memfit::fuzz {

inline std::string_view text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

template <class F>
void run(F&& f) {
  try {
    f();
  } catch (const memfit::Error&) {
    // the reader refused the input, as it should refuse anything it cannot read
  }
}

[[noreturn]] inline void broken(const char* what, const char* detail) {
  std::fprintf(stderr, "memfit fuzz: %s: %s\n", what, detail);
  std::abort();
}

// Runs f on an input the reader accepted; any exception there is a finding.
template <class F>
void property(const char* what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    broken(what, e.what());
  }
}

}  // namespace memfit::fuzz
