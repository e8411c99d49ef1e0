// Helpers for the model, schedule, executor, optimizer and golden tests (and the profiler's
// Trainer step test): a backend with its allocator (CPU on host memory, or meta on a
// NullProvider), token batches, host copies.
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
#include "core/model_spec.h"
#include "core/schedule.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"

namespace memfit {
class TextDataset;  // core/text_dataset.h
}

namespace memfit::testing {

// A random valid schedule for n blocks: random keeps in the forward phase, then for each
// backward (n-1 down to 0) that lacks saved state, a recomputation from the nearest held input
// with random keeps on the way. Every op's needs are met by construction (validate() agrees).
Schedule random_schedule(int n, std::mt19937& rng);

// A backend, a provider and a caching allocator over it. `provider` may be given (a
// FaultInjectingProvider); otherwise HostProvider (cpu) or NullProvider (meta). `cpu` sets up
// the CPU backend (worker streams, for offload); meta ignores it.
struct Rig {
  explicit Rig(bool meta, AllocatorConfig conf = {}, MemoryProvider* provider = nullptr,
               CpuBackendOptions cpu = {});
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

// A GPT small enough for whole Trainer steps in a test: byte-level (vocab 256, so it reads
// test_corpus()), T = 32, C = 32, 4 heads, MLP ratio 4, tied head, `layers` blocks.
ModelSpec tiny_gpt_spec(std::int64_t layers = 2);
// tiny_gpt_spec at vocab 512, T = 64, C = 64: what the planner and dry-run proofs search over.
ModelSpec small_gpt(std::int64_t layers);
// The bundled corpus, data/corpus.txt, loaded once.
const TextDataset& test_corpus();

// Host copy of a device tensor, widened to f32 (cpu only).
std::vector<float> to_host(LayerContext& ctx, const Tensor& t);
// Raw bytes of a tensor (cpu only), for bitwise comparisons.
std::vector<unsigned char> bytes_of(const Tensor& t);

// Bytes the allocator holds in activations and temporaries right now.
std::int64_t activation_bytes_now(const CachingAllocator& alloc);

}  // namespace memfit::testing
