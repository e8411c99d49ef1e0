// The optimal checkpoint schedule of a chain by dynamic programming, after Rotor (Beaumont,
// Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for heterogeneous chains: how
// to train deep neural networks with limited memory", 2019): a segment's best schedule either
// runs its first block keeping all, or keeps the block's input as a checkpoint, runs forward
// keeping nothing up to a split point whose input it stores, solves the right part, then the
// left part again from the checkpoint. The memory terms are this executor's (core/schedule.h,
// checkpoint_solver.cpp's simulate()): the transient of every op is in its threshold.
//
// Sub-problems, with a[k] the size of x[k] (a[n]: the head's input), K[s] what block s keeps
// after a keep-all forward (its saved bytes, plus a[s] when it saves its input), all in units:
//   P(s, t, m), 0 <= s < t <= n: x[s] held, the gradient at x[t] held (the head has run),
//     nothing between; run forwards and backwards until the gradient at x[s] is held and
//     nothing else of [s, t] is. m bounds the segment's own bytes: x[s], the gradient, and
//     everything the segment creates. The least time, or +inf.
//   H(s, m), 0 <= s < n: x[s] held, the head has not run: the same, through the head.
// Recurrences (G = a[t], the gradient held while the segment runs forward; 0 for H):
//   keep all first: F(s, all) [peak a[s] + G + a[s+1] + wf[s] + S[s]], then the rest with
//     K[s] bytes less (P(s+1, t, m - K[s]), or the head when s + 1 == n), then B(s)
//     [peak K[s] + a[s+1] + a[s] + wb[s]]. In P with s + 1 == t nothing reads x[t] again, so
//     F(s, all) runs for its backward only and takes fwd_for_backward_time (the executor's
//     forwards_for_backward()); every other forward takes fwd_time.
//   split at s < s' < t: F(s, input), F(s+1..s'-1, nothing) [peaks a[s] + G + a[k] + a[k+1] +
//     wf[k]], P(s', t, m - a[s]) with x[s] held beside it, then P(s, s', m); for H, s' may be
//     n: the chain reaches x[n], the head runs [peak a[s] + a[n] + head], then P(s, n, m).
// Time O(n^3 * slots) (n^3/6 split triples, each a pass over the budget), memory
// O(n^2 * slots): 96 blocks at 500 slots is ~4600 segments of 501 entries.
//
// The class it is optimal over: persistent schedules, where a forward keeping nothing only
// consumes the input the previous forward just stored (a checkpoint, once held past other
// ops, stays until its block's keep-all forward or backward), and no block runs forward while
// a block above it holds saved state (a segment finishes, its backwards included, before
// anything to its left is recomputed). The test proves equality with an exhaustive search over
// that class on every random case. Over ALL valid schedules the executor can do better,
// rarely (1 of the test's 469 unrestricted searches, by 5%; one pinned example, 61 vs 62 time
// units), two ways: hold x[s] through the top of the chain, then consume it keeping nothing and
// let a later keep-all forward of block s-1 regenerate it; or recompute a block on the left
// while a block on the right still holds saved state (before that block's backward, while the
// gradient in flight is the smaller one). Covering these needs sub-problems with a third index
// (where the segment hands back), which is O(n^4 * slots): too slow for 96 blocks in 200 ms.
#include "policies/checkpoint_dp.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"

namespace memfit {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::size_t kMaxTableBytes = std::size_t{1} << 30;
constexpr std::size_t kKeptTableBytes = std::size_t{64} << 20;

// Table storage, reused: a Dp takes a vector from its thread's pool (or a new one) and gives it
// back when destroyed, up to kKeptTableBytes in all per thread. The planner solves hundreds of
// tables of a few MiB, and fresh ones cost a page fault per 4 KiB. (So no Dp may outlive its
// thread's pool: none in static or thread_local storage.)
std::vector<std::vector<double>>& table_pool() {
  thread_local std::vector<std::vector<double>> pool;
  return pool;
}
std::vector<double> take_table() {
  std::vector<std::vector<double>>& pool = table_pool();
  if (pool.empty()) return {};
  std::vector<double> t = std::move(pool.back());
  pool.pop_back();
  return t;
}
void give_back_table(std::vector<double>&& t) noexcept {
  std::vector<std::vector<double>>& pool = table_pool();
  std::size_t kept = t.capacity();
  for (const std::vector<double>& p : pool) kept += p.capacity();
  if (kept * sizeof(double) > kKeptTableBytes) return;
  try {
    pool.push_back(std::move(t));
  } catch (...) {  // no room to keep it: it is freed instead
  }
}

// best[i] = min(best[i], cost + in[i] + left[i]) for i < count, in and left optional: the
// solver's whole cost. Compiled for AVX-512 and AVX2 besides the baseline and chosen at load
// time (the same additions and minimum in the same order, so the same bits on every path);
// omp simd because -O2 does not vectorize these loops on its own. Not under ThreadSanitizer:
// the clones' resolver (an IFUNC) runs while the dynamic loader relocates the library, before
// TSan's runtime is up, and its instrumented entry crashes every test binary at load.
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void relax_span(double* best, const double* in, const double* left, double cost, int count) {
  if (in != nullptr && left != nullptr) {
#pragma omp simd
    for (int i = 0; i < count; ++i) best[i] = std::min(best[i], cost + in[i] + left[i]);
  } else if (in != nullptr) {
#pragma omp simd
    for (int i = 0; i < count; ++i) best[i] = std::min(best[i], cost + in[i]);
  } else if (left != nullptr) {
#pragma omp simd
    for (int i = 0; i < count; ++i) best[i] = std::min(best[i], cost + left[i]);
  } else {
#pragma omp simd
    for (int i = 0; i < count; ++i) best[i] = std::min(best[i], cost);
  }
}

class Dp {
 public:
  Dp(const Chain& chain, std::int64_t limit, int slots, bool prune);
  ~Dp() { give_back_table(std::move(tab_)); }
  Dp(const Dp&) = delete;
  Dp& operator=(const Dp&) = delete;

  // Fills the tables; returns H(0, budget).
  double solve();
  // After solve(), for any budget m <= budget(): H(0, m) and the schedule reaching it.
  double least_time(int m) const { return value(hrow(0), m); }
  Schedule schedule(int m) const;
  std::int64_t unit() const { return unit_; }
  int budget() const { return budget_; }

 private:
  // Rows of tab_: P(s, t) for 0 <= s < t <= n (triangular), then H(s) for 0 <= s < n.
  int row(int s, int t) const { return t * (t - 1) / 2 + s; }
  int hrow(int s) const { return n_ * (n_ + 1) / 2 + s; }
  int units(std::int64_t bytes) const {  // rounded up; anything over the budget is budget + 1
    const std::int64_t u = bytes / unit_ + (bytes % unit_ != 0);
    return static_cast<int>(std::min<std::int64_t>(u, budget_ + 1));
  }
  // One way to solve a sub-problem: cost + row inner at m - shift + row left at m, for m >= lo
  // (inner or left -1: an absent term), where `choice` is s (keep all first) or s' (split).
  struct Choice {
    int choice, lo;
    double cost;
    int inner, shift, left;
  };
  // Calls f(Choice) for every way to solve P(s, t) (head = false) or H(s) (head = true), in a
  // fixed order: solving takes the minimum over them per m (loops the compiler vectorizes),
  // reconstruction finds the first that gives that minimum at the one m it follows.
  template <typename F>
  void for_each_choice(int s, int t, bool head, F&& f) const;
  void relax(double* best, const Choice& c) const;
  const double* at(int r) const { return tab_.data() + static_cast<std::size_t>(r) * width_; }
  double* at(int r) { return tab_.data() + static_cast<std::size_t>(r) * width_; }
  // Row r at m: +inf below its first finite entry (where the row was not filled).
  double value(int r, int m) const {
    return m < first_[static_cast<std::size_t>(r)] ? kInf : at(r)[m];
  }
  int first_of(const Choice& c) const;  // the least m where c may be finite (budget + 1: none)
  void solve_row(int s, int t, bool head);
  // The choice giving table[m] for P(s, t) / H(s).
  int chosen(int s, int t, bool head, int m, Choice& out) const;
  void emit(int s, int t, bool head, int m, std::vector<ScheduleOp>& ops) const;
  void emit_chain(int s, int s2, std::vector<ScheduleOp>& ops) const;

  int n_;
  bool prune_;
  std::int64_t unit_;
  int budget_;
  std::size_t width_;                     // budget_ + 1
  std::vector<int> a_, s_, k_, wf_, wb_;  // units; a_ has n + 1 entries
  int head_ = 0;
  std::vector<double> tf_, tfb_, tb_, tf_prefix_;  // tf_prefix_[k] = sum of tf_[0..k-1]
  double th_ = 0;
  // P and H rows of budget + 1 entries, written only from where a row can be finite
  // (solve_row); the storage comes from the thread's pool and goes back to it (take_table()).
  std::vector<double> tab_ = take_table();
  std::vector<int> first_;   // each row's first finite entry (budget + 1: none)
  mutable bool head_emitted_ = false;
};

Dp::Dp(const Chain& chain, std::int64_t limit, int slots, bool prune)
    : n_(static_cast<int>(chain.blocks.size())), prune_(prune) {
  unit_ = limit / slots + (limit % slots != 0);
  budget_ = static_cast<int>(limit / unit_);
  width_ = static_cast<std::size_t>(budget_) + 1;
  const std::size_t segments =
      static_cast<std::size_t>(n_) * (static_cast<std::size_t>(n_) + 1) / 2;
  const std::size_t entries =
      checked_mul(segments + static_cast<std::size_t>(n_), width_, "optimal solver table");
  const std::size_t bytes = checked_mul(entries, sizeof(double), "optimal solver table");
  if (bytes > kMaxTableBytes) {
    throw InvalidArgument("checkpoint solver 'optimal': " + std::to_string(n_) + " blocks at " +
                          std::to_string(slots) + " slots need " + format_bytes(bytes) +
                          " of tables; valid: at most " + format_bytes(kMaxTableBytes) +
                          " (fewer slots, or the sqrt solver)");
  }
  const auto nn = static_cast<std::size_t>(n_);
  a_.resize(nn + 1);
  s_.resize(nn);
  k_.resize(nn);
  wf_.resize(nn);
  wb_.resize(nn);
  tf_.resize(nn);
  tfb_.resize(nn);
  tb_.resize(nn);
  tf_prefix_.assign(nn + 1, 0.0);
  for (std::size_t i = 0; i < nn; ++i) {
    const ChainBlock& b = chain.blocks[i];
    a_[i] = units(b.input_bytes);
    s_[i] = units(b.saved_bytes);
    // A saved input is x[i] itself (one tensor, counted once), so K[i] is a[i] + S[i].
    k_[i] = s_[i] + (b.saves_input ? a_[i] : 0);
    wf_[i] = units(b.fwd_workspace);
    wb_[i] = units(b.bwd_workspace);
    tf_[i] = b.fwd_time;
    tfb_[i] = b.for_backward_time();
    tb_[i] = b.bwd_time;
    tf_prefix_[i + 1] = tf_prefix_[i] + b.fwd_time;
  }
  a_[nn] = units(chain.output_bytes);
  head_ = units(chain.head_bytes);
  th_ = chain.head_time;
  tab_.resize(entries);
  first_.assign(segments + nn, budget_ + 1);
}

template <typename F>
void Dp::for_each_choice(int s, int t, bool head, F&& f) const {
  const auto us = static_cast<std::size_t>(s);
  const auto un = static_cast<std::size_t>(n_);
  const int g = head ? 0 : a_[static_cast<std::size_t>(t)];  // the gradient held meanwhile
  const int as = a_[us];
  const int a1 = a_[us + 1];
  // Keep all first: F(s, all), the rest with K[s] bytes fewer, B(s).
  const int fwd_all = as + g + a1 + wf_[us] + s_[us];
  const int bwd = k_[us] + a1 + as + wb_[us];
  const double t_all = tf_[us] + tb_[us];
  if (s + 1 == t) {
    if (head) {  // the head runs after F(n-1, all), beside block n-1's saved state
      f(Choice{s, std::max({fwd_all, bwd, k_[us] + a_[un] + head_}), t_all + th_, -1, 0, -1});
    } else {  // nothing reads x[t] again: the forward runs for its backward only
      f(Choice{s, std::max(fwd_all, bwd), tfb_[us] + tb_[us], -1, 0, -1});
    }
  } else {
    f(Choice{s, std::max(fwd_all, bwd), t_all, head ? hrow(s + 1) : row(s + 1, t), k_[us], -1});
  }
  // Split at s2: the chain's peak is its largest forward, beside x[s] and the gradient.
  int chain_peak = a1 + wf_[us];
  for (int s2 = s + 1; s2 < t || (head && s2 == t); ++s2) {
    if (s2 > s + 1) {
      const auto k = static_cast<std::size_t>(s2 - 1);
      chain_peak = std::max(chain_peak, a_[k] + a_[k + 1] + wf_[k]);
    }
    const double cost = tf_prefix_[static_cast<std::size_t>(s2)] - tf_prefix_[us];
    if (s2 < t) {
      f(Choice{s2, as + g + chain_peak, cost, head ? hrow(s2) : row(s2, t), as, row(s, s2)});
    } else {  // H only: the chain reaches x[n], the head runs beside x[s], then P(s, n)
      f(Choice{s2, as + std::max(chain_peak, a_[un] + head_), cost + th_, -1, 0, row(s, n_)});
    }
  }
}

int Dp::first_of(const Choice& c) const {
  // Both terms only fall as m grows: start where both are finite.
  int lo = std::max(c.lo, 0);
  if (c.inner >= 0) lo = std::max(lo, c.shift + first_[static_cast<std::size_t>(c.inner)]);
  if (c.left >= 0) lo = std::max(lo, first_[static_cast<std::size_t>(c.left)]);
  return std::min(lo, budget_ + 1);
}

void Dp::relax(double* best, const Choice& c) const {
  const int lo = first_of(c);
  if (lo > budget_) return;
  const double cost = c.cost;
  const double* in = c.inner >= 0 ? at(c.inner) : nullptr;
  const double* left = c.left >= 0 ? at(c.left) : nullptr;
  const int shift = c.shift;
  // Every row is non-increasing in m (a minimum of terms that are), so is this choice's value,
  // and so is `best` so far: where best[m] is already at most the choice's least value (at
  // m = budget, the same expression as relax_span's, so the same bits), the choice changes
  // nothing, and that is an upper part of the range. Relaxing only below it, [lo, hi), leaves
  // the table as the full pass would, bit for bit; it skips most of the splits, whose
  // recomputation makes them slower than keeping all where that fits. hi is found galloping up
  // from lo, then bisecting: the log of the range relaxed, which costs more anyway.
  int hi = budget_ + 1;
  if (prune_) {
    double least = cost;
    if (in != nullptr && left != nullptr) {
      least = cost + in[budget_ - shift] + left[budget_];
    } else if (in != nullptr) {
      least = cost + in[budget_ - shift];
    } else if (left != nullptr) {
      least = cost + left[budget_];
    }
    int below = lo - 1;  // best[below] > least, or below the range
    hi = lo;
    for (int step = 1; hi <= budget_ && best[hi] > least; step *= 2) {
      below = hi;
      hi = std::min(hi + step, budget_ + 1);
    }
    while (hi - below > 1) {  // best[below] > least; best[hi] <= least, or hi = budget + 1
      const int mid = below + (hi - below) / 2;
      if (best[mid] <= least) {
        hi = mid;
      } else {
        below = mid;
      }
    }
  }
  relax_span(best + lo, in != nullptr ? in + (lo - shift) : nullptr,
             left != nullptr ? left + lo : nullptr, cost, hi - lo);
}

double Dp::solve() {
  for (int len = 1; len <= n_; ++len) {
    for (int s = 0; s + len <= n_; ++s) solve_row(s, s + len, false);
  }
  for (int s = n_ - 1; s >= 0; --s) solve_row(s, n_, true);
  return value(hrow(0), budget_);
}

// One row: +inf from the least m any choice reaches (below it the row is never read: every
// reader starts at a row's first finite entry, or goes through value()), then every choice.
void Dp::solve_row(int s, int t, bool head) {
  const int r = head ? hrow(s) : row(s, t);
  int lo = budget_ + 1;
  for_each_choice(s, t, head, [&](const Choice& c) { lo = std::min(lo, first_of(c)); });
  double* best = at(r);
  if (lo <= budget_) std::fill(best + lo, best + budget_ + 1, kInf);
  for_each_choice(s, t, head, [&](const Choice& c) { relax(best, c); });
  int m = lo;
  while (m <= budget_ && best[m] == kInf) ++m;
  first_[static_cast<std::size_t>(r)] = m;
}

int Dp::chosen(int s, int t, bool head, int m, Choice& out) const {
  const double target = value(head ? hrow(s) : row(s, t), m);
  MEMFIT_CHECK(target < kInf) << "segment [" << s << ", " << t << ") at " << m << " units";
  int found = -1;
  for_each_choice(s, t, head, [&](const Choice& c) {
    if (found >= 0 || m < c.lo || (c.inner >= 0 && m < c.shift)) return;
    // The same expression as relax(), so the same bits.
    double v = c.cost;
    if (c.inner >= 0 && c.left >= 0) {
      v = c.cost + value(c.inner, m - c.shift) + value(c.left, m);
    } else if (c.inner >= 0) {
      v = c.cost + value(c.inner, m - c.shift);
    } else if (c.left >= 0) {
      v = c.cost + value(c.left, m);
    }
    if (v == target) {
      found = c.choice;
      out = c;
    }
  });
  MEMFIT_CHECK(found >= s) << "no choice reproduces segment [" << s << ", " << t << ")";
  return found;
}

void Dp::emit_chain(int s, int s2, std::vector<ScheduleOp>& ops) const {
  ops.push_back(ScheduleOp::forward(s, Keep::kInput, head_emitted_));
  for (int k = s + 1; k < s2 && k < n_; ++k) {
    ops.push_back(ScheduleOp::forward(k, Keep::kNothing, head_emitted_));
  }
}

// Forwards after the head are recomputations (Schedule's R).
void Dp::emit(int s, int t, bool head, int m, std::vector<ScheduleOp>& ops) const {
  Choice c{};
  const int how = chosen(s, t, head, m, c);
  const auto us = static_cast<std::size_t>(s);
  if (how == s) {
    ops.push_back(ScheduleOp::forward(s, Keep::kAll, head_emitted_));
    if (s + 1 < t) {
      emit(s + 1, t, head, m - k_[us], ops);
    } else if (head) {
      head_emitted_ = true;
    }
    ops.push_back(ScheduleOp::backward(s));
    return;
  }
  emit_chain(s, how, ops);
  if (how < t) {
    emit(how, t, head, m - a_[us], ops);
  } else {
    head_emitted_ = true;  // H's split at n: the chain ran the head
  }
  emit(s, how, false, m, ops);
}

Schedule Dp::schedule(int m) const {
  std::vector<ScheduleOp> ops;
  head_emitted_ = false;
  emit(0, n_, true, m, ops);
  return Schedule("optimal", std::move(ops));
}

}  // namespace

class CheckpointDpTables::Impl {
 public:
  Impl(const Chain& chain, std::int64_t limit, int slots, bool prune)
      : dp(chain, limit, slots, prune) {
    dp.solve();
  }
  Dp dp;
};

CheckpointDpTables::CheckpointDpTables(const Chain& chain, std::int64_t limit, int slots,
                                       bool prune)
    : limit_(limit) {
  MEMFIT_CHECK(!chain.blocks.empty() && slots >= 1);
  if (limit >= 1) impl_ = std::make_unique<Impl>(chain, limit, slots, prune);
}

CheckpointDpTables::~CheckpointDpTables() = default;

std::optional<DpSolution> CheckpointDpTables::at(std::int64_t limit) const {
  if (limit > limit_) {
    throw InvalidArgument("CheckpointDpTables::at(" + std::to_string(limit) +
                          "): the tables were solved for a limit of " + std::to_string(limit_) +
                          " bytes; valid: at most that (solve again for more)");
  }
  if (!impl_ || limit < 1) return std::nullopt;
  const Dp& dp = impl_->dp;
  const auto m = static_cast<int>(std::min<std::int64_t>(limit / dp.unit(), dp.budget()));
  const double t = dp.least_time(m);
  if (t == kInf) return std::nullopt;
  return DpSolution{dp.schedule(m), t, dp.unit(), m};
}

std::optional<DpSolution> optimal_checkpoint_dp(const Chain& chain, std::int64_t limit, int slots,
                                                bool prune) {
  return CheckpointDpTables(chain, limit, slots, prune).at(limit);
}

}  // namespace memfit
