// What the offload tests (gradient ring, weight ring) share: a CPU rig whose worker streams
// make every copy stream a thread of its own, and the training configurations each offload
// switch is checked under, with their test names.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/layer.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"

namespace memfit::testing {

struct OffloadRig {
  OffloadRig(DType dt, bool workers)
      : be(CpuBackendOptions{.worker_streams = workers}),
        alloc(host, {}, &be.stream_sync()),
        ctx{be, alloc, kDefaultStream, dt} {}
  CpuBackend be;
  HostProvider host;
  CachingAllocator alloc;
  LayerContext ctx;
};

// A dtype, a checkpoint rule (for 3 blocks) and an accumulation count (0: none).
struct OffloadCase {
  DType dtype;
  const char* checkpoint;
  std::int64_t accum;
};

// Every dtype, with and without accumulation, under four checkpoint rules.
inline std::vector<OffloadCase> offload_cases() {
  return {{DType::kF32, "none", 0}, {DType::kF32, "every:2", 3}, {DType::kBF16, "none", 3},
          {DType::kBF16, "all", 0}, {DType::kF16, "none", 0},    {DType::kF16, "sqrt", 6}};
}

// "bf16_every2_accum3": a test name for a case.
inline std::string offload_case_name(const ::testing::TestParamInfo<OffloadCase>& i) {
  return std::string(dtype_name(i.param.dtype)) + "_" +
         (i.param.checkpoint[0] == 'e' ? "every2" : i.param.checkpoint) + "_accum" +
         std::to_string(i.param.accum);
}

}  // namespace memfit::testing
