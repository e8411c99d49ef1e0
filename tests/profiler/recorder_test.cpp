// Recorder: totals and peaks equal the allocator's own stats after random alloc/free sequences;
// the ring drops the oldest events and folds them into the base so the kept ones replay to the
// right totals; the peak's category bytes, phase, block and per-block live bytes; ranges paired
// per thread; clear() and stop(); and an instrumented Trainer step on the CPU.
#include "profiler/recorder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/model.h"
#include "core/text_dataset.h"
#include "memory/error.h"
#include "memory/null_provider.h"
#include "policies/trainer.h"
#include "tests/core/exec_testutil.h"

namespace memfit {
namespace {

std::size_t cur(const StatArray& s) { return static_cast<std::size_t>(s[kStatAll].current); }
std::size_t peak(const StatArray& s) { return static_cast<std::size_t>(s[kStatAll].peak); }

std::size_t sum(const CategoryBytes& b) {
  return std::accumulate(b.begin(), b.end(), std::size_t{0});
}

CategoryBytes current_categories(const AllocatorStats& s) {
  CategoryBytes b{};
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    b[c] = static_cast<std::size_t>(s.category_bytes[c].current);
  }
  return b;
}

// Checks a recording against the allocator now and against itself: replaying the kept events
// from the base gives every event's totals and ends at the current state.
void expect_consistent(const Recording& r, const CachingAllocator& alloc) {
  const AllocatorStats s = alloc.stats();
  EXPECT_EQ(r.current_allocated, cur(s.allocated_bytes));
  EXPECT_EQ(r.current_reserved, cur(s.reserved_bytes));
  EXPECT_EQ(r.current_by_category, current_categories(s));
  EXPECT_EQ(r.listener_failures, 0u);
  CategoryBytes run = r.base_by_category;
  std::size_t allocated = r.base_allocated, reserved = r.base_reserved;
  EXPECT_EQ(sum(run), allocated);
  for (std::size_t i = 0; i < r.events.size(); ++i) {
    const TimelineEvent& e = r.events[i];
    const std::size_t c = category_index(e.category);
    switch (e.kind) {
      case EventKind::kAlloc:
        run[c] += e.size;
        allocated += e.size;
        break;
      case EventKind::kFreeRequested:
        ASSERT_GE(run[c], e.size) << "event " << i;
        run[c] -= e.size;
        allocated -= e.size;
        break;
      case EventKind::kSegmentAlloc:
        reserved += e.size;
        break;
      case EventKind::kSegmentFree:
        reserved -= e.size;
        break;
      default:
        break;
    }
    ASSERT_EQ(e.allocated, allocated) << "event " << i;
    ASSERT_EQ(e.reserved, reserved) << "event " << i;
    if (i > 0) ASSERT_LE(r.events[i - 1].time_ns, e.time_ns) << "event " << i;
  }
  EXPECT_EQ(run, r.current_by_category);
  EXPECT_EQ(allocated, r.current_allocated);
  EXPECT_EQ(reserved, r.current_reserved);
  if (!r.events.empty()) EXPECT_EQ(r.by_category_at(r.events.size() - 1), r.current_by_category);
  EXPECT_EQ(sum(r.peak.by_category), r.peak.allocated);
}

// Random allocations and frees (sizes from 1 B to 3 MiB, every category, some blocks open),
// `ops` operations; returns the blocks still live.
std::vector<Block> churn(CachingAllocator& alloc, std::mt19937& rng, int ops,
                         std::vector<Block> live = {}) {
  std::uniform_int_distribution<int> coin(0, 99);
  std::uniform_int_distribution<std::size_t> small(1, 64 << 10), large(1, 3 << 20);
  std::uniform_int_distribution<int> cat(0, static_cast<int>(kCategoryCount) - 1);
  const char* blocks[] = {"h0", "h1", "embedding"};
  for (int i = 0; i < ops; ++i) {
    if (!live.empty() && coin(rng) < 45) {
      std::uniform_int_distribution<std::size_t> pick(0, live.size() - 1);
      const std::size_t k = pick(rng);
      std::swap(live[k], live.back());
      live.pop_back();  // frees it
    } else {
      ScopedRange p(coin(rng) < 50 ? RangeKind::kForward : RangeKind::kBackward);
      ScopedRange b(RangeKind::kBlock, blocks[coin(rng) % 3]);
      const std::size_t n = coin(rng) < 80 ? small(rng) : large(rng);
      live.push_back(alloc.allocate(n, static_cast<Category>(cat(rng)), kDefaultStream, "churn"));
    }
  }
  return live;
}

TEST(Recorder, TotalsAndPeaksEqualTheAllocatorsAfterRandomSequences) {
  for (unsigned seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    NullProvider null;
    CachingAllocator alloc(null);
    std::mt19937 rng(seed);
    // Blocks live before the Recorder existed count as "before": category kept, block 0.
    std::vector<Block> live = churn(alloc, rng, 50);
    alloc.reset_peak_stats();  // the allocator's peaks now cover the same span as the Recorder's
    const std::size_t before = cur(alloc.stats().allocated_bytes);
    Recorder rec(alloc);
    {
      const Recording r0 = rec.recording();
      EXPECT_TRUE(r0.events.empty());
      EXPECT_EQ(r0.base_allocated, before);
      EXPECT_EQ(r0.peak.allocated, before);
      ASSERT_EQ(r0.peak.blocks.size(), before > 0 ? 1u : 0u);
      if (before > 0) EXPECT_EQ(r0.peak.blocks[0].block, 0u);
    }
    live = churn(alloc, rng, 2000, std::move(live));
    alloc.empty_cache();  // segment frees too
    live = churn(alloc, rng, 500, std::move(live));
    const Recording r = rec.recording();
    expect_consistent(r, alloc);
    const AllocatorStats s = alloc.stats();
    EXPECT_EQ(r.peak.allocated, peak(s.allocated_bytes));
    EXPECT_EQ(r.peak_reserved, peak(s.reserved_bytes));
    EXPECT_EQ(r.dropped_events, 0u);
    EXPECT_EQ(r.base_allocated, before);
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      EXPECT_LE(r.peak.by_category[c], static_cast<std::size_t>(s.category_bytes[c].peak));
    }
    // The per-block figures at the peak add up to it, largest first, and name only the blocks
    // the churn used (or 0: before).
    std::size_t block_sum = 0;
    for (std::size_t i = 0; i < r.peak.blocks.size(); ++i) {
      block_sum += r.peak.blocks[i].bytes;
      if (i > 0) EXPECT_GE(r.peak.blocks[i - 1].bytes, r.peak.blocks[i].bytes);
      const std::string_view name = interned_name(r.peak.blocks[i].block);
      EXPECT_TRUE(name.empty() || name == "h0" || name == "h1" || name == "embedding") << name;
    }
    EXPECT_EQ(block_sum, r.peak.allocated);
    // The peak event is the first event that reached the peak.
    auto at_peak = std::find_if(r.events.begin(), r.events.end(), [&](const TimelineEvent& e) {
      return e.allocated == r.peak.allocated;
    });
    if (r.peak.allocated > before) {
      ASSERT_NE(at_peak, r.events.end());
      EXPECT_EQ(at_peak->time_ns, r.peak.time_ns);
      EXPECT_EQ(at_peak->phase, r.peak.phase);
      EXPECT_EQ(at_peak->block, r.peak.block);
      EXPECT_EQ(r.by_category_at(static_cast<std::size_t>(at_peak - r.events.begin())),
                r.peak.by_category);
    }
    live.clear();
    expect_consistent(rec.recording(), alloc);
    EXPECT_EQ(rec.recording().current_allocated, 0u);
  }
}

TEST(Recorder, TheRingDropsTheOldestAndTheBaseReplaysToTheTotals) {
  NullProvider null;
  CachingAllocator alloc(null);
  Recorder all(alloc);  // unbounded in practice: the reference
  Recorder ring(alloc, {.capacity = 16, .range_capacity = 4});
  std::mt19937 rng(7);
  std::vector<Block> live = churn(alloc, rng, 300);
  const Recording r = ring.recording();
  const Recording a = all.recording();
  ASSERT_EQ(r.events.size(), 16u);
  ASSERT_GT(a.events.size(), 16u);
  EXPECT_EQ(r.dropped_events, a.events.size() - 16);
  expect_consistent(r, alloc);
  // The kept events are the reference's last 16, and the base is the reference's state just
  // before them.
  const std::size_t first = a.events.size() - 16;
  for (std::size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(r.events[i].time_ns, a.events[first + i].time_ns);
    EXPECT_EQ(r.events[i].addr, a.events[first + i].addr);
    EXPECT_EQ(r.events[i].kind, a.events[first + i].kind);
  }
  EXPECT_EQ(r.base_by_category, a.by_category_at(first - 1));
  EXPECT_EQ(r.base_allocated, a.events[first - 1].allocated);
  EXPECT_EQ(r.base_reserved, a.events[first - 1].reserved);
  for (std::size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(r.by_category_at(i), a.by_category_at(first + i)) << i;
  }
  // Exact figures whatever was dropped.
  EXPECT_EQ(r.peak.allocated, a.peak.allocated);
  EXPECT_EQ(r.peak.by_category, a.peak.by_category);
  EXPECT_EQ(r.peak.time_ns, a.peak.time_ns);
  EXPECT_EQ(r.peak_reserved, a.peak_reserved);
  EXPECT_EQ(r.peak.blocks.size(), a.peak.blocks.size());
  EXPECT_THROW((void)r.by_category_at(16), InvalidArgument);
  // Ranges: 600 opened and closed by churn's allocations... far more than 4 kept.
  EXPECT_EQ(r.ranges.size(), 4u);
  EXPECT_EQ(r.dropped_ranges + r.ranges.size(), a.ranges.size());
}

TEST(Recorder, PeakNamesItsPhaseBlockAndLiveBytesPerBlock) {
  NullProvider null;
  CachingAllocator alloc(null);
  Block before = alloc.allocate(1000, Category::kParameter, kDefaultStream, "w");  // 1024
  Recorder rec(alloc);
  std::vector<Block> keep;
  {
    ScopedRange step(RangeKind::kStep, "step 1");
    {
      ScopedRange f(RangeKind::kForward);
      {
        ScopedRange b(RangeKind::kBlock, "pk_a");
        keep.push_back(alloc.allocate(4 << 10, Category::kActivation));
      }
      ScopedRange b(RangeKind::kBlock, "pk_b");
      Block big = alloc.allocate(64 << 10, Category::kActivation);
      Block tmp = alloc.allocate(8 << 10, Category::kTemporary);  // the peak: 1 + 4 + 64 + 8 KiB
    }
    ScopedRange bw(RangeKind::kBackward);
    ScopedRange b(RangeKind::kBlock, "pk_a");
    Block g = alloc.allocate(16 << 10, Category::kGradient);  // below the peak
  }
  const Recording r = rec.recording();
  expect_consistent(r, alloc);
  EXPECT_EQ(r.peak.allocated, std::size_t{1024 + (4 << 10) + (64 << 10) + (8 << 10)});
  EXPECT_EQ(r.peak.phase, intern_name("forward"));
  EXPECT_EQ(r.peak.block, intern_name("pk_b"));
  EXPECT_EQ(r.peak.by_category[category_index(Category::kActivation)], std::size_t{68 << 10});
  EXPECT_EQ(r.peak.by_category[category_index(Category::kTemporary)], std::size_t{8 << 10});
  EXPECT_EQ(r.peak.by_category[category_index(Category::kParameter)], 1024u);
  ASSERT_EQ(r.peak.blocks.size(), 3u);
  EXPECT_EQ(r.peak.blocks[0].block, intern_name("pk_b"));
  EXPECT_EQ(r.peak.blocks[0].bytes, std::size_t{72 << 10});
  EXPECT_EQ(r.peak.blocks[1].block, intern_name("pk_a"));
  EXPECT_EQ(r.peak.blocks[1].bytes, std::size_t{4 << 10});
  EXPECT_EQ(r.peak.blocks[2].block, 0u);  // "before"
  EXPECT_EQ(r.peak.blocks[2].bytes, 1024u);
  // Every event carries the phase and block of its moment.
  std::set<std::pair<std::string, std::string>> seen;
  for (const TimelineEvent& e : r.events) {
    if (e.kind != EventKind::kAlloc) continue;
    seen.emplace(interned_name(e.phase), interned_name(e.block));
  }
  const std::set<std::pair<std::string, std::string>> want = {
      {"forward", "pk_a"}, {"forward", "pk_b"}, {"backward", "pk_a"}};
  EXPECT_EQ(seen, want);
  // Ranges: step, forward, two blocks, backward, one block; by begin time, paired.
  ASSERT_EQ(r.ranges.size(), 6u);
  EXPECT_EQ(r.ranges[0].kind, RangeKind::kStep);
  EXPECT_EQ(interned_name(r.ranges[0].name), "step 1");
  EXPECT_EQ(r.ranges[0].depth, 0);
  for (const RangeRecord& x : r.ranges) {
    EXPECT_LE(x.begin_ns, x.end_ns);
    EXPECT_GE(x.begin_ns, r.ranges[0].begin_ns);
    EXPECT_LE(x.end_ns, r.ranges[0].end_ns);
    EXPECT_EQ(x.thread, r.ranges[0].thread);
  }
  for (std::size_t i = 1; i < r.ranges.size(); ++i) {
    EXPECT_LE(r.ranges[i - 1].begin_ns, r.ranges[i].begin_ns);
  }
}

// What setup allocates (a spike freed before the first step) is the whole run's peak, not the
// steps': the steps' peak starts from the state when the first step range begins.
TEST(Recorder, TheStepsPeakExcludesSetupAndStartsFromTheStateAtTheFirstStep) {
  NullProvider null;
  CachingAllocator alloc(null);
  Recorder rec(alloc);
  EXPECT_FALSE(rec.recording().has_steps());
  Block params;
  {
    ScopedRange setup(RangeKind::kSetup);
    params = alloc.allocate(256 << 10, Category::kParameter);
    Block staging = alloc.allocate(1 << 20, Category::kTemporary);  // the whole run's peak
  }
  {
    const Recording before = rec.recording();
    EXPECT_FALSE(before.has_steps());
    EXPECT_EQ(&before.steps_peak(), &before.peak);  // no step yet: the whole run's
  }
  {
    ScopedRange step(RangeKind::kStep, "step");
    ScopedRange f(RangeKind::kForward);
    ScopedRange b(RangeKind::kBlock, "sp_h0");
    Block act = alloc.allocate(512 << 10, Category::kActivation);
  }
  {
    ScopedRange step(RangeKind::kStep, "step");
    Block small = alloc.allocate(64 << 10, Category::kActivation);  // below the first step's
  }
  const Recording r = rec.recording();
  expect_consistent(r, alloc);
  ASSERT_TRUE(r.has_steps());
  EXPECT_EQ(r.peak.allocated, std::size_t{(256 << 10) + (1 << 20)});
  EXPECT_EQ(r.peak.phase, intern_name("setup"));
  EXPECT_EQ(r.steps_peak().allocated, std::size_t{(256 << 10) + (512 << 10)});
  EXPECT_EQ(r.steps_peak().phase, intern_name("forward"));
  EXPECT_EQ(r.steps_peak().block, intern_name("sp_h0"));
  EXPECT_EQ(r.steps_peak().by_category[category_index(Category::kTemporary)], 0u);
  EXPECT_GT(r.steps_peak().time_ns, r.steps_begin_ns);
  // Reserved: what setup reserved is still reserved when the steps begin, so it counts.
  EXPECT_EQ(r.steps_peak_reserved(), r.peak_reserved);
  EXPECT_GE(r.steps_begin_ns, r.peak.time_ns);
  params.reset();
  // clear() re-arms: the next step range starts a new steps' peak.
  rec.clear();
  EXPECT_FALSE(rec.recording().has_steps());
}

TEST(Recorder, RangesOpenAtEitherEndAndPerThreadStacks) {
  NullProvider null;
  CachingAllocator alloc(null);
  auto outer = std::make_unique<ScopedRange>(RangeKind::kStep, "opened before");
  Recorder rec(alloc);
  outer.reset();  // its end pairs with no begin: it began no later than the recording
  std::thread([&] {
    ScopedRange f(RangeKind::kForward);
    ScopedRange b(RangeKind::kBlock, "worker block");
    Block x = alloc.allocate(512, Category::kActivation);
  }).join();
  ScopedRange still(RangeKind::kOptimizer);
  Block y = alloc.allocate(512, Category::kOptimizerState);
  const Recording r = rec.recording();
  ASSERT_EQ(r.ranges.size(), 4u);
  const RangeRecord& before = r.ranges[0];
  EXPECT_EQ(interned_name(before.name), "opened before");
  EXPECT_EQ(before.begin_ns, r.start_ns);
  EXPECT_GE(before.end_ns, r.start_ns);
  const RangeRecord& open = r.ranges.back();
  EXPECT_EQ(open.kind, RangeKind::kOptimizer);
  EXPECT_EQ(open.end_ns, open.begin_ns);  // still open at recording() time
  EXPECT_EQ(r.ranges[1].kind, RangeKind::kForward);
  EXPECT_EQ(r.ranges[2].kind, RangeKind::kBlock);
  EXPECT_EQ(r.ranges[1].thread, r.ranges[2].thread);
  EXPECT_NE(r.ranges[1].thread, open.thread);
  EXPECT_EQ(r.ranges[2].depth, 1);
  // The worker: segment, alloc, free requested, free completed; y: a segment of the
  // persistent pool (optimizer state) and its alloc.
  ASSERT_EQ(r.events.size(), 6u);
  EXPECT_EQ(interned_name(r.events[1].block), "worker block");
  EXPECT_EQ(r.events.back().phase_kind, RangeKind::kOptimizer);
  EXPECT_EQ(r.events.back().block, 0u);
  EXPECT_LE(r.start_ns, r.events.front().time_ns);
  EXPECT_GE(r.end_ns, r.events.back().time_ns);
}

TEST(Recorder, ConcurrentThreadsAreAttributedToTheirOwnBlocks) {
  NullProvider null;
  CachingAllocator alloc(null);
  Recorder rec(alloc);
  auto work = [&](const char* block, Category c) {
    ScopedRange b(RangeKind::kBlock, block);
    std::vector<Block> v;
    for (int i = 0; i < 200; ++i) v.push_back(alloc.allocate(512 * (1 + i % 5), c));
  };
  std::thread a(work, "conc_a", Category::kActivation), b(work, "conc_b", Category::kGradient);
  a.join();
  b.join();
  const Recording r = rec.recording();
  expect_consistent(r, alloc);
  int n = 0;
  for (const TimelineEvent& e : r.events) {
    if (e.kind != EventKind::kAlloc) continue;
    ++n;
    EXPECT_EQ(interned_name(e.block), e.category == Category::kActivation ? "conc_a" : "conc_b");
  }
  EXPECT_EQ(n, 400);
  std::size_t at_peak = 0;
  for (const BlockBytes& b : r.peak.blocks) at_peak += b.bytes;
  EXPECT_EQ(at_peak, r.peak.allocated);
}

TEST(Recorder, ClearRestartsFromNowAndStopFreezes) {
  NullProvider null;
  auto alloc = std::make_unique<CachingAllocator>(null);
  Recorder rec(*alloc);
  Block a = alloc->allocate(1 << 20, Category::kActivation);
  { Block t = alloc->allocate(2 << 20, Category::kTemporary); }
  rec.clear();
  Recording r = rec.recording();
  EXPECT_TRUE(r.events.empty());
  EXPECT_TRUE(r.ranges.empty());
  EXPECT_EQ(r.dropped_events, 0u);
  EXPECT_EQ(r.base_allocated, std::size_t{1} << 20);
  EXPECT_EQ(r.peak.allocated, std::size_t{1} << 20);  // the peak restarts from now
  EXPECT_EQ(r.base_by_category[category_index(Category::kActivation)], std::size_t{1} << 20);
  a = Block();  // live blocks stay known: a's free is attributed and subtracted
  r = rec.recording();
  expect_consistent(r, *alloc);
  EXPECT_EQ(r.current_allocated, 0u);

  rec.stop();
  const std::int64_t end = rec.recording().end_ns;
  Block b = alloc->allocate(512, Category::kInput);
  r = rec.recording();
  EXPECT_EQ(r.end_ns, end);
  EXPECT_EQ(r.current_allocated, 0u);  // nothing after stop()
  rec.stop();                          // twice is fine
  b = Block();
  alloc.reset();  // the allocator may go once stopped
  EXPECT_EQ(rec.recording().current_allocated, 0u);
}

TEST(Recorder, RejectsZeroCapacities) {
  NullProvider null;
  CachingAllocator alloc(null);
  EXPECT_THROW(Recorder(alloc, {.capacity = 0}), InvalidArgument);
  EXPECT_THROW(Recorder(alloc, {.capacity = 1, .range_capacity = 0}), InvalidArgument);
  Recorder ok(alloc, {.capacity = 1, .range_capacity = 1});
  Block x = alloc.allocate(512, Category::kActivation);
  EXPECT_EQ(ok.recording().events.size(), 1u);
}

// ---- an instrumented training step on the CPU -----------------------------------------------

TEST(Recorder, AnInstrumentedTrainerStepHasPhasesBlocksAndThePeaksOwn) {
  for (bool offload : {false, true}) {
    SCOPED_TRACE(offload ? "offload" : "device adamw");
    testing::Rig rig(/*meta=*/false, {}, nullptr, {.worker_streams = offload});
    LayerContext ctx = rig.ctx(DType::kF32);
    Model m(testing::tiny_gpt_spec(/*layers=*/3), ctx);
    TrainerOptions o;
    o.policy.checkpoint = Checkpointing::all();  // recomputation in the backward
    o.policy.micro_batch = 2;
    o.policy.offload.optimizer = offload;
    Trainer t(m, ctx, o);
    Recorder rec(*rig.alloc);
    const StepResult s = t.step(testing::test_corpus().sequential(4, 32, 0));
    const Recording r = rec.recording();
    expect_consistent(r, *rig.alloc);
    // The trainer reset the allocator's peaks at the step's start, when the Recorder's began.
    EXPECT_EQ(r.peak.allocated, s.peaks.allocated);
    EXPECT_EQ(r.peak_reserved, s.peaks.reserved);
    EXPECT_NE(r.peak.phase, 0u);
    EXPECT_NE(r.peak.block, 0u);
    EXPECT_FALSE(r.peak.blocks.empty());

    std::set<std::string> phases, blocks;
    for (const TimelineEvent& e : r.events) {
      if (e.kind != EventKind::kAlloc) continue;
      phases.insert(std::string(range_kind_name(e.phase_kind)));
      if (e.block != 0) blocks.insert(std::string(interned_name(e.block)));
    }
    for (const char* p : {"forward", "backward", "recompute", "micro_batch"}) {
      EXPECT_TRUE(phases.count(p)) << p;
    }
    for (int i = 0; i < m.num_blocks(); ++i) EXPECT_TRUE(blocks.count(m.block(i).name()));
    EXPECT_TRUE(blocks.count("embedding"));
    EXPECT_TRUE(blocks.count("head"));

    std::map<std::string, int> kinds;
    std::set<std::string> names;
    for (const RangeRecord& x : r.ranges) {
      ++kinds[range_kind_name(x.kind)];
      names.insert(std::string(interned_name(x.name)));
      EXPECT_LE(x.begin_ns, x.end_ns);
    }
    EXPECT_EQ(kinds["step"], 1);
    EXPECT_TRUE(names.count("step"));  // one name for every step (no per-step interning)
    EXPECT_EQ(kinds["micro_batch"], 2);
    EXPECT_GE(kinds["forward"], 2);
    EXPECT_GE(kinds["backward"], 2);
    EXPECT_GE(kinds["recompute"], 2);
    EXPECT_EQ(kinds["optimizer"], offload ? 1 : 2);  // DeviceAdamW opens its own
    if (offload) {
      EXPECT_GE(kinds["offload"], 3);
      EXPECT_TRUE(names.count("host_adamw"));
      EXPECT_TRUE(names.count("weights_to_device"));
      EXPECT_TRUE(names.count("grads_to_host"));
    } else {
      EXPECT_EQ(kinds["offload"], 0);
    }
    // The block ranges: each of the model's blocks has a forward and a backward every
    // micro-batch (checkpoint all: plus a recomputation).
    int per_block = 0;
    for (const RangeRecord& x : r.ranges) {
      per_block += x.kind == RangeKind::kBlock && interned_name(x.name) == m.block(0).name();
    }
    EXPECT_EQ(per_block, 2 * 3);
  }
}

// Pinned host regions: a Recorder started before the trainer hears the optimizer's slab parts
// and the activation stash's room, and its figures are the trainer's own; regions alive when
// it starts are its base; the trainer's destruction takes them away.
TEST(Recorder, HearsOffloadsPinnedHostRegionsByCategory) {
  testing::Rig rig(/*meta=*/false);
  LayerContext ctx = rig.ctx(DType::kBF16);
  const CategoryBytes before = host_region_bytes();
  Recorder rec(*rig.alloc);
  TrainerOptions o;
  o.policy.dtype = DType::kBF16;
  o.policy.checkpoint = Checkpointing::every(2);
  o.policy.offload = OffloadSwitches::parse("all");
  Model m(testing::tiny_gpt_spec(/*layers=*/4), ctx, Trainer::placement(o.policy));
  auto t = std::make_unique<Trainer>(m, ctx, o);
  const StepResult s = t->step(testing::test_corpus().sequential(2, 32, 0));
  Recording r = rec.recording();
  EXPECT_EQ(r.host_base, before);
  EXPECT_EQ(r.host_peak, total_bytes(before) + t->host_bytes());
  EXPECT_EQ(s.peaks.host_pinned, t->host_bytes());
  EXPECT_EQ(s.peaks.host_at_peak, t->host_by_category());
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    EXPECT_EQ(r.host_at_peak[c], before[c] + s.peaks.host_at_peak[c]) << c;
  }
  for (Category c : {Category::kOptimizerState, Category::kGradient, Category::kParameter,
                     Category::kActivation}) {
    EXPECT_GT(s.peaks.host_at_peak[category_index(c)], 0u) << category_name(c);
  }
  ASSERT_EQ(r.host_events.size(), 5u);  // masters, moments, gradients, staging; the room
  EXPECT_EQ(r.host_events.back().category, Category::kActivation);
  EXPECT_EQ(interned_name(r.host_events.back().tag), "checkpoint_room");
  t.reset();
  r = rec.recording();
  EXPECT_EQ(r.host_current, before);
  EXPECT_EQ(r.host_events.size(), 10u);
  rec.clear();
  EXPECT_TRUE(rec.recording().host_events.empty());
  EXPECT_EQ(rec.recording().host_base, before);
}

// clear() inside a step (or a Recorder made inside one) starts the steps' peak at once; step
// ranges are numbered by the Recorder's count of their begins.
TEST(Recorder, AStepUnderWayAtClearIsTheStepsAndStepsAreNumbered) {
  NullProvider null;
  CachingAllocator alloc(null);
  {
    ScopedRange outer(RangeKind::kStep, "step");
    Recorder inside(alloc);  // made inside a step it has not heard begin
    Block a = alloc.allocate(128 << 10, Category::kActivation);
    const Recording r = inside.recording();
    ASSERT_TRUE(r.has_steps());
    EXPECT_EQ(r.steps_peak().allocated, std::size_t{128 << 10});
  }
  Recorder rec(alloc);
  for (int i = 0; i < 3; ++i) {
    ScopedRange step(RangeKind::kStep, "step");
    Block a = alloc.allocate(64 << 10, Category::kActivation);
    if (i == 1) {
      Block big = alloc.allocate(1 << 20, Category::kActivation);
      rec.clear();  // the step under way is the steps' from here
      Block more = alloc.allocate(256 << 10, Category::kActivation);
      const Recording r = rec.recording();
      ASSERT_TRUE(r.has_steps());
      EXPECT_EQ(r.steps_peak().allocated, std::size_t{(64 << 10) + (1 << 20) + (256 << 10)});
    }
  }
  const Recording r = rec.recording();
  std::vector<std::uint32_t> ordinals;
  for (const RangeRecord& g : r.ranges) {
    if (g.kind == RangeKind::kStep) ordinals.push_back(g.ordinal);
  }
  // Counted from the Recorder's start, across clear(): the step under way then was the 2nd.
  EXPECT_EQ(ordinals, (std::vector<std::uint32_t>{2, 3}));
}

}  // namespace
}  // namespace memfit
