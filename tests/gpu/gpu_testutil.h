// Helpers shared by the GPU tests: the skip-without-a-device guard, a gate that holds a
// stream's queue shut, and the figure lines tests/gpu/run.sh copies into its summary.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "memory/cuda/cuda_provider.h"

// First statement of every test that needs a GPU: without one it skips with
// "no CUDA device: <the runtime's reason>" (run.sh greps for that text).
#define MEMFIT_REQUIRE_GPU()                                            \
  do {                                                                  \
    std::string memfit_why_;                                            \
    if (::memfit::CudaProvider::cuda_device_count(&memfit_why_) == 0) { \
      GTEST_SKIP() << "no CUDA device: " << memfit_why_;                \
    }                                                                   \
  } while (0)

namespace memfit::testing {

// Holds a stream's queue shut until open(): a host function enqueued with cudaLaunchHostFunc
// spins on it. The deadline keeps a failing test from hanging the suite.
struct Gate {
  std::atomic<bool> is_open{false};
  void open() { is_open.store(true); }
  static void CUDART_CB wait(void* self) {
    auto* g = static_cast<Gate*>(self);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!g->is_open.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

// Opens the gate when a test leaves early (a failed ASSERT, an exception), before anything
// that waits for the gated stream (an allocator's destructor, a synchronize) can block on it.
struct GateOpener {
  Gate& gate;
  ~GateOpener() { gate.open(); }
};

// One line "figure: <name>: <value>" on stdout. run.sh lists these lines under its table, so
// the figures a GPU run measured are in its summary without reading the logs.
inline void print_figure(const std::string& name, const std::string& value) {
  std::printf("figure: %s: %s\n", name.c_str(), value.c_str());
  std::fflush(stdout);
}

}  // namespace memfit::testing
