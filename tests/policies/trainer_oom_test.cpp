// Trainer: an OutOfMemory is a normal event. For every valid policy combination (dtype f32 /
// bf16 / f16, checkpoint none / all / every:1, each set of offload switches validate() accepts,
// the delayed update included) and two micro-batches per step (so a fault can land after
// gradients accumulated), an OutOfMemory injected at each allocation of a step in turn (every
// allocation through the caching allocator: CachingAllocator::fail_allocation; every call to
// the pinned host provider: a FaultInjectingProvider) leaves the trainer exactly as before the
// step: optimizer state (masters, moments), working weights on the device and on the host,
// which of them are on the device, loss scaler, steps() and steps_attempted(), no saved
// activations, the allocator's live bytes and blocks and its invariants, and no pinned bytes
// beyond what the trainer accounts for. Then the step retried, and a later step at a smaller
// micro-batch, train bit for bit as an identical trainer that never saw an OutOfMemory.
//
// Faults are injected in the first step (everything fresh: the activation stash's host room is
// reserved then) and in the second (warm caches; under the delayed update, step one's update in
// flight). Sanitized and Debug builds run less of it: see kSlowBuild.
//
// "As before the step" under the delayed update (DPU): before step n+1, step n's CPU update has
// been started (masters, moments and steps() already count it once it finishes) but its weights
// are not yet copied back: the device still holds step n-1's working weights, which step n+1's
// forward and backward use, and step n+1's optimizer call lands step n's weights first. A
// failed step n+1 must leave exactly that: the update neither lost nor applied twice, and its
// weights still not landed (landing them early would make the retried step n+1 compute with
// step n's weights, which a run without the failure never does). The snapshot below therefore
// never flushes: it waits for the update's arithmetic (state()) and reads the device weights as
// they are.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/model.h"
#include "core/text_dataset.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/fault_injecting_provider.h"
#include "memory/host_provider.h"
#include "policies/trainer.h"
#include "tests/core/exec_testutil.h"
#include "tests/policies/policy_combinations_testutil.h"

namespace memfit {
namespace {

constexpr std::int64_t kSeqLen = 8;
constexpr std::int64_t kVocab = 32;      // twice the width: the chunked loss runs in 2 chunks
constexpr std::int64_t kBatch = 4;       // two micro-batches of kMicroBatch
constexpr std::int64_t kMicroBatch = 2;  // the policy's
constexpr std::int64_t kSmallBatch = 1;  // the step after the faults: one micro-batch of 1

// Sanitized and unoptimized builds (CI's AddressSanitizer build is Debug) run kernels ~10x
// slower, and flash attention's tiles at this short sequence as long as the rest of the step.
// There every combination still fails at every allocation of its first step, but with
// materialized attention throughout, and at every allocation of the second step only under
// the delayed update (the one policy whose second step starts from a state the first cannot:
// an update in flight). Optimized builds run the whole cross product below.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(NDEBUG)
constexpr bool kSlowBuild = true;
#else
constexpr bool kSlowBuild = false;
#endif

// Tokens for the model's vocabulary, from the bundled corpus's bytes.
Batch batch_at(std::int64_t batch, std::int64_t pos) {
  Batch b = testing::test_corpus().sequential(batch, kSeqLen, pos);
  for (auto& t : b.tokens) t %= kVocab;
  for (auto& t : b.targets) t %= kVocab;
  return b;
}

// The policies under test: every dtype, checkpoint rule and valid offload switch set.
std::vector<MemoryPolicy> policies() {
  std::vector<MemoryPolicy> v =
      testing::every_policy({DType::kF32, DType::kBF16, DType::kF16},
                            {Checkpointing::none(), Checkpointing::all(), Checkpointing::every(1)});
  for (MemoryPolicy& p : v) p.micro_batch = kMicroBatch;
  return v;
}

// A two-block GPT (checkpoint all recomputes both blocks, every:1 block 0 only; every:2 would be
// none's ops here, its one segment not recomputed), the smallest that still has heads,
// an MLP and a tied head wider than the model. Flash attention (the default) under bf16, the
// materialized kind under f32 and f16 (and everywhere in slow builds): each runs under every
// checkpoint rule and offload switch set, and materialized costs half as much at this length.
ModelSpec spec(DType dtype) {
  ModelSpec s = testing::tiny_gpt_spec(2);
  s.hidden = 16;  // as small as still runs every path: the cost is per allocation and kernel
  s.heads = 2;
  s.vocab = kVocab;
  s.seq_len = kSeqLen;
  s.attention =
      dtype == DType::kBF16 && !kSlowBuild ? AttentionImpl::kFlash : AttentionImpl::kMaterialized;
  return s;
}

// A CPU "device" (worker streams: offload's copies run on threads of their own, as on a GPU),
// its allocator, a host provider that can fail, and a trainer; members in construction order.
struct Rig {
  explicit Rig(const MemoryPolicy& policy)
      : be(CpuBackendOptions{.worker_streams = policy.offload.any()}),
        alloc(device, {}, &be.stream_sync()),
        host(host_inner),
        ctx{be, alloc, kDefaultStream, policy.dtype},
        model(spec(policy.dtype), ctx, Trainer::placement(policy)),
        trainer(model, ctx, options(policy), &host) {}
  static TrainerOptions options(const MemoryPolicy& policy) {
    TrainerOptions o;
    o.policy = policy;
    o.adamw.lr = 3e-3;
    // f16's default scale (2^16) overflows this model's first steps: a skipped step would
    // leave the delayed update nothing in flight. 2^10 trains.
    o.scaler.init_scale = 1024;
    return o;
  }
  CpuBackend be;
  HostProvider device;
  CachingAllocator alloc;
  HostProvider host_inner;
  FaultInjectingProvider host;
  LayerContext ctx;
  Model model;
  Trainer trainer;
};

// Everything a step may change, read without changing it (no flush: see the top).
struct State {
  std::vector<std::vector<unsigned char>> bits;  // optimizer state, weights (device and host)
  std::vector<int> placement;                    // per parameter: weight/master/grad on device
  LossScalerState scaler;
  std::int64_t steps = 0, attempted = 0;
  bool operator==(const State&) const = default;
};

std::vector<unsigned char> read(LayerContext& ctx, const Tensor& t) {
  std::vector<unsigned char> out(t.nbytes());
  if (t.numel() == 0) return out;
  ctx.backend.copy(ctx.stream, t, Tensor(out.data(), t.shape(), t.dtype(), Device::kCpu));
  ctx.backend.synchronize(ctx.stream);
  return out;
}

State capture(Rig& r) {
  State s;
  LayerContext& ctx = r.ctx;
  ctx.backend.synchronize(ctx.stream);
  for (const StateTensor& t : r.trainer.optimizer().state()) s.bits.push_back(read(ctx, t.tensor));
  for (Parameter* p : r.model.parameters()) {
    s.placement.push_back(int{p->weight_on_device()} | int{p->master_on_device()} << 1 |
                          int{p->grad_on_device()} << 2);
    if (p->weight_on_device()) s.bits.push_back(read(ctx, p->weight.view()));
    if (p->master_on_device()) s.bits.push_back(read(ctx, p->master.view()));
    if (p->host_weight.raw() != nullptr) s.bits.push_back(read(ctx, p->host_weight));
  }
  s.scaler = r.trainer.scaler().state();
  s.steps = r.trainer.steps();
  s.attempted = r.trainer.steps_attempted();
  return s;
}

// What the allocators hold that a failed step must give back.
struct Held {
  std::int64_t device_blocks = 0, device_bytes = 0;
  CategoryBytes host_by_category{};  // the trainer's pinned bytes, activations' room aside
  std::int64_t host_untracked = 0;   // pinned bytes in use that the trainer does not count
  bool operator==(const Held&) const = default;
};

Held held(Rig& r) {
  const AllocatorStats st = r.alloc.stats();
  Held h;
  h.device_blocks = st.allocation[kStatAll].current;
  h.device_bytes = st.allocated_bytes[kStatAll].current;
  h.host_by_category = r.trainer.host_by_category();
  // The stash's room is capacity kept for later steps, as the allocator's cached segments are.
  h.host_by_category[category_index(Category::kActivation)] = 0;
  h.host_untracked = static_cast<std::int64_t>(r.host.bytes_in_use()) -
                     static_cast<std::int64_t>(r.trainer.host_bytes());
  return h;
}

// What one step makes: allocations through the caching allocator and host provider calls.
struct Counts {
  std::int64_t device = 0, host = 0;
};

Counts step_counting(Rig& r, const Batch& b) {
  const std::int64_t d0 = r.alloc.stats().allocation[kStatAll].allocated;
  const std::int64_t h0 = r.host.calls();
  r.trainer.step(b);
  return {r.alloc.stats().allocation[kStatAll].allocated - d0, r.host.calls() - h0};
}

// Fails each allocation of `b`'s step in turn (device ones, then host ones) and checks that each
// failure changed nothing. Returns the number of faults injected.
std::int64_t fail_each_allocation(Rig& r, const Batch& b, Counts n, const char* phase) {
  const State before = capture(r);
  const Held held_before = held(r);
  std::int64_t cases = 0;
  // Host calls first: the first failed step that gets past the activation stash's reservation
  // keeps its room (capacity, as the allocator's cached segments), and later steps call nothing.
  for (int side : {1, 0}) {
    const std::int64_t count = side == 0 ? n.device : n.host;
    for (std::int64_t k = 1; k <= count; ++k) {
      SCOPED_TRACE(std::string(phase) + (side == 0 ? ": device allocation " : ": host call ") +
                   std::to_string(k) + " of " + std::to_string(count));
      const std::int64_t host_failures = r.host.failures();
      if (side == 0) {
        r.alloc.fail_allocation(k);
      } else {
        r.host.fail_call(k);
      }
      bool oom = false;
      try {
        r.trainer.step(b);
      } catch (const OutOfMemory&) {
        oom = true;
      }
      const bool reached =
          side == 0 ? r.alloc.pending_fault() == 0 : r.host.failures() > host_failures;
      r.alloc.fail_allocation(0);
      r.host.fail_call(0);
      // A step that did not fail changed the state on purpose: nothing more to compare.
      if (!oom) {
        ADD_FAILURE() << "the step did not fail (fault reached: " << reached << ")";
        return cases;
      }
      ++cases;
      EXPECT_TRUE(reached) << "an OutOfMemory other than the injected one";
      r.alloc.check_invariants();
      EXPECT_FALSE(r.model.any_saved());
      EXPECT_TRUE(held(r) == held_before) << "a failed step kept memory";
      const State after = capture(r);
      EXPECT_EQ(after.scaler, before.scaler);
      EXPECT_EQ(after.steps, before.steps);
      EXPECT_EQ(after.attempted, before.attempted);
      EXPECT_EQ(after.placement, before.placement) << "a weight, master or gradient left lent";
      if (!(after == before)) {
        ADD_FAILURE() << "the failed step changed the weights or optimizer state";
        return cases;  // one report per combination is enough
      }
    }
  }
  return cases;
}

// In parts (every kParts-th combination each), so ctest runs them side by side.
constexpr int kParts = 6;
class TrainerOom : public ::testing::TestWithParam<int> {};

TEST_P(TrainerOom, AFailureAtEveryAllocationOfAStepChangesNothing) {
  const std::vector<MemoryPolicy> all = policies();
  const Batch b1 = batch_at(kBatch, 11);
  const Batch b2 = batch_at(kBatch, 222);
  const Batch small = batch_at(kSmallBatch, 3333);
  std::int64_t cases = 0;
  for (std::size_t i = static_cast<std::size_t>(GetParam()); i < all.size(); i += kParts) {
    const MemoryPolicy& pol = all[i];
    SCOPED_TRACE(pol.describe());
    // How many allocations each step makes, from an identical trainer.
    Counts n1, n2;
    {
      Rig count(pol);
      n1 = step_counting(count, b1);
      n2 = step_counting(count, b2);
    }
    ASSERT_GT(n1.device, 0);
    ASSERT_GT(n2.device, 0);
    Rig ref(pol);  // never fails
    Rig r(pol);
    cases += fail_each_allocation(r, b1, n1, "step 1");
    const StepResult s1 = r.trainer.step(b1);  // retried: as if nothing had failed
    const StepResult e1 = ref.trainer.step(b1);
    EXPECT_EQ(s1.loss, e1.loss);
    EXPECT_EQ(s1.skipped, e1.skipped);
    ASSERT_TRUE(capture(r) == capture(ref)) << "the retried first step differs";
    if (!kSlowBuild || pol.offload.delayed_update)
      cases += fail_each_allocation(r, b2, n2, "step 2");
    // A smaller micro-batch next (one of kSmallBatch rows): trains as the reference does.
    const StepResult s2 = r.trainer.step(small);
    const StepResult e2 = ref.trainer.step(small);
    EXPECT_FALSE(s2.skipped);
    EXPECT_EQ(s2.loss, e2.loss);
    EXPECT_TRUE(capture(r) == capture(ref)) << "the step after the failures differs";
    EXPECT_EQ(r.trainer.steps_attempted(), 2);
    r.trainer.optimizer().flush(r.ctx);
    ref.trainer.optimizer().flush(ref.ctx);
    EXPECT_TRUE(capture(r) == capture(ref)) << "after landing the delayed update";
  }
  RecordProperty("cases", std::to_string(cases));
  std::printf("part %d: %lld (combination, allocation) cases\n", GetParam(),
              static_cast<long long>(cases));
}

INSTANTIATE_TEST_SUITE_P(Trainer, TrainerOom, ::testing::Range(0, kParts));

// The delayed update, spelled out: step one's update is in flight (masters and moments updated,
// the device weights still the initial ones); step two fails at its last allocation, after the
// last micro-batch reported gradients (where skip() used to land the update early). The update
// is still not landed, not lost, and lands once: at the retried step's optimizer call, or at a
// flush, exactly as on a trainer that never failed.
TEST(TrainerOom, AFailedStepLeavesTheDelayedUpdateInFlightToLandOnce) {
  MemoryPolicy pol;
  pol.dtype = DType::kBF16;
  pol.micro_batch = kMicroBatch;
  pol.offload.optimizer = true;
  pol.offload.delayed_update = true;
  const Batch b1 = batch_at(kBatch, 11), b2 = batch_at(kBatch, 222);
  Rig r(pol), ref(pol), count(pol);
  const State initial = capture(r);
  step_counting(count, b1);
  const Counts n2 = step_counting(count, b2);
  r.trainer.step(b1);
  ref.trainer.step(b1);
  const State in_flight = capture(r);
  ASSERT_EQ(in_flight.steps, 1);
  // capture() lists the optimizer's state (masters, moments) first, then the device weights.
  const std::size_t state_tensors = r.trainer.optimizer().state().size();
  const auto weights = [&](const State& s) {
    return std::vector<std::vector<unsigned char>>(
        s.bits.begin() + static_cast<std::ptrdiff_t>(state_tensors), s.bits.end());
  };
  EXPECT_EQ(weights(in_flight), weights(initial)) << "step one's weights landed already";
  EXPECT_NE(in_flight.bits, initial.bits) << "step one updated no master";

  r.alloc.fail_allocation(n2.device);
  EXPECT_THROW(r.trainer.step(b2), OutOfMemory);
  EXPECT_EQ(r.alloc.pending_fault(), 0);
  EXPECT_TRUE(capture(r) == in_flight) << "the failed step landed, lost or redid the update";

  r.trainer.optimizer().flush(r.ctx);  // lands it: once
  ref.trainer.optimizer().flush(ref.ctx);
  const State landed = capture(r);
  EXPECT_NE(weights(landed), weights(initial));
  EXPECT_TRUE(landed == capture(ref));
  r.trainer.optimizer().flush(r.ctx);  // nothing more to land
  EXPECT_TRUE(capture(r) == landed);
  EXPECT_EQ(r.trainer.step(b2).loss, ref.trainer.step(b2).loss);
  EXPECT_TRUE(capture(r) == capture(ref));
}

TEST(TrainerOom, TheCombinationsCoverEverySwitchAndTheDelayedUpdate) {
  // 2 without the optimizer's offload (activations or not), 12 with it: gradients x weights x
  // delayed update (not with weights) x activations.
  const std::vector<OffloadSwitches> sw = testing::valid_offload_switches();
  EXPECT_EQ(sw.size(), 14u);
  int dpu = 0, weights = 0, grads = 0, acts = 0;
  for (const OffloadSwitches& s : sw) {
    dpu += s.delayed_update;
    weights += s.weights;
    grads += s.gradients;
    acts += s.activations;
  }
  EXPECT_EQ(dpu, 4);
  EXPECT_EQ(weights, 4);
  EXPECT_EQ(grads, 6);
  EXPECT_EQ(acts, 7);
  EXPECT_EQ(policies().size(), 3u * 3u * 14u);
}

}  // namespace
}  // namespace memfit
