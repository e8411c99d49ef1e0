#include "memory/trace_replay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "memory/error.h"
#include "memory/null_provider.h"
#include "memory/size.h"
#include "tests/support/gpt_trace.h"

namespace memfit {
namespace {

GptTraceSpec small_spec() {
  GptTraceSpec s;
  s.layers = 3;
  s.hidden = 64;
  s.heads = 4;
  s.seq_len = 64;
  s.max_seq_len = 64;
  s.vocab = 1000;
  s.micro_batch = 4;
  s.steps = 3;
  return s;
}

// Peak of the sum of round_size() over live allocations: what allocated_bytes must peak at.
std::size_t rounded_peak(const AllocTrace& t, const CachingAllocator& a) {
  std::map<std::uint64_t, std::size_t> live;
  std::size_t bytes = 0, peak = 0;
  for (const TraceOp& op : t.ops) {
    if (op.kind == TraceOpKind::kAlloc) {
      live[op.id] = a.round_size(op.size);
      bytes += live[op.id];
      peak = std::max(peak, bytes);
    } else if (op.kind == TraceOpKind::kFree) {
      bytes -= live.at(op.id);
      live.erase(op.id);
    }
  }
  return peak;
}

TEST(TraceReplay, ResultsAgreeWithTraceAndAllocatorStats) {
  const AllocTrace trace = make_gpt_training_trace(small_spec());
  const TraceSummary sum = trace.validate();
  NullProvider null;
  CachingAllocator alloc(null);
  const ReplayResult r = replay(trace, alloc);

  EXPECT_EQ(r.num_ops, trace.ops.size());
  EXPECT_EQ(r.num_allocs, sum.num_allocs);
  EXPECT_EQ(r.num_steps, 3u);
  EXPECT_EQ(r.num_ooms, 0);
  EXPECT_EQ(r.peak_live_bytes, sum.peak_live_bytes);
  EXPECT_EQ(r.peak_allocated_bytes, rounded_peak(trace, alloc));
  EXPECT_GE(r.peak_allocated_bytes, r.peak_live_bytes);
  EXPECT_GE(r.peak_reserved_bytes, r.peak_allocated_bytes);
  EXPECT_DOUBLE_EQ(r.reserved_over_live, double(r.peak_reserved_bytes) / double(r.peak_live_bytes));
  ASSERT_EQ(r.step_peak_reserved_bytes.size(), 3u);
  EXPECT_EQ(*std::max_element(r.step_peak_reserved_bytes.begin(), r.step_peak_reserved_bytes.end()),
            r.peak_reserved_bytes);

  // Provider calls as the allocator and the provider count them.
  const AllocatorStats s = alloc.stats();
  EXPECT_EQ(r.provider_allocs, s.num_device_alloc);
  EXPECT_EQ(r.provider_allocs, null.num_allocs());
  EXPECT_EQ(r.provider_frees, null.num_frees());
  EXPECT_TRUE(r.has_steady_state);
  EXPECT_LE(r.provider_allocs_after_first_step, r.provider_allocs);
  EXPECT_GT(r.provider_allocs, 0);
  EXPECT_LE(r.peak_reserved_bytes, null.peak_in_use());
  EXPECT_EQ(r.end_reserved_bytes, null.in_use());
  EXPECT_GT(r.seconds, 0);

  // free_remaining returned the persistent state: nothing is live afterwards.
  EXPECT_EQ(s.allocation[kStatAll].current, 0);
  EXPECT_EQ(s.requested_bytes[kStatAll].current, 0);
  alloc.check_invariants();
}

TEST(TraceReplay, SteadyStateNeedsNoProviderCalls) {
  // Every step repeats the same sizes. Step 1 holds the optimizer state during forward, so its
  // live peak exceeds step 0's and it may need segments; from step 2 on, the cache must do.
  const AllocTrace trace = make_gpt_training_trace(small_spec());
  const TraceSummary sum = trace.validate();
  ASSERT_GT(sum.step_peak_live_bytes[1], sum.step_peak_live_bytes[0]);
  NullProvider null;
  CachingAllocator alloc(null);
  const ReplayResult r = replay(trace, alloc, {.free_remaining = true, .check_invariants = true});
  ASSERT_EQ(r.step_provider_allocs.size(), 3u);
  EXPECT_GT(r.step_provider_allocs[0], 0);
  EXPECT_EQ(r.step_provider_allocs[2], 0);
  EXPECT_EQ(r.provider_allocs_after_first_step,
            r.step_provider_allocs[1] + r.step_provider_allocs[2]);
  EXPECT_EQ(r.provider_frees_after_first_step, 0);
  EXPECT_EQ(r.step_peak_reserved_bytes[2], r.step_peak_reserved_bytes[1]);
}

TEST(TraceReplay, EmptyCacheOpReturnsSegments) {
  AllocTrace t;
  t.step(0);
  const std::uint64_t a = t.alloc(3 << 20, Category::kActivation, 0, "a");
  const std::uint64_t b = t.alloc(1000, Category::kTemporary, 0, "b");
  t.free(a);
  t.free(b);
  t.empty_cache();
  t.step(1);
  t.free(t.alloc(3 << 20, Category::kActivation, 0, "a2"));
  NullProvider null;
  CachingAllocator alloc(null);
  const ReplayResult r = replay(t, alloc);
  EXPECT_EQ(r.provider_frees - r.provider_frees_after_first_step,
            r.provider_allocs - r.provider_allocs_after_first_step);
  EXPECT_GE(r.provider_allocs_after_first_step, 1);  // the cache was emptied: step 1 refills
  EXPECT_EQ(r.peak_live_bytes, (3u << 20) + 1000u);
}

TEST(TraceReplay, RecordStreamAcrossStreams) {
  AllocTrace t;
  const std::uint64_t x = t.alloc(4096, Category::kInput, 1, "copy");
  t.record_stream(x, 0);
  t.free(x);
  t.free(t.alloc(4096, Category::kInput, 1, "again"));
  NullProvider null;
  CachingAllocator alloc(null);
  const ReplayResult r = replay(t, alloc);
  EXPECT_EQ(r.num_ooms, 0);
  EXPECT_FALSE(r.has_steady_state);
  EXPECT_EQ(r.provider_allocs_after_first_step, 0);
  EXPECT_EQ(alloc.stats().active[kStatAll].current, 0);  // immediate events: nothing pending
}

TEST(TraceReplay, MalformedTraceIsRefusedBeforeTouchingTheAllocator) {
  AllocTrace t;
  t.alloc(1 << 20, Category::kActivation, 0, "a");  // id 0
  t.alloc(1 << 20, Category::kActivation, 0, "b");  // id 1
  t.free(0);
  t.free(0);
  NullProvider null;
  CachingAllocator alloc(null);
  try {
    replay(t, alloc);
    ADD_FAILURE() << "replayed a double free";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("op 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(null.num_allocs(), 0);
  EXPECT_EQ(alloc.stats().allocation[kStatAll].allocated, 0);

  AllocTrace dup;
  dup.ops.push_back({TraceOpKind::kAlloc, 9, 512, Category::kTemporary, 0, "x"});
  dup.ops.push_back({TraceOpKind::kAlloc, 9, 512, Category::kTemporary, 0, "y"});
  EXPECT_THROW(
      {
        try {
          replay(dup, alloc);
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("op 1 (alloc id 9)"), std::string::npos);
          throw;
        }
      },
      InvalidArgument);
  EXPECT_EQ(null.num_allocs(), 0);
}

TEST(TraceReplay, SizeBeyondAnyProviderNamesTheOp) {
  AllocTrace t;
  t.alloc(4096, Category::kActivation, 0, "fine");
  t.alloc(kMaxAllocationSize + 1, Category::kActivation, 0, "absurd");
  NullProvider null;
  CachingAllocator alloc(null);
  try {
    replay(t, alloc);
    ADD_FAILURE() << "replayed a 2^50+1 byte allocation";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("op 1 (alloc id 1)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(alloc.stats().allocation[kStatAll].current, 0);  // the first block was freed
}

TEST(TraceReplay, OutOfMemoryIsCountedAndReplayContinues) {
  const AllocTrace trace = make_gpt_training_trace(small_spec());
  // Enough for the persistent state, not for the activations of a step.
  const TraceSummary sum = trace.validate();
  NullProvider null;
  CachingAllocator alloc(null);
  alloc.set_budget(sum.persistent_bytes + (sum.peak_live_bytes - sum.persistent_bytes) / 2);
  const ReplayResult r = replay(trace, alloc);
  EXPECT_GT(r.num_ooms, 0);
  EXPECT_EQ(r.num_ooms, alloc.stats().num_ooms);
  EXPECT_LT(r.peak_live_bytes, sum.peak_live_bytes);
  EXPECT_EQ(alloc.stats().allocation[kStatAll].current, 0);
  alloc.check_invariants();
}

}  // namespace
}  // namespace memfit
