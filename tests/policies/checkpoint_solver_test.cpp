// Checkpoint solvers: the memory model (simulate), the fixed rules, and the optimal dynamic
// program proved against an independent exhaustive search: a shortest path (uniform-cost
// search) over executor states under the same memory model, on random chains of 1..10 blocks.
#include "policies/checkpoint_solver.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "memory/error.h"
#include "policies/checkpoint_dp.h"

namespace memfit {
namespace {

using Op = ScheduleOp;

// Small integer sizes (bytes; with limits <= the slot count the DP's unit is 1 byte, so its
// discretization is exact) and integer times (sums are exact in double).
Chain random_chain(int n, std::mt19937& rng) {
  const auto r = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Chain c;
  for (int i = 0; i < n; ++i) {
    ChainBlock b;
    b.input_bytes = r(1, 4);
    b.saved_bytes = r(0, 6);
    b.saves_input = r(0, 1) == 1;
    b.fwd_workspace = r(0, 2);
    b.bwd_workspace = r(0, 3);
    b.fwd_time = r(1, 5);
    b.bwd_time = r(1, 8);
    // Half the blocks recompute for their backward in less time (-1: the whole forward).
    b.fwd_for_backward_time = r(0, 1) == 1 ? r(0, static_cast<int>(b.fwd_time)) : -1;
    c.blocks.push_back(b);
  }
  c.output_bytes = r(1, 4);
  c.head_bytes = r(0, 5);
  c.head_time = r(0, 3);
  return c;
}

std::string chain_str(const Chain& c) {
  std::string s;
  for (const ChainBlock& b : c.blocks) {
    s += "{x " + std::to_string(b.input_bytes) + " saved " + std::to_string(b.saved_bytes) +
         (b.saves_input ? "+x" : "") + " wf " + std::to_string(b.fwd_workspace) + " wb " +
         std::to_string(b.bwd_workspace) + " tf " + std::to_string(b.fwd_time) + " tfb " +
         std::to_string(b.fwd_for_backward_time) + " tb " +
         std::to_string(b.bwd_time) + "} ";
  }
  return s + "out " + std::to_string(c.output_bytes) + " head " + std::to_string(c.head_bytes) +
         " th " + std::to_string(c.head_time);
}

// ---- the exhaustive search ------------------------------------------------------------------
// Written from core/schedule.h's op semantics without the solver's code. A state: which x[k]
// slots are held, which blocks hold saved state, the next backward b (its gradient at x[b+1]
// once the head ran), whether the head ran, and `closed`: the x[k] the executor will never
// store again. The executor stores a forward's output iff a LATER forward reads it, so a search
// step that drops an output must forbid every later store of it (closed), or it would count
// less memory than the executor holds; a step that stores an output nobody reads only counts
// more, and the search also tries the step that drops it.
class Exhaustive {
 public:
  // persistent: a forward keeping nothing may only consume the x it reads right after the
  // forward that stored it (a checkpoint, once held past other ops, stays until its block's
  // keep-all forward or backward), and no forward runs below a block holding saved state:
  // Rotor's class of schedules, the DP's (checkpoint_dp.cpp).
  Exhaustive(const Chain& c, std::int64_t limit, bool persistent)
      : c_(c), n_(static_cast<int>(c.blocks.size())), limit_(limit), persistent_(persistent) {}

  std::optional<double> min_time() {
    struct Item {
      double d;
      std::uint64_t key;
      bool operator>(const Item& o) const { return d > o.d; }
    };
    std::priority_queue<Item, std::vector<Item>, std::greater<>> q;
    std::unordered_map<std::uint64_t, double> dist;
    const State init{1u, 0u, 0u, n_ - 1, false, 0};
    if (mem(init) > limit_) return std::nullopt;
    dist[key(init)] = 0;
    q.push({lower_bound(init), key(init)});
    while (!q.empty()) {
      const Item it = q.top();
      q.pop();
      const State st = decode(it.key);
      const double g = dist[it.key];
      if (it.d > g + lower_bound(st)) continue;  // a stale entry
      ++expanded_;
      if (st.nb < 0) {
        for (std::uint64_t k = it.key; k != key(init); k = parent_[k].first) {
          path_ = op_str(parent_[k].second) + (path_.empty() ? "" : " ") + path_;
        }
        return g;
      }
      const auto relax = [&](const State& to, double cost, int op) {
        const std::uint64_t k = key(to);
        const auto f = dist.find(k);
        const double h = lower_bound(to);
        if (h == std::numeric_limits<double>::infinity()) return;
        if (f == dist.end() || g + cost < f->second) {
          dist[k] = g + cost;
          parent_[k] = {it.key, op};
          q.push({g + cost + h, k});
        }
      };
      expand(st, relax);
    }
    return std::nullopt;
  }
  std::int64_t expanded() const { return expanded_; }
  // The optimal op sequence found ("F0:input(store) ... B0"), for failure messages.
  const std::string& path() const { return path_; }

 private:
  struct State {
    std::uint32_t held, saved, closed;
    int nb;  // next backward; -1 when done
    bool head;
    int fresh;  // k when the last op stored x[k] (persistent mode), else 0
  };
  static bool bit(std::uint32_t m, int k) { return ((m >> k) & 1u) != 0; }
  std::int64_t x(int k) const {
    return k < n_ ? c_.blocks[static_cast<std::size_t>(k)].input_bytes : c_.output_bytes;
  }
  std::uint64_t key(const State& s) const {
    return std::uint64_t{s.held} | std::uint64_t{s.saved} << 11 | std::uint64_t{s.closed} << 21 |
           std::uint64_t(s.nb + 1) << 32 | std::uint64_t{s.head} << 36 |
           std::uint64_t(s.fresh) << 37;
  }
  static State decode(std::uint64_t k) {
    return {static_cast<std::uint32_t>(k & 0x7ff),
            static_cast<std::uint32_t>((k >> 11) & 0x3ff),
            static_cast<std::uint32_t>((k >> 21) & 0x7ff),
            static_cast<int>((k >> 32) & 0xf) - 1,
            ((k >> 36) & 1) != 0,
            static_cast<int>((k >> 37) & 0xf)};
  }
  std::int64_t mem(const State& s) const {
    std::int64_t b = s.head ? x(s.nb + 1) : 0;  // the gradient
    for (int k = 0; k <= n_; ++k) {
      const bool by_block =
          k < n_ && bit(s.saved, k) && c_.blocks[static_cast<std::size_t>(k)].saves_input;
      if (bit(s.held, k) || by_block) b += x(k);
      if (k < n_ && bit(s.saved, k)) b += c_.blocks[static_cast<std::size_t>(k)].saved_bytes;
    }
    return b;
  }

  // A* with a consistent lower bound on the time still to spend: every backward left, a
  // keep-all forward of each of those blocks that holds no saved state, and the head.
  // A state where block k still needs its keep-all forward but x[k] is gone and block k-1
  // holds saved state (so cannot run forward before B(k-1), after B(k)) is dead: +inf.
  double lower_bound(const State& s) const {
    double t = s.head ? 0.0 : c_.head_time;
    for (int k = 0; k <= s.nb; ++k) {
      const ChainBlock& b = c_.blocks[static_cast<std::size_t>(k)];
      if (k > 0 && !bit(s.saved, k) && !bit(s.held, k) && bit(s.saved, k - 1)) {
        return std::numeric_limits<double>::infinity();
      }
      t += b.bwd_time + (bit(s.saved, k) ? 0.0 : std::min(b.fwd_time, b.for_backward_time()));
    }
    return t;
  }

  // An op on the found path: block, keep (3: a backward), and what happened to the output.
  static constexpr int kHead = 1 << 8, kDrop = 1 << 9;
  static int code(int block, int keep, int flags) { return block | keep << 4 | flags; }
  static std::string op_str(int c) {
    const int block = c & 0xf, keep = (c >> 4) & 0xf;
    if (keep == 3) return "B" + std::to_string(block);
    return "F" + std::to_string(block) + ":" + keep_name(static_cast<Keep>(keep)) +
           ((c & kHead) != 0 ? " head" : "") + ((c & kDrop) != 0 ? "(not stored)" : "");
  }

  template <typename Relax>
  void expand(const State& st, Relax&& relax) {
    // Backward of the next block.
    const std::int64_t now = mem(st);
    if (st.head && bit(st.saved, st.nb)) {
      const ChainBlock& b = c_.blocks[static_cast<std::size_t>(st.nb)];
      if (now + b.input_bytes + b.bwd_workspace <= limit_) {
        State to = st;
        to.fresh = 0;
        to.saved &= ~(1u << st.nb);
        to.held &= ~(3u << st.nb);
        to.nb = st.nb - 1;
        to.closed &= (1u << (st.nb + 1)) - 1;  // nothing above reads x any more
        relax(to, b.bwd_time, code(st.nb, 3, 0));
      }
    }
    for (int i = 0; i <= st.nb; ++i) {
      if (!bit(st.held, i) || bit(st.saved, i)) continue;
      // Persistent: no forward below a block that holds saved state (the DP finishes a
      // segment, its backwards included, before it recomputes anything to its left).
      if (persistent_ && (st.saved >> (i + 1)) != 0) continue;
      const ChainBlock& b = c_.blocks[static_cast<std::size_t>(i)];
      for (Keep keep : {Keep::kAll, Keep::kInput, Keep::kNothing}) {
        if (persistent_ && keep == Keep::kNothing && st.fresh != i) continue;
        const int op = code(i, static_cast<int>(keep), 0);
        const std::int64_t during =
            now + x(i + 1) + b.fwd_workspace + (keep == Keep::kAll ? b.saved_bytes : 0);
        if (during > limit_) continue;
        // A keep-all forward whose output is not stored runs for its backward only (the
        // executor's forward_for_backward).
        const double dropped = keep == Keep::kAll ? b.for_backward_time() : b.fwd_time;
        State to = st;
        to.fresh = 0;
        if (keep == Keep::kAll) to.saved |= 1u << i;
        if (keep != Keep::kInput) to.held &= ~(1u << i);
        if (i == n_ - 1 && !st.head) {  // x[n] first held: the head runs
          to.held |= 1u << n_;
          if (mem(to) + c_.head_bytes > limit_) continue;
          to.held &= ~(1u << n_);
          to.head = true;
          relax(to, b.fwd_time + c_.head_time, op | kHead);
        } else if (bit(st.held, i + 1) || i + 1 == n_) {
          relax(to, dropped, op);  // output already held, or x[n] after the head: dropped
        } else {
          if (!bit(st.closed, i + 1)) {
            State kept = to;
            kept.held |= 1u << (i + 1);
            kept.fresh = persistent_ ? i + 1 : 0;
            relax(kept, b.fwd_time, op);
          }
          to.closed |= 1u << (i + 1);
          relax(to, dropped, op | kDrop);
        }
      }
    }
  }

  const Chain& c_;
  int n_;
  std::int64_t limit_;
  bool persistent_;
  std::int64_t expanded_ = 0;
  std::unordered_map<std::uint64_t, std::pair<std::uint64_t, int>> parent_;
  std::string path_;
};

// The limits a case is tried at: below, at and between the fixed rules' peaks.
std::vector<std::int64_t> limits_for(const Chain& c, std::mt19937& rng) {
  const int n = static_cast<int>(c.blocks.size());
  const std::int64_t none = simulate(c, Schedule::none(n)).peak_bytes;
  const std::int64_t all = simulate(c, Schedule::all(n)).peak_bytes;
  std::vector<std::int64_t> out = {none, all, all - 1, none + 3};
  std::uniform_int_distribution<std::int64_t> u(std::max<std::int64_t>(1, all - 6), none);
  for (int j = 0; j < 3; ++j) out.push_back(u(rng));
  return out;
}

// The DP against the persistent search: equal on every case. Against the unrestricted search
// (every valid op sequence): never better (the search is exact), equal on almost every case;
// the exceptions drop a checkpoint after its last use and let a later keep-all forward of the
// block before regenerate it, or recompute a block while one above it holds saved state (see
// checkpoint_dp.cpp), and are counted and printed. Half the blocks recompute for their backward
// faster than their forward (fwd_for_backward_time), which the DP and simulate() price alike.
TEST(CheckpointSolver, OptimalMatchesExhaustiveSearch) {
  std::mt19937 rng(20240611);
  int cases = 0, feasible = 0, infeasible = 0, recompute = 0, full = 0, full_gap = 0;
  double worst_gap = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 10;
    const Chain c = random_chain(n, rng);
    const double none_time = simulate(c, Schedule::none(n)).compute_time;
    for (std::int64_t limit : limits_for(c, rng)) {
      ++cases;
      const std::string what =
          "n=" + std::to_string(n) + " limit=" + std::to_string(limit) + " chain " + chain_str(c);
      Exhaustive persistent(c, limit, /*persistent=*/true);
      const std::optional<double> best = persistent.min_time();
      const std::optional<DpSolution> dp = optimal_checkpoint_dp(c, limit, 500);
      ASSERT_EQ(best.has_value(), dp.has_value()) << what;
      if (trial % 3 == 0) {  // the unrestricted search is slower; a third of the chains
        ++full;
        Exhaustive any(c, limit, /*persistent=*/false);
        const std::optional<double> lower = any.min_time();
        ASSERT_EQ(lower.has_value(), best.has_value()) << what;
        if (lower) {
          EXPECT_LE(*lower, *best) << what;
          if (*lower < *best) {
            ++full_gap;
            worst_gap = std::max(worst_gap, (*best - *lower) / *lower);
            std::printf("non-persistent schedule %g < %g: %s\n  %s\n", *lower, *best, what.c_str(),
                        any.path().c_str());
          }
        }
      }
      if (!best) {
        ++infeasible;
        const SolverResult r = solve_checkpoint(c, limit);
        EXPECT_FALSE(r.feasible) << what;
        EXPECT_EQ(r.schedule.ops(), Schedule::all(n).ops());
        continue;
      }
      ++feasible;
      recompute += *best > none_time;
      ASSERT_EQ(dp->unit, 1);
      EXPECT_EQ(dp->budget_units, limit);
      EXPECT_EQ(dp->compute_time, *best)
          << what << "\ndp:     " << dp->schedule.str() << "\nsearch: " << persistent.path();
      EXPECT_NO_THROW(dp->schedule.validate(n));
      const SimulateResult sim = simulate(c, dp->schedule);
      EXPECT_LE(sim.peak_bytes, limit) << what << " " << dp->schedule.str();
      EXPECT_EQ(sim.compute_time, *best) << what << " " << dp->schedule.str();
      const SolverResult r = solve_checkpoint(c, limit, "optimal");
      EXPECT_TRUE(r.feasible);
      EXPECT_EQ(r.compute_time, *best) << what;
      EXPECT_LE(r.peak_bytes, limit);
    }
  }
  // The cases must exercise all three outcomes, or the comparison proves little.
  EXPECT_GT(infeasible, cases / 20);
  EXPECT_GT(recompute, cases / 5);
  EXPECT_GT(feasible, cases / 2);
  EXPECT_LE(full_gap * 50, full) << "non-persistent schedules should be the rare exception";
  std::printf(
      "exhaustive comparison: %d cases, %d feasible (%d needing recomputation), %d "
      "infeasible; against every valid schedule: %d cases, %d better than the DP "
      "(worst by %.1f%%)\n",
      cases, feasible, recompute, infeasible, full, full_gap, 100 * worst_gap);
}

// The boundary of the DP's class, pinned: a schedule the unrestricted search found, which
// holds x[1] as a checkpoint through the top of the chain, then consumes it keeping nothing
// and lets R0:all regenerate it. It fits 22 bytes in 61 time units; the best persistent
// schedule needs 62.
TEST(CheckpointSolver, NonPersistentScheduleBeyondTheDp) {
  Chain c;
  const auto block = [&](int x, int saved, bool si, int wf, int wb, double tf, double tb) {
    c.blocks.push_back({x, saved, si, wf, wb, tf, tb});
  };
  block(3, 2, true, 1, 3, 3, 8);
  block(3, 4, false, 2, 2, 2, 8);
  block(4, 4, false, 1, 3, 5, 3);
  block(3, 5, false, 0, 2, 1, 3);
  block(3, 3, true, 0, 3, 4, 6);
  block(3, 3, false, 0, 2, 3, 2);
  c.output_bytes = 2;
  c.head_bytes = 5;
  const Schedule s = Schedule::parse(
      "F0:input F1:input F2:nothing F3:nothing F4:all F5:all B5 B4 R1:nothing R2:all R3:all B3 "
      "B2 R0:all R1:all B1 B0",
      6);
  const SimulateResult sim = simulate(c, s);
  EXPECT_LE(sim.peak_bytes, 22);
  const std::optional<DpSolution> dp = optimal_checkpoint_dp(c, 22, 500);
  ASSERT_TRUE(dp.has_value());
  EXPECT_EQ(dp->compute_time, *Exhaustive(c, 22, true).min_time());
  EXPECT_EQ(*Exhaustive(c, 22, false).min_time(), sim.compute_time);
  EXPECT_EQ(sim.compute_time + 1, dp->compute_time) << dp->schedule.str();
}

// simulate() term by term on two blocks, schedule none:
//   x0 = 10, block 0: saved 20 + its input, wf 3, wb 4; x1 = 6, block 1: saved 7, wf 1, wb 2;
//   x2 = 5, head 9.
//   F0:all   during: x0 10 + out 6 + wf 3 + saved 20 = 39; after: x0 (by block 0) + 20 + x1 6
//   F1:all   during: 36 + out 5 + wf 1 + saved 7 = 49; after: 10 + 20 + 7 + x2 5 = 42 (x1 gone)
//   head     42 + 9 = 51; then x2 -> its gradient (5): 42
//   B1       42 + dx 6 + wb 2 = 50; after 10 + 20 + 6 = 36
//   B0       36 + dx 10 + wb 4 = 50
TEST(CheckpointSolver, SimulateTermByTerm) {
  Chain c;
  c.blocks.push_back({10, 20, true, 3, 4, 1.0, 2.0});
  c.blocks.push_back({6, 7, false, 1, 2, 3.0, 5.0});
  c.output_bytes = 5;
  c.head_bytes = 9;
  c.head_time = 0.5;
  SimulateResult r = simulate(c, Schedule::none(2));
  EXPECT_EQ(r.peak_bytes, 51);
  EXPECT_EQ(r.compute_time, 1.0 + 3.0 + 0.5 + 5.0 + 2.0);
  c.head_bytes = 0;
  EXPECT_EQ(simulate(c, Schedule::none(2)).peak_bytes, 50);
  // all: F0:input F1:input R1:all B1 R0:all B0.
  //   F0:input during 10 + 6 + 3 = 19, after x0 + x1 = 16; F1:input during 16 + 5 + 1 = 22,
  //   after 16 + x2 5 = 21; the head (0) turns x2 into its gradient: 21. R1:all during 21 +
  //   out 5 + wf 1 + saved 7 = 34 (its output is dropped: nothing reads it), after x0 + 5 + 7
  //   = 22 (x1 gone: block 1 does not save it); B1 22 + 6 + 2 = 30, after x0 + gradient 6 =
  //   16; R0:all 16 + 6 + 3 + 20 = 45 (x1 not stored), after 10 + 20 + 6 = 36; B0 36 + 10 + 4.
  r = simulate(c, Schedule::all(2));
  EXPECT_EQ(r.peak_bytes, 50);
  EXPECT_EQ(r.compute_time, 2 * 1.0 + 2 * 3.0 + 0.5 + 5.0 + 2.0);
  // A block saving its input holds x[i] itself: counted once. With block 0 saving nothing
  // else and block 1 nothing at all: F0 19, F1 21, R1:all 26, B1 15 + 6 + 2 = 23, R0:all
  // 16 + 6 + 3 = 25, B0 x0 10 + gradient 6 + dx 10 + wb 4 = 30 (40 if x0 counted twice).
  c.blocks[0].saved_bytes = 0;
  c.blocks[1].saved_bytes = 0;
  c.blocks[1].fwd_workspace = 0;
  EXPECT_EQ(simulate(c, Schedule::all(2)).peak_bytes, 30);
  EXPECT_THROW(simulate(c, Schedule::none(3)), InvalidArgument);  // not a schedule for 2 blocks
  // A recomputation whose output is not stored runs for its backward: R1:all and R0:all above
  // take fwd_for_backward_time; the first pass and the head do not.
  c.blocks[0].fwd_for_backward_time = 0.25;
  c.blocks[1].fwd_for_backward_time = 2.0;
  EXPECT_EQ(simulate(c, Schedule::all(2)).compute_time, 1.0 + 3.0 + 0.5 + 2.0 + 5.0 + 0.25 + 2.0);
  EXPECT_EQ(simulate(c, Schedule::none(2)).compute_time, 1.0 + 3.0 + 0.5 + 5.0 + 2.0);
  // A keep-all forward whose output a later forward reads stores it and takes fwd_time: R0:all
  // here (R1:all reads x[1]); R1:all's output is read by nothing (the head ran).
  const Schedule s = Schedule::parse("F0:input F1:nothing R0:all R1:all B1 B0", 2);
  EXPECT_EQ(simulate(c, s).compute_time, 1.0 + 3.0 + 0.5 + 1.0 + 2.0 + 5.0 + 2.0);
  c.blocks[0].fwd_for_backward_time = std::nan("");
  EXPECT_THROW(simulate(c, Schedule::all(2)), InvalidArgument);
}

TEST(CheckpointSolver, ScheduleOpListRoundTrip) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 1 + trial % 12;
    const Chain c = random_chain(n, rng);
    const std::int64_t limit = limits_for(c, rng)[6];
    for (std::string_view solver : {"optimal", "none", "all", "sqrt", "every:3"}) {
      const SolverResult r = solve_checkpoint(c, limit, solver);
      const Schedule back = Schedule::parse(r.schedule.str(), n);
      EXPECT_EQ(back.ops(), r.schedule.ops()) << r.schedule.str();
      EXPECT_EQ(back.name(), "ops");
      EXPECT_EQ(solve_checkpoint(c, limit, r.schedule.str()).compute_time, r.compute_time);
    }
  }
  const auto expect_error = [](std::string_view spec, int n, const char* needle) {
    try {
      Schedule::parse(spec, n);
      ADD_FAILURE() << "accepted: " << spec;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("F0:all B1", 2, "op 1 (B1)");  // validated for n
  expect_error("F0:all F1:all B1 B0", 1, "out of range");
  expect_error("F0:all F1:some B1 B0", 2, "token 1 'F1:some'");
  expect_error("F0:all  X1 B0", 2, "'X1' is not an op");
  expect_error("B0x", 1, "'B0x'");
  expect_error("F0", 1, "'F0'");
  expect_error("bogus", 1, "or an op list");
  // Extra spaces are separators; R marks recomputation.
  EXPECT_EQ(Schedule::parse(" F0:input  R0:all B0 ", 1).ops(),
            (std::vector<Op>{Op::forward(0, Keep::kInput), Op::forward(0, Keep::kAll, true),
                             Op::backward(0)}));
}

// Chains whose sizes are not multiples of the unit, with few slots: the DP rounds up, and
// the solver still answers with something at least as good as every fixed rule that fits.
TEST(CheckpointSolver, OptimalNeverWorseThanFixedRules) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::int64_t> bytes(1000, 90000);
  std::uniform_real_distribution<double> time(0.5, 4.0);
  for (int trial = 0; trial < 80; ++trial) {
    const int n = 1 + trial % 30;
    Chain c;
    for (int i = 0; i < n; ++i) {
      c.blocks.push_back({bytes(rng), 3 * bytes(rng), trial % 2 == 0, bytes(rng) / 4,
                          bytes(rng) / 2, time(rng), 2 * time(rng)});
    }
    c.output_bytes = bytes(rng);
    c.head_bytes = bytes(rng);
    c.head_time = time(rng);
    const std::int64_t none = simulate(c, Schedule::none(n)).peak_bytes;
    const std::int64_t all = simulate(c, Schedule::all(n)).peak_bytes;
    double previous = std::numeric_limits<double>::infinity();
    for (int j = 0; j <= 6; ++j) {
      const std::int64_t limit = all + (none - all) * j / 6;
      const int slots = trial % 3 == 0 ? 20 : 500;
      const SolverResult o = solve_checkpoint(c, limit, "optimal", slots);
      ASSERT_TRUE(o.feasible) << "all fits by construction";
      EXPECT_LE(o.peak_bytes, limit);
      EXPECT_EQ(simulate(c, o.schedule).peak_bytes, o.peak_bytes);
      for (const char* fixed : {"none", "all", "sqrt", "every:2"}) {
        const SolverResult f = solve_checkpoint(c, limit, fixed, slots);
        if (f.feasible && std::string(fixed) != "every:2") {
          EXPECT_LE(o.compute_time, f.compute_time) << fixed << " n=" << n << " limit=" << limit;
        }
        EXPECT_EQ(f.feasible, f.peak_bytes <= limit);
      }
      // More memory never costs time (up to the DP's rounding, which the fixed rules cover
      // at the ends).
      if (slots == 500) EXPECT_LE(o.compute_time, previous * (1 + 1e-12) + 1e-9) << limit;
      if (slots == 500) previous = std::min(previous, o.compute_time);
    }
  }
}

// The DP relaxes each way of solving a sub-problem only where it can still lower the table
// (planning time: the planner solves hundreds of these). The answer must be the full pass's,
// bit for bit, schedule included: on chains of up to 48 blocks at 500 slots with sizes that
// are not multiples of the unit, blocks of zero forward time (ties between keeping all and
// recomputing), and limits from infeasible to unlimited.
TEST(CheckpointSolver, PrunedDpIsTheFullPassBitForBit) {
  std::mt19937 rng(18);
  std::uniform_int_distribution<std::int64_t> bytes(1000, 90000);
  std::uniform_int_distribution<int> pick(0, 4);
  int feasible = 0, infeasible = 0, recomputing = 0;
  for (int trial = 0; trial < 48; ++trial) {
    const int n = trial % 8 == 0 ? 48 : 1 + trial % 16;
    Chain c;
    for (int i = 0; i < n; ++i) {
      const double tf = pick(rng) == 0 ? 0.0 : 0.25 * pick(rng) + 0.1;
      c.blocks.push_back({bytes(rng), 3 * bytes(rng), pick(rng) != 0, bytes(rng) / 4,
                          bytes(rng) / 2, tf, 2 * tf + 0.5});
    }
    c.output_bytes = bytes(rng);
    c.head_bytes = bytes(rng);
    c.head_time = 0.1 * pick(rng);
    const std::int64_t none = simulate(c, Schedule::none(n)).peak_bytes;
    const std::int64_t all = simulate(c, Schedule::all(n)).peak_bytes;
    const double none_time = simulate(c, Schedule::none(n)).compute_time;
    for (int j = 0; j <= 8; ++j) {
      const std::int64_t limit = all / 2 + (none + none / 8 - all / 2) * j / 8;
      const int slots = j % 3 == 0 ? 500 : 37 + 50 * j;
      SCOPED_TRACE("n=" + std::to_string(n) + " limit=" + std::to_string(limit) +
                   " slots=" + std::to_string(slots));
      const std::optional<DpSolution> fast = optimal_checkpoint_dp(c, limit, slots);
      const std::optional<DpSolution> full = optimal_checkpoint_dp(c, limit, slots, false);
      ASSERT_EQ(fast.has_value(), full.has_value());
      if (!full) {
        ++infeasible;
        continue;
      }
      ++feasible;
      recomputing += full->compute_time > none_time;
      EXPECT_EQ(fast->schedule.ops(), full->schedule.ops()) << fast->schedule.str() << "\n"
                                                            << full->schedule.str();
      EXPECT_EQ(std::memcmp(&fast->compute_time, &full->compute_time, sizeof(double)), 0);
      EXPECT_EQ(fast->unit, full->unit);
      EXPECT_EQ(fast->budget_units, full->budget_units);
    }
  }
  EXPECT_GT(infeasible, 0);
  EXPECT_GT(recomputing, feasible / 4);
}

// One solve's tables answer every smaller limit as a solve in the same unit would: with sizes in
// whole units of u and a table solved for L = slots x u, at(k x u) is the DP at k x u with k
// slots (unit u again), bit for bit, and its schedule fits k x u.
TEST(CheckpointSolver, TablesAnswerSmallerLimitsAsAFreshSolveInTheirUnit) {
  std::mt19937 rng(77);
  int feasible = 0, infeasible = 0, recomputing = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + trial % 12;
    const Chain c = random_chain(n, rng);
    const double none_time = simulate(c, Schedule::none(n)).compute_time;
    const std::int64_t none = simulate(c, Schedule::none(n)).peak_bytes;
    const std::int64_t top = none + 2;  // unit 1: every size is whole units
    const CheckpointDpTables tables(c, top, static_cast<int>(top));
    EXPECT_EQ(tables.limit(), top);
    for (std::int64_t k = 1; k <= top; ++k) {
      SCOPED_TRACE("n=" + std::to_string(n) + " limit=" + std::to_string(k) + " chain " +
                   chain_str(c));
      const std::optional<DpSolution> from_tables = tables.at(k);
      const std::optional<DpSolution> fresh = optimal_checkpoint_dp(c, k, static_cast<int>(k));
      ASSERT_EQ(from_tables.has_value(), fresh.has_value());
      if (!fresh) {
        ++infeasible;
        continue;
      }
      ++feasible;
      recomputing += fresh->compute_time > none_time;
      EXPECT_EQ(from_tables->unit, 1);
      EXPECT_EQ(from_tables->budget_units, k);
      EXPECT_EQ(std::memcmp(&from_tables->compute_time, &fresh->compute_time, sizeof(double)), 0);
      EXPECT_EQ(from_tables->schedule.ops(), fresh->schedule.ops());
      const SimulateResult sim = simulate(c, from_tables->schedule);
      EXPECT_LE(sim.peak_bytes, k);
      EXPECT_EQ(sim.compute_time, from_tables->compute_time);
    }
  }
  EXPECT_GT(infeasible, 0);
  EXPECT_GT(recomputing, feasible / 5);
}

// Sizes that are not whole units: at(l) is the DP at l's budget in the first unit u, the one
// solve that has that unit and budget (optimal_checkpoint_dp(c, m x u, m)), bit for bit.
TEST(CheckpointSolver, TablesKeepTheirUnitAtSmallerLimits) {
  std::mt19937 rng(909);
  std::uniform_int_distribution<std::int64_t> bytes(1000, 90000);
  std::uniform_int_distribution<int> pick(0, 4);
  int compared = 0;
  for (int trial = 0; trial < 10; ++trial) {
    const int n = trial % 5 == 0 ? 24 : 3 + trial;
    Chain c;
    for (int i = 0; i < n; ++i) {
      const double tf = 0.25 * pick(rng) + 0.1;
      ChainBlock b{bytes(rng), 3 * bytes(rng), pick(rng) != 0, bytes(rng) / 4,
                   bytes(rng) / 2, tf, 2 * tf + 0.5};
      if (pick(rng) < 2) b.fwd_for_backward_time = tf / 2;
      c.blocks.push_back(b);
    }
    c.output_bytes = bytes(rng);
    c.head_bytes = bytes(rng);
    c.head_time = 0.1;
    const std::int64_t none = simulate(c, Schedule::none(n)).peak_bytes;
    const CheckpointDpTables tables(c, none, 500);
    for (int j = 0; j < 12; ++j) {
      const std::int64_t limit = none - none * j / 20;
      SCOPED_TRACE("n=" + std::to_string(n) + " limit=" + std::to_string(limit));
      const std::optional<DpSolution> a = tables.at(limit);
      if (!a) continue;
      ++compared;
      const std::optional<DpSolution> b =
          optimal_checkpoint_dp(c, a->budget_units * a->unit, a->budget_units);
      ASSERT_TRUE(b.has_value());
      EXPECT_EQ(a->unit, b->unit);
      EXPECT_EQ(a->budget_units, b->budget_units);
      EXPECT_EQ(std::memcmp(&a->compute_time, &b->compute_time, sizeof(double)), 0);
      EXPECT_EQ(a->schedule.ops(), b->schedule.ops());
      EXPECT_LE(simulate(c, a->schedule).peak_bytes, limit);
    }
  }
  EXPECT_GT(compared, 60);
}

TEST(CheckpointSolver, TablesRefuseALargerLimit) {
  std::mt19937 rng(5);
  const Chain c = random_chain(4, rng);
  const CheckpointDpTables tables(c, 40, 40);
  EXPECT_THROW((void)tables.at(41), InvalidArgument);
  EXPECT_FALSE(tables.at(0).has_value());
  const CheckpointDpTables nothing(c, 0, 40);  // no limit at all: nothing fits, nothing solved
  EXPECT_FALSE(nothing.at(0).has_value());
}

// OptimalSolver at a falling limit: each answer fits its limit and is feasible exactly where
// solve_checkpoint's is (the first unit's rounding never hides a schedule: it solves again);
// at the first limit, below 3/4 of it and after a rise (each a fresh solve) it is
// solve_checkpoint's exactly.
TEST(CheckpointSolver, OptimalSolverAtFallingLimits) {
  std::mt19937 rng(2026);
  std::uniform_int_distribution<std::int64_t> bytes(1000, 90000);
  std::uniform_int_distribution<int> pick(0, 4);
  for (int trial = 0; trial < 12; ++trial) {
    const int n = trial % 4 == 0 ? 48 : 2 + trial;
    Chain c;
    for (int i = 0; i < n; ++i) {
      const double tf = 0.25 * pick(rng) + 0.1;
      c.blocks.push_back({bytes(rng), 3 * bytes(rng), pick(rng) != 0, bytes(rng) / 4,
                          bytes(rng) / 2, tf, 2 * tf + 0.5});
    }
    c.output_bytes = bytes(rng);
    c.head_bytes = bytes(rng);
    c.head_time = 0.1;
    const std::int64_t none = simulate(c, Schedule::none(n)).peak_bytes;
    OptimalSolver solver(c);
    std::int64_t limit = none;
    const auto same = [](const SolverResult& a, const SolverResult& b) {
      EXPECT_EQ(a.feasible, b.feasible);
      EXPECT_EQ(a.schedule.ops(), b.schedule.ops());
      EXPECT_EQ(a.compute_time, b.compute_time);
      EXPECT_EQ(a.peak_bytes, b.peak_bytes);
    };
    same(solver.solve(limit), solve_checkpoint(c, limit, "optimal"));
    std::int64_t solved = limit;
    for (int step = 0; step < 8; ++step) {
      limit -= limit / 9;
      SCOPED_TRACE("n=" + std::to_string(n) + " limit=" + std::to_string(limit));
      const SolverResult r = solver.solve(limit);
      const SolverResult fresh = solve_checkpoint(c, limit, "optimal");
      EXPECT_EQ(r.feasible, fresh.feasible);
      if (limit < solved / 4 * 3) {  // solved again
        same(r, fresh);
        solved = limit;
      }
      if (r.feasible) EXPECT_LE(r.peak_bytes, limit);
      if (!r.feasible) solved = limit;  // nothing in the first unit: solved again
    }
    same(solver.solve(none), solve_checkpoint(c, none, "optimal"));  // a rise: solved again
  }
  EXPECT_THROW(OptimalSolver(Chain{}), InvalidArgument);
}

TEST(CheckpointSolver, UnlimitedIsNone) {
  std::mt19937 rng(3);
  for (int n : {1, 2, 7, 40, 96}) {
    Chain c = random_chain(n, rng);
    for (ChainBlock& b : c.blocks) b.input_bytes *= 1 << 20;  // sizes far from the unit
    const SolverResult o = solve_checkpoint(c, std::numeric_limits<std::int64_t>::max());
    const SolverResult none = solve_checkpoint(c, std::numeric_limits<std::int64_t>::max(), "none");
    EXPECT_TRUE(o.feasible);
    EXPECT_EQ(o.compute_time, none.compute_time) << n;
    EXPECT_EQ(o.schedule.recomputed_forwards(), 0) << o.schedule.str();
  }
}

TEST(CheckpointSolver, FeasibilityAndWhy) {
  std::mt19937 rng(9);
  const Chain c = random_chain(8, rng);
  const std::int64_t none = simulate(c, Schedule::none(8)).peak_bytes;
  const SolverResult fits = solve_checkpoint(c, none, "none");
  EXPECT_TRUE(fits.feasible);
  EXPECT_NE(fits.why.find("none: peak"), std::string::npos) << fits.why;
  EXPECT_NE(fits.why.find("fits"), std::string::npos) << fits.why;
  const SolverResult over = solve_checkpoint(c, none - 1, "none");
  EXPECT_FALSE(over.feasible);
  EXPECT_EQ(over.schedule.ops(), Schedule::none(8).ops());  // a fixed rule answers as asked
  EXPECT_NE(over.why.find("exceeds"), std::string::npos) << over.why;
  // Nothing fits below the embedding output x[0] itself.
  for (std::int64_t limit : {std::int64_t{0}, std::int64_t{-5}, c.blocks[0].input_bytes - 1}) {
    const SolverResult r = solve_checkpoint(c, limit);
    EXPECT_FALSE(r.feasible);
    EXPECT_EQ(r.schedule.ops(), Schedule::all(8).ops());
    EXPECT_EQ(r.peak_bytes, simulate(c, Schedule::all(8)).peak_bytes);
    EXPECT_NE(r.why.find("no schedule fits"), std::string::npos) << r.why;
  }
  const SolverResult opt = solve_checkpoint(c, none);
  EXPECT_NE(opt.why.find("optimal"), std::string::npos) << opt.why;
  EXPECT_EQ(opt.schedule.name(), opt.why.find("dynamic program") != std::string::npos
                                     ? std::string("optimal")
                                     : opt.schedule.name());
}

TEST(CheckpointSolver, Errors) {
  std::mt19937 rng(1);
  const Chain c = random_chain(4, rng);
  for (const char* bad : {"rotor", "", "every:0", "Optimal", "sqrt(n)"}) {
    try {
      solve_checkpoint(c, 100, bad);
      ADD_FAILURE() << bad;
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + std::string(bad) + "'"), std::string::npos) << msg;
      for (const char* name : {"none", "all", "sqrt", "every:K", "optimal", "op list"}) {
        EXPECT_NE(msg.find(name), std::string::npos) << name << ": " << msg;
      }
    }
  }
  for (int slots : {0, -3}) {
    try {
      solve_checkpoint(c, 100, "optimal", slots);
      ADD_FAILURE() << slots;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("slots = " + std::to_string(slots)), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(checkpoint_solver_names(),
            (std::vector<std::string>{"none", "all", "sqrt", "optimal"}));
  for (const std::string& name : checkpoint_solver_names()) {
    EXPECT_NO_THROW(solve_checkpoint(c, 100, name)) << name;
  }
  Chain bad = c;
  bad.blocks[2].saved_bytes = -1;
  EXPECT_THROW(solve_checkpoint(bad, 100), InvalidArgument);
  EXPECT_THROW(simulate(bad, Schedule::none(4)), InvalidArgument);
  bad = c;
  bad.blocks[1].fwd_time = std::nan("");
  EXPECT_THROW(solve_checkpoint(bad, 100), InvalidArgument);
  EXPECT_THROW(solve_checkpoint(Chain{}, 100), InvalidArgument);
  // A table beyond 1 GiB is refused with the figure, not allocated.
  Chain big;
  big.blocks.resize(3000, c.blocks[0]);
  try {
    solve_checkpoint(big, std::int64_t{1} << 40, "optimal", 500);
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("3000 blocks at 500 slots"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace memfit
