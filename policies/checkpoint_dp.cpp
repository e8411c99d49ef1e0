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
//     [peak K[s] + a[s+1] + a[s] + wb[s]].
//   split at s < s' < t: F(s, input), F(s+1..s'-1, nothing) [peaks a[s] + G + a[k] + a[k+1] +
//     wf[k]], P(s', t, m - a[s]) with x[s] held beside it, then P(s, s', m); for H, s' may be
//     n: the chain reaches x[n], the head runs [peak a[s] + a[n] + head], then P(s, n, m).
// Time O(n^3 * slots) (n^3/6 split triples, each a pass over the budget), memory
// O(n^2 * slots): 96 blocks at 500 slots is ~4600 segments of 501 entries.
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
constexpr std::int16_t kNone = -1;
constexpr std::size_t kMaxTableBytes = std::size_t{1} << 30;

class Dp {
 public:
  Dp(const Chain& chain, std::int64_t limit, int slots);

  // Fills the tables; returns H(0, budget).
  double solve();
  Schedule schedule() const;
  std::int64_t unit() const { return unit_; }
  int budget() const { return budget_; }

 private:
  std::size_t row(int s, int t) const {  // segment [s, t) in the triangular table
    return (static_cast<std::size_t>(t) * (static_cast<std::size_t>(t) - 1) / 2 +
            static_cast<std::size_t>(s)) *
           width_;
  }
  int units(std::int64_t bytes) const {  // rounded up; anything over the budget is budget + 1
    const std::int64_t u = bytes / unit_ + (bytes % unit_ != 0);
    return static_cast<int>(std::min<std::int64_t>(u, budget_ + 1));
  }
  // best[m] = min(best[m], cost + inner[m - shift] + left[m]) for m in [lo, budget], recording
  // `choice` where it improves; inner or left may be null (absent term).
  void relax(double* best, std::int16_t* how, int lo, double cost, const double* inner, int shift,
             const double* left, std::int16_t choice) const;
  void solve_segment(int s, int t);
  void solve_head(int s);
  void emit_segment(int s, int t, int m, std::vector<ScheduleOp>& ops) const;
  void emit_head(int s, int m, std::vector<ScheduleOp>& ops) const;
  void emit_chain(int s, int s2, std::vector<ScheduleOp>& ops) const;

  int n_;
  std::int64_t unit_;
  int budget_;
  std::size_t width_;                        // budget_ + 1
  std::vector<int> a_, s_, k_, wf_, wb_;     // units; a_ has n + 1 entries
  int head_ = 0;
  std::vector<double> tf_, tb_, tf_prefix_;  // tf_prefix_[k] = sum of tf_[0..k-1]
  double th_ = 0;
  std::vector<double> p_, h_;                // P and H, budget-major rows
  std::vector<std::int16_t> pc_, hc_;        // how: kNone, s (keep all first) or s' (split)
  mutable bool head_emitted_ = false;
};

Dp::Dp(const Chain& chain, std::int64_t limit, int slots) : n_(static_cast<int>(chain.blocks.size())) {
  unit_ = limit / slots + (limit % slots != 0);
  budget_ = static_cast<int>(limit / unit_);
  width_ = static_cast<std::size_t>(budget_) + 1;
  const std::size_t segments = static_cast<std::size_t>(n_) * (static_cast<std::size_t>(n_) + 1) / 2;
  const std::size_t entries = checked_mul(segments + static_cast<std::size_t>(n_), width_,
                                          "optimal solver table");
  const std::size_t bytes = checked_mul(entries, sizeof(double) + sizeof(std::int16_t),
                                        "optimal solver table");
  if (bytes > kMaxTableBytes || n_ >= std::numeric_limits<std::int16_t>::max()) {
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
    tb_[i] = b.bwd_time;
    tf_prefix_[i + 1] = tf_prefix_[i] + b.fwd_time;
  }
  a_[nn] = units(chain.output_bytes);
  head_ = units(chain.head_bytes);
  th_ = chain.head_time;
  p_.assign(segments * width_, kInf);
  pc_.assign(segments * width_, kNone);
  h_.assign(nn * width_, kInf);
  hc_.assign(nn * width_, kNone);
}

void Dp::relax(double* best, std::int16_t* how, int lo, double cost, const double* inner,
               int shift, const double* left, std::int16_t choice) const {
  if (lo > budget_ || (inner != nullptr && shift > budget_)) return;
  lo = std::max(lo, 0);
  if (inner != nullptr) lo = std::max(lo, shift);
  // Both terms only fall as m grows: when either is +inf at the full budget, nothing fits.
  if (inner != nullptr && inner[budget_ - shift] == kInf) return;
  if (left != nullptr && left[budget_] == kInf) return;
  for (int m = lo; m <= budget_; ++m) {
    double v = cost;
    if (inner != nullptr) v += inner[m - shift];
    if (left != nullptr) v += left[m];
    if (v < best[m]) {
      best[m] = v;
      how[m] = choice;
    }
  }
}

void Dp::solve_segment(int s, int t) {
  const auto us = static_cast<std::size_t>(s);
  double* best = &p_[row(s, t)];
  std::int16_t* how = &pc_[row(s, t)];
  const int g = a_[static_cast<std::size_t>(t)];
  const int as = a_[us];
  const int a1 = a_[us + 1];
  // Keep all first.
  const int fwd_all = as + g + a1 + wf_[us] + s_[us];
  const int bwd = k_[us] + a1 + as + wb_[us];
  const double t_all = tf_[us] + tb_[us];
  if (s + 1 == t) {
    relax(best, how, std::max(fwd_all, bwd), t_all, nullptr, 0, nullptr, static_cast<std::int16_t>(s));
    return;
  }
  relax(best, how, std::max(fwd_all, bwd), t_all, &p_[row(s + 1, t)], k_[us], nullptr,
        static_cast<std::int16_t>(s));
  // Split at s2: the chain's peak is its largest forward, beside x[s] and the gradient.
  int chain_peak = a1 + wf_[us];
  for (int s2 = s + 1; s2 < t; ++s2) {
    if (s2 > s + 1) {
      const auto k = static_cast<std::size_t>(s2 - 1);
      chain_peak = std::max(chain_peak, a_[k] + a_[k + 1] + wf_[k]);
    }
    const double cost = tf_prefix_[static_cast<std::size_t>(s2)] - tf_prefix_[us];
    relax(best, how, as + g + chain_peak, cost, &p_[row(s2, t)], as, &p_[row(s, s2)],
          static_cast<std::int16_t>(s2));
  }
}

void Dp::solve_head(int s) {
  const auto us = static_cast<std::size_t>(s);
  const auto un = static_cast<std::size_t>(n_);
  double* best = &h_[us * width_];
  std::int16_t* how = &hc_[us * width_];
  const int as = a_[us];
  const int a1 = a_[us + 1];
  const int fwd_all = as + a1 + wf_[us] + s_[us];
  const int bwd = k_[us] + a1 + as + wb_[us];
  const double t_all = tf_[us] + tb_[us];
  if (s + 1 == n_) {
    const int head = k_[us] + a_[un] + head_;
    relax(best, how, std::max({fwd_all, bwd, head}), t_all + th_, nullptr, 0, nullptr,
          static_cast<std::int16_t>(s));
  } else {
    relax(best, how, std::max(fwd_all, bwd), t_all, &h_[(us + 1) * width_], k_[us], nullptr,
          static_cast<std::int16_t>(s));
  }
  int chain_peak = a1 + wf_[us];
  for (int s2 = s + 1; s2 <= n_; ++s2) {
    if (s2 > s + 1) {
      const auto k = static_cast<std::size_t>(s2 - 1);
      chain_peak = std::max(chain_peak, a_[k] + a_[k + 1] + wf_[k]);
    }
    const double cost = tf_prefix_[static_cast<std::size_t>(s2)] - tf_prefix_[us];
    if (s2 < n_) {
      relax(best, how, as + chain_peak, cost, &h_[static_cast<std::size_t>(s2) * width_], as,
            &p_[row(s, s2)], static_cast<std::int16_t>(s2));
    } else {
      relax(best, how, as + std::max(chain_peak, a_[un] + head_), cost + th_, nullptr, 0,
            &p_[row(s, n_)], static_cast<std::int16_t>(s2));
    }
  }
}

double Dp::solve() {
  for (int len = 1; len <= n_; ++len) {
    for (int s = 0; s + len <= n_; ++s) solve_segment(s, s + len);
  }
  for (int s = n_ - 1; s >= 0; --s) solve_head(s);
  return h_[static_cast<std::size_t>(budget_)];
}

void Dp::emit_chain(int s, int s2, std::vector<ScheduleOp>& ops) const {
  ops.push_back(ScheduleOp::forward(s, Keep::kInput, head_emitted_));
  for (int k = s + 1; k < s2; ++k) ops.push_back(ScheduleOp::forward(k, Keep::kNothing, head_emitted_));
}

void Dp::emit_segment(int s, int t, int m, std::vector<ScheduleOp>& ops) const {
  const std::size_t at = row(s, t) + static_cast<std::size_t>(m);
  const int how = pc_[at];
  MEMFIT_CHECK(how >= s && p_[at] < kInf);
  const auto us = static_cast<std::size_t>(s);
  if (how == s) {
    ops.push_back(ScheduleOp::forward(s, Keep::kAll, head_emitted_));
    if (s + 1 < t) emit_segment(s + 1, t, m - k_[us], ops);
    ops.push_back(ScheduleOp::backward(s));
    return;
  }
  emit_chain(s, how, ops);
  emit_segment(how, t, m - a_[us], ops);
  emit_segment(s, how, m, ops);
}

void Dp::emit_head(int s, int m, std::vector<ScheduleOp>& ops) const {
  const std::size_t at = static_cast<std::size_t>(s) * width_ + static_cast<std::size_t>(m);
  const int how = hc_[at];
  MEMFIT_CHECK(how >= s && h_[at] < kInf);
  const auto us = static_cast<std::size_t>(s);
  if (how == s) {
    ops.push_back(ScheduleOp::forward(s, Keep::kAll, head_emitted_));
    if (s + 1 < n_) {
      emit_head(s + 1, m - k_[us], ops);
    } else {
      head_emitted_ = true;
    }
    ops.push_back(ScheduleOp::backward(s));
    return;
  }
  emit_chain(s, how, ops);
  if (how < n_) {
    emit_head(how, m - a_[us], ops);
  } else {
    head_emitted_ = true;
  }
  emit_segment(s, how, m, ops);
}

Schedule Dp::schedule() const {
  std::vector<ScheduleOp> ops;
  head_emitted_ = false;
  emit_head(0, budget_, ops);
  return Schedule("optimal", std::move(ops));
}

}  // namespace

std::optional<DpSolution> optimal_checkpoint_dp(const Chain& chain, std::int64_t limit,
                                                int slots) {
  MEMFIT_CHECK(!chain.blocks.empty() && slots >= 1);
  if (limit < 1) return std::nullopt;
  Dp dp(chain, limit, slots);
  const double t = dp.solve();
  if (t == kInf) return std::nullopt;
  return DpSolution{dp.schedule(), t, dp.unit(), dp.budget()};
}

}  // namespace memfit
