// ScopedRange: nesting and the phase/block of a moment, unwinding on exceptions, per-thread
// stacks, name interning (dense ids, stable names, concurrent interning agrees), listeners
// (order, depth, thread, removal waits for calls in flight, a throwing or range-opening
// listener breaks nothing).
#include "profiler/scoped_range.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace memfit {
namespace {

// Names no other test interns: ids dense from here on.
std::string unique_name(const std::string& stem) {
  static std::atomic<int> n{0};
  return "scoped_range_test/" + stem + "/" + std::to_string(n.fetch_add(1));
}

TEST(ScopedRange, KindNamesAndPhases) {
  const char* expected[kRangeKindCount] = {"step",      "micro_batch", "forward", "backward",
                                           "recompute", "optimizer",   "offload", "setup",
                                           "block",     "other"};
  for (int k = 0; k < kRangeKindCount; ++k) {
    EXPECT_STREQ(range_kind_name(static_cast<RangeKind>(k)), expected[k]);
    EXPECT_EQ(is_phase(static_cast<RangeKind>(k)), k < 8) << expected[k];
  }
}

TEST(ScopedRange, NestingGivesTheInnermostPhaseAndBlock) {
  ASSERT_TRUE(current_ranges().empty());
  EXPECT_EQ(current_phase().phase, 0u);
  EXPECT_EQ(current_phase().block, 0u);
  {
    ScopedRange step(RangeKind::kStep, "step 3");
    EXPECT_EQ(current_phase().phase, intern_name("step 3"));
    EXPECT_EQ(current_phase().phase_kind, RangeKind::kStep);
    {
      ScopedRange f(RangeKind::kForward);
      ScopedRange b(RangeKind::kBlock, "h0");
      ScopedRange o(RangeKind::kOther, "mine");  // neither phase nor block: changes nothing
      const PhaseContext now = current_phase();
      EXPECT_EQ(interned_name(now.phase), "forward");  // an empty name is the kind's
      EXPECT_EQ(now.phase_kind, RangeKind::kForward);
      EXPECT_EQ(interned_name(now.block), "h0");
      const std::vector<RangeFrame>& st = current_ranges();
      ASSERT_EQ(st.size(), 4u);
      EXPECT_EQ(st[0].kind, RangeKind::kStep);
      EXPECT_EQ(st[1].kind, RangeKind::kForward);
      EXPECT_EQ(st[2].name, intern_name("h0"));
      EXPECT_EQ(interned_name(st[3].name), "mine");
      for (std::size_t i = 1; i < st.size(); ++i) EXPECT_LE(st[i - 1].start_ns, st[i].start_ns);
      {
        // A block inside a block: the inner one; a phase inside a block: the phase changes,
        // the block stays.
        ScopedRange r(RangeKind::kRecompute, std::uint32_t{0});  // id 0: the kind's name
        ScopedRange b2(RangeKind::kBlock, intern_name("h1"));
        EXPECT_EQ(interned_name(current_phase().phase), "recompute");
        EXPECT_EQ(current_phase().phase_kind, RangeKind::kRecompute);
        EXPECT_EQ(interned_name(current_phase().block), "h1");
      }
      EXPECT_EQ(interned_name(current_phase().phase), "forward");
      EXPECT_EQ(interned_name(current_phase().block), "h0");
    }
    EXPECT_EQ(current_phase().block, 0u);
    EXPECT_EQ(current_ranges().size(), 1u);
  }
  EXPECT_TRUE(current_ranges().empty());
}

TEST(ScopedRange, AnExceptionClosesEveryRangeItLeaves) {
  ScopedRange outer(RangeKind::kStep, "outer");
  try {
    ScopedRange f(RangeKind::kBackward);
    ScopedRange b(RangeKind::kBlock, "h7");
    ASSERT_EQ(current_ranges().size(), 3u);
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  ASSERT_EQ(current_ranges().size(), 1u);
  EXPECT_EQ(interned_name(current_ranges()[0].name), "outer");
  EXPECT_EQ(current_phase().phase_kind, RangeKind::kStep);
}

TEST(ScopedRange, EachThreadHasItsOwnStack) {
  // Both threads hold their ranges open at the same time (the latches), and each sees only
  // its own.
  std::latch opened(2), checked(2);
  std::string seen[2];
  std::size_t depth[2] = {};
  auto work = [&](int t) {
    ScopedRange p(t == 0 ? RangeKind::kForward : RangeKind::kBackward);
    ScopedRange b(RangeKind::kBlock, t == 0 ? "thread0_block" : "thread1_block");
    opened.arrive_and_wait();
    seen[t] = std::string(interned_name(current_phase().phase)) + "/" +
              std::string(interned_name(current_phase().block));
    depth[t] = current_ranges().size();
    checked.arrive_and_wait();
  };
  ScopedRange mine(RangeKind::kOptimizer);
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  EXPECT_EQ(seen[0], "forward/thread0_block");
  EXPECT_EQ(seen[1], "backward/thread1_block");
  EXPECT_EQ(depth[0], 2u);
  EXPECT_EQ(depth[1], 2u);
  EXPECT_EQ(current_ranges().size(), 1u);  // this thread's own, untouched
  EXPECT_EQ(current_phase().phase_kind, RangeKind::kOptimizer);
}

TEST(ScopedRange, InterningIsDenseStableAndAgreesAcrossThreads) {
  EXPECT_EQ(intern_name(""), 0u);
  EXPECT_EQ(interned_name(0), "");
  const std::string a = unique_name("a"), b = unique_name("b");
  const std::uint32_t ia = intern_name(a);
  const std::uint32_t ib = intern_name(b);
  EXPECT_GT(ia, 0u);
  EXPECT_EQ(ib, ia + 1);  // dense: the next new name gets the next id
  EXPECT_EQ(intern_name(a), ia);
  const std::string_view va = interned_name(ia);
  EXPECT_EQ(va, a);
  EXPECT_EQ(interned_name(0xFFFFFFF0u), "");  // unknown

  // Many new names from four threads at once: every thread gets the same id for a name, the
  // ids are distinct and dense, and the first view handed out still reads the same (no move).
  constexpr int kNames = 500;
  std::vector<std::string> names;
  for (int i = 0; i < kNames; ++i) names.push_back(unique_name("mt"));
  std::vector<std::vector<std::uint32_t>> ids(4, std::vector<std::uint32_t>(kNames));
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kNames; ++i) {
        const int k = t % 2 == 0 ? i : kNames - 1 - i;  // opposite orders race on each name
        ids[t][k] = intern_name(names[k]);
      }
    });
  }
  for (auto& t : ts) t.join();
  std::set<std::uint32_t> distinct;
  for (int i = 0; i < kNames; ++i) {
    for (int t = 1; t < 4; ++t) ASSERT_EQ(ids[t][i], ids[0][i]) << names[i];
    EXPECT_EQ(interned_name(ids[0][i]), names[i]);
    distinct.insert(ids[0][i]);
  }
  ASSERT_EQ(distinct.size(), static_cast<std::size_t>(kNames));
  EXPECT_EQ(*distinct.rbegin() - *distinct.begin(), static_cast<std::uint32_t>(kNames - 1));
  EXPECT_EQ(va, a);
  EXPECT_EQ(va.data(), interned_name(ia).data());
}

TEST(ScopedRange, ListenersHearBeginsAndEndsInOrder) {
  std::mutex mu;
  std::vector<RangeEvent> heard;
  const std::uint64_t id = add_range_listener([&](const RangeEvent& e) {
    std::lock_guard lock(mu);
    heard.push_back(e);
  });
  {
    ScopedRange s(RangeKind::kStep, "listened step");
    ScopedRange b(RangeKind::kBlock, "listened block");
  }
  std::uint64_t other_thread = 0;
  std::thread([&] {
    ScopedRange f(RangeKind::kForward);
    std::lock_guard lock(mu);
    other_thread = heard.back().thread;
  }).join();
  remove_range_listener(id);
  { ScopedRange unheard(RangeKind::kOther, "after removal"); }

  std::lock_guard lock(mu);
  ASSERT_EQ(heard.size(), 6u);
  const RangeEvent& e0 = heard[0];
  EXPECT_TRUE(e0.begin);
  EXPECT_EQ(e0.kind, RangeKind::kStep);
  EXPECT_EQ(interned_name(e0.name), "listened step");
  EXPECT_EQ(e0.depth, 0);
  EXPECT_TRUE(heard[1].begin);
  EXPECT_EQ(heard[1].depth, 1);
  EXPECT_FALSE(heard[2].begin);  // the inner end first
  EXPECT_EQ(interned_name(heard[2].name), "listened block");
  EXPECT_EQ(heard[2].depth, 1);
  EXPECT_FALSE(heard[3].begin);
  EXPECT_EQ(heard[3].kind, RangeKind::kStep);
  EXPECT_EQ(heard[3].depth, 0);
  for (int i = 1; i < 4; ++i) {
    EXPECT_LE(heard[i - 1].time_ns, heard[i].time_ns);
    EXPECT_EQ(heard[i].thread, e0.thread);
  }
  EXPECT_GE(e0.thread, 1u);
  EXPECT_NE(other_thread, e0.thread);  // the other thread's own number
  EXPECT_EQ(heard[4].thread, other_thread);
  EXPECT_EQ(heard[4].depth, 0);
  EXPECT_FALSE(heard[5].begin);
}

TEST(ScopedRange, AThrowingOrRangeOpeningListenerBreaksNothing) {
  int calls = 0;
  const std::uint64_t thrower = add_range_listener([&](const RangeEvent&) {
    ++calls;
    throw std::runtime_error("a listener must not throw");
  });
  // A listener that opens a range itself is not told about it (no recursion).
  int nested = 0;
  const std::uint64_t opener = add_range_listener([&](const RangeEvent&) {
    ++nested;
    ScopedRange inner(RangeKind::kOther, "from a listener");
  });
  {
    ScopedRange a(RangeKind::kForward);
    EXPECT_EQ(current_ranges().size(), 1u);
  }
  remove_range_listener(thrower);
  remove_range_listener(opener);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(nested, 2);
  EXPECT_TRUE(current_ranges().empty());
}

TEST(ScopedRange, RemovingAListenerWaitsForCallsInFlight) {
  std::atomic<bool> entered{false}, done{false};
  const std::uint64_t id = add_range_listener([&](const RangeEvent& e) {
    if (!e.begin || interned_name(e.name) != "slow listener") return;
    entered = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    done = true;
  });
  std::thread t([] { ScopedRange r(RangeKind::kOther, "slow listener"); });
  while (!entered) std::this_thread::yield();
  remove_range_listener(id);
  EXPECT_TRUE(done) << "remove_range_listener returned while its listener was still running";
  t.join();
}

}  // namespace
}  // namespace memfit
