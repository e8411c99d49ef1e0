// Helpers for the model, schedule, executor, optimizer and golden tests: a backend with its
// allocator (CPU on host memory, or meta on a NullProvider), token batches, host copies.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/executor.h"
#include "core/meta/meta_backend.h"
#include "core/model.h"
#include "core/schedule.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"

namespace memfit::testing {

// A random valid schedule for n blocks: random keeps in the forward phase, then for each
// backward (n-1 down to 0) that lacks saved state, a recomputation from the nearest held input
// with random keeps on the way. Every op's needs are met by construction (validate() agrees).
Schedule random_schedule(int n, std::mt19937& rng);

// A backend, a provider and a caching allocator over it. `provider` may be given (a
// FaultInjectingProvider); otherwise HostProvider (cpu) or NullProvider (meta).
struct Rig {
  explicit Rig(bool meta, AllocatorConfig conf = {}, MemoryProvider* provider = nullptr);
  ~Rig();
  LayerContext ctx(DType dt) { return LayerContext{*be, *alloc, kDefaultStream, dt}; }
  bool meta;
  std::unique_ptr<Backend> be;
  std::unique_ptr<MemoryProvider> own_provider;
  std::unique_ptr<CachingAllocator> alloc;
};

// Token ids and targets (B,T) on the rig's device, random in [0, vocab) (meta: not written).
struct Batch {
  Batch(Rig& rig, std::int64_t b, std::int64_t t, std::int64_t vocab, std::uint32_t seed);
  Batch(Rig& rig, const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
        std::int64_t b, std::int64_t t);
  Block tok, tgt;
  MicroBatch mb;
};

// Host copy of a device tensor, widened to f32 (cpu only).
std::vector<float> to_host(LayerContext& ctx, const Tensor& t);
// Raw bytes of a tensor (cpu only), for bitwise comparisons.
std::vector<unsigned char> bytes_of(const Tensor& t);

// Bytes the allocator holds in activations and temporaries right now.
std::int64_t activation_bytes_now(const CachingAllocator& alloc);

}  // namespace memfit::testing
