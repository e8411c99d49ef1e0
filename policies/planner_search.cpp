// The planner's search of one combination (planner_search.h): the Searcher's dry-run probes,
// the plan it makes, and why a combination does not fit.
#include "policies/planner_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <typeinfo>
#include <vector>

#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"
#include "policies/checkpoint_solver.h"
#include "policies/collective_cost.h"
#include "policies/dry_run.h"

namespace memfit::planner_detail {

// "64.00 MiB", "1.00 GiB": the unit that reads best (small budgets were "0.06 GiB").
std::string gib(double bytes) {
  return format_bytes(static_cast<std::size_t>(std::max(0.0, bytes)));
}

int zero_stage(const PlannerOptions& o) { return o.ranks > 1 ? o.zero_stage : 0; }

std::string unsupported(const PlannerOptions& o, const OffloadSwitches& offload) {
  const int z = zero_stage(o);
  if (z == 0 || !(offload.gradients || offload.weights || offload.delayed_update)) return "";
  return "not offered with ZeRO-" + std::to_string(z) + " (offload " + offload.describe() +
         "): " + kNotOfferedWithZero + "; optimizer and activation offload are fine";
}

RunSpec request(const Context& c, const Combo& combo, std::int64_t micro, std::int64_t accum,
                std::int64_t last) {
  RunSpec q;
  q.model = c.o.spec;
  MemoryPolicy& p = q.trainer.policy;
  p.dtype = combo.dtype;
  p.checkpoint = combo.optimal() ? Checkpointing::solved(Schedule::all(c.n)) : combo.ck;
  p.offload = combo.offload;
  p.loss = c.o.loss;
  p.micro_batch = micro;
  // RunSpec::batch is the global batch: every rank steps on rank_batch() = batch / ranks.
  q.ranks = c.o.ranks;
  q.rank = 0;
  q.trainer.zero_stage = zero_stage(c.o);
  q.trainer.overlap_comm = c.o.overlap_comm;
  q.batch = ((accum - 1) * micro + (last > 0 ? last : micro)) * c.o.ranks;
  q.seq_len = c.seq_len;
  q.alloc = c.o.alloc_conf;
  q.alloc.budget = 0;
  // The CPU backend widens f16/bf16 GEMM operands in budgeted scratch; a GPU's tensor cores
  // need none, but cuBLASLt takes a fixed workspace per GEMM from the same allocator.
  q.device = c.o.device.kind;
  q.gpu_gemm_workspace = c.o.gemm_workspace_bytes;
  // Activation offload's room grows with the micro-batch: the dry run holds it to the budget.
  q.trainer.host_budget = c.o.host_budget;
  // This CPU's measured rates price each dry run's ops: the plan's step time (make_plan).
  if (c.o.cpu_rates) q.op_rates = c.o.cpu_rates->op_rates();
  return q;
}

namespace {

// ceil(a / b) for a >= 0, b > 0, without the overflow of (a + b - 1) / b near INT64_MAX.
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// The optimal solver's search for the largest micro-batch stops within lo / per of a failing
// one: 1% in max-batch mode, where that micro-batch is the answer; 1/16 in throughput mode,
// where it only bounds the candidates (ceil(per_rank / k) for a few k, which a larger micro-batch
// with as many micro-batches seldom beats, and powers of two).
constexpr int kOptimalTolerance = 100;
constexpr int kOptimalThroughputTolerance = 16;

class Searcher {
 public:
  Searcher(const Context& c, Combo& combo, Hint hint) : c_(c), combo_(combo), hint_(hint) {}

  // A dry run of `micro` (accum micro-batches, an uneven last one) under the budget, with the
  // schedule this combination gives at that micro-batch; nullopt when no schedule fits.
  std::optional<DryRunResult> probe(std::int64_t micro, std::int64_t accum, std::int64_t last,
                                    Schedule* schedule_out) {
    RunSpec q = request(micro, accum, last);
    q.alloc.budget = c_.budget;
    if (!combo_.optimal()) {
      const DryRunResult r = run(q);
      if (schedule_out) *schedule_out = fixed_schedule();
      return r;
    }
    // Optimal: the DP's limit is what the chain may use: the budget less the static bytes and
    // the micro-batch's inputs; the dry run confirms with every other byte (rounding,
    // fragmentation, the head's transients) and lowers the limit by what it overshot.
    const auto inputs = static_cast<std::int64_t>(2 * sizeof(std::int32_t)) * micro * c_.seq_len;
    std::int64_t limit = static_cast<std::int64_t>(q.alloc.budget) - static_device() - inputs;
    // One DP for the attempts: its tables answer each lowered limit without solving again.
    std::optional<OptimalSolver> solver;
    for (int attempt = 0; attempt < 6 && limit > 0; ++attempt) {
      const SolverResult& s = solve(micro, limit, solver);
      // Nothing fits in the DP's model; its model is not the allocator's (activation offload
      // moves the checkpoints to the host, say), so the fallbacks below still get their dry run.
      if (!s.feasible) break;
      q.trainer.policy.checkpoint = Checkpointing::solved(s.schedule);
      const DryRunResult r = run(q);
      if (r.fits) {
        if (schedule_out) *schedule_out = s.schedule;
        return r;
      }
      RunSpec free_q = q;
      free_q.alloc.budget = 0;
      const DryRunResult u = run(free_q);
      const auto over =
          static_cast<std::int64_t>(u.step.reserved) - static_cast<std::int64_t>(q.alloc.budget);
      // From the schedule's own peak in the DP's model, which may lie well below the limit
      // (a lower limit that it still fits would give the same schedule and the same overshoot).
      limit = std::min(limit, s.peak_bytes) - std::max<std::int64_t>(over, limit / 64 + 1);
    }
    // The DP's memory model is conservative (the dry run is the truth), so a schedule that
    // fitted a smaller micro-batch may still fit this one: try the largest such, then all(n).
    std::vector<Schedule> fallbacks;
    for (auto it = cache_.rbegin(); it != cache_.rend(); ++it) {
      if (it->first < micro && it->second) {
        fallbacks.push_back(it->second->schedule);
        break;
      }
    }
    fallbacks.push_back(Schedule::all(static_cast<int>(c_.o.spec.layers)));
    for (const Schedule& f : fallbacks) {
      q.trainer.policy.checkpoint = Checkpointing::solved(f);
      const DryRunResult r = run(q);
      if (r.fits) {
        if (schedule_out) *schedule_out = f;
        return r;
      }
    }
    return std::nullopt;
  }

  // Optimal solver: a micro-batch found largest may have been probed before the schedule of
  // its predecessor was known, and a schedule solved under a lowered limit often has room to
  // spare: with the schedule of `lo` fixed, the largest micro-batch it fits, up to `cap`. One
  // more sample first (usually the answer: it fails); then the peaks of the fixed schedule,
  // nearly linear in the micro-batch, interpolated (bracket()). Near the budget fitting is not
  // monotone (a block's rounding), so this finds a fit whose successor fails, not necessarily
  // the first failure above `lo` (which a walk of one sample at a time found, at one dry run
  // per sample: 68 for gpt2-xl f16 optimal with optimizer offload).
  std::int64_t extend_with_own_schedule(std::int64_t lo, std::int64_t cap) {
    if (!combo_.optimal() || lo >= cap) return lo;
    const std::optional<Found>& f = at(lo);
    if (!f) return lo;
    const Schedule own = f->schedule;  // with_own below may rehash the cache
    const std::size_t p_lo = f->r.step.reserved;
    auto with_own = [&](std::int64_t m, std::size_t* peak) {
      const DryRunResult r = run_with(m, own);
      if (!r.fits) return false;
      std::optional<Found>& slot = cache_[m];
      if (!slot) slot = Found{r, own};
      *peak = r.step.reserved;
      return true;
    };
    std::size_t p1 = 0;
    if (!with_own(lo + 1, &p1)) return lo;
    return bracket(lo + 1, p1, lo, p_lo, cap + 1, cap, with_own);
  }

  // One step's dry run of `micro` samples with a given schedule (optimal solver).
  DryRunResult run_with(std::int64_t micro, const Schedule& schedule) {
    RunSpec q = request(micro, 1, 0);
    q.alloc.budget = c_.budget;
    q.trainer.policy.checkpoint = Checkpointing::solved(schedule);
    return run(q);
  }

  struct Found {
    DryRunResult r;
    Schedule schedule;
  };
  // probe(micro) in one micro-batch, remembered: the search and the final plan share it.
  const std::optional<Found>& at(std::int64_t micro) {
    auto it = cache_.find(micro);
    if (it == cache_.end()) {
      std::optional<Found> f;
      if (const Schedule* twin = combo_.optimal() ? hint_.schedule_at(micro) : nullptr) {
        const DryRunResult r = run_with(micro, *twin);
        if (r.fits) f = Found{r, *twin};
      }
      if (!f) {
        Schedule s;
        const std::optional<DryRunResult> r = probe(micro, 1, 0, &s);
        if (r && r->fits) f = Found{*r, s};
      }
      it = cache_.emplace(micro, std::move(f)).first;
    }
    return it->second;
  }

  // Optimal solver: every schedule that fitted, for a twin (Combo::fitted).
  void export_fitted() {
    if (!combo_.optimal()) return;
    for (const auto& [m, f] : cache_) {
      if (f) combo_.fitted.emplace(m, f->schedule);
    }
  }

  bool fits(std::int64_t micro, std::size_t* peak) {
    const std::optional<Found>& f = at(micro);
    if (peak && f) *peak = f->r.step.reserved;
    return f.has_value();
  }

  // The largest micro-batch whose dry run fits, up to `cap`: exponential steps from a hint,
  // then interpolation on the measured peaks, falling back to bisection when it stalls. A hint
  // with a schedule (optimal solver: what fitted the twin at `hint`) is tried with that schedule
  // first: a twin allocates the same bytes, so where it held, so does this one.
  std::int64_t max_micro(std::int64_t cap, int optimal_tolerance = kOptimalTolerance) {
    const std::int64_t hint = hint_.micro;
    const Schedule* hint_schedule = combo_.optimal() ? hint_.schedule_at(hint) : nullptr;
    std::size_t p_lo = 0;
    if (hint_schedule != nullptr && hint > 1 && hint <= cap) {
      const DryRunResult r = run_with(hint, *hint_schedule);
      if (r.fits) {
        std::optional<Found>& slot = cache_[hint];
        if (!slot) slot = Found{r, *hint_schedule};
        return extend_with_own_schedule(hint, cap);
      }
    }
    std::int64_t lo = 1, hi = cap + 1;  // fits(lo), !fits(hi) (hi = cap + 1: unknown)
    std::int64_t lo_prev = 0;
    std::size_t p_prev = 0;
    if (hint > 1 && hint <= cap && fits(hint, &p_lo)) {
      // A twin's answer: one sample more decides (one micro-batch is then not probed at all).
      std::size_t p = 0;
      if (hint + 1 > cap || !fits(hint + 1, &p)) return extend_with_own_schedule(hint, cap);
      lo_prev = hint, p_prev = p_lo, lo = hint + 1, p_lo = p;
    } else {
      if (hint > 1 && hint <= cap) hi = hint;
      if (!fits(1, &p_lo)) return 0;
    }
    auto probe_fits = [&](std::int64_t m, std::size_t* p) { return fits(m, p); };
    // The optimal solver's probe near the boundary is the expensive one (a failing micro-batch
    // tries up to six limits, two dry runs each, one DP solve for them all, then two
    // fallbacks): it stops near the boundary (kOptimalTolerance), and the extension with the
    // schedule found carries on.
    const int per = combo_.optimal() ? optimal_tolerance : 0;
    lo = bracket(lo, p_lo, lo_prev, p_prev, hi, cap, probe_fits, per);
    return extend_with_own_schedule(lo, cap);
  }

  // Throughput mode, optimal solver: the largest of the ascending `cand` that fits, found by
  // bisection (0: not even cand[0]). Where that lies below `exact_below` and a larger
  // candidate failed, the largest micro-batch between the two instead (bracket() to within
  // 1 / per of the failure, then extend_with_own_schedule()).
  std::int64_t largest_fitting(const std::vector<std::int64_t>& cand, std::int64_t exact_below,
                               int per) {
    std::size_t p_lo = 0;
    if (cand.empty() || !fits(cand.front(), &p_lo)) return 0;
    std::size_t lo = 0, hi = cand.size();  // fits(cand[lo]); cand[hi] does not (size: unknown)
    while (hi - lo > 1) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (fits(cand[mid], nullptr)) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    const std::int64_t m = cand[lo];
    if (hi == cand.size() || m >= exact_below) return m;
    fits(m, &p_lo);
    auto probe_fits = [&](std::int64_t b, std::size_t* p) { return fits(b, p); };
    const std::int64_t fail = cand[hi];
    return extend_with_own_schedule(bracket(m, p_lo, 0, 0, fail, fail, probe_fits, per),
                                    fail - 1);
  }

  // Given fits(lo) with peak p_lo (and an earlier fit lo_prev < lo with p_prev, 0: none) and
  // !fits(hi) (hi = cap + 1: unknown), a micro-batch m in [lo, cap] that fits while m + 1 does
  // not (or is past cap): interpolation on the peaks while they give a slope, geometric steps
  // while they do not, bisection when interpolation shrank the interval by less than half.
  // per > 0: stop once hi - lo <= lo / per (an m within that of a boundary).
  template <class Fits>
  std::int64_t bracket(std::int64_t lo, std::size_t p_lo, std::int64_t lo_prev, std::size_t p_prev,
                       std::int64_t hi, std::int64_t cap, Fits&& fits_at, int per = 0) {
    bool bisect = false;
    // (hi > cap: no failure seen yet, so cap itself is still probed.)
    while (hi - lo > (per > 0 && hi <= cap ? std::max<std::int64_t>(1, lo / per) : 1)) {
      std::int64_t next;
      if (bisect || lo_prev == 0 || p_lo <= p_prev) {
        // Without two points (or a slope) grow geometrically until something fails.
        next = hi > cap ? std::min(cap, lo * 2) : lo + (hi - lo) / 2;
        if (hi <= cap) bisect = false;
      } else {
        const double slope = double(p_lo - p_prev) / double(lo - lo_prev);
        const double room = double(c_.budget) - double(p_lo);
        next = lo + static_cast<std::int64_t>(std::floor(std::max(0.0, room) / slope));
        next = std::clamp<std::int64_t>(next, lo + 1, std::min(hi - 1, cap));
      }
      if (next <= lo) break;
      const std::int64_t width = hi - lo;
      std::size_t p = 0;
      if (fits_at(next, &p)) {
        lo_prev = lo, p_prev = p_lo, lo = next, p_lo = p;
      } else {
        hi = next;
      }
      // Interpolation that shrank the interval by less than half: bisect next time.
      bisect = hi <= cap && (hi - lo) * 2 > width;
    }
    return lo;
  }

  // The search probes the first step only; a plan's answer is confirmed over two (confirm()).
  DryRunResult run(const RunSpec& q, int steps = 1) {
    // The same request again (the DP may answer two limits with one schedule; a fallback may
    // be a schedule already run) is answered from memory: a dry run is deterministic.
    std::vector<Ran>& same = ran_[{q.trainer.policy.micro_batch, q.batch, q.alloc.budget, steps}];
    for (const Ran& r : same) {
      if (r.policy == q.trainer.policy) return r.result;
    }
    ++combo_.dry_runs;
    DryRunResult r;
    try {
      r = dry_run(q, steps);
    } catch (const DryRunUnsettled& e) {
      // Memory that cannot be predicted is not offered: this request does not fit.
      r.fits = false;
      r.failure = e.what();
    }
    same.push_back({q.trainer.policy, r});
    return same.back().result;
  }
  // A probe that fitted, over two steps (the second starts from the first's cache).
  std::optional<DryRunResult> confirm(std::int64_t micro, std::int64_t accum, std::int64_t last,
                                      const Schedule& schedule) {
    RunSpec q = request(micro, accum, last);
    q.alloc.budget = c_.budget;
    if (combo_.optimal()) q.trainer.policy.checkpoint = Checkpointing::solved(schedule);
    DryRunResult r = run(q, /*steps=*/2);
    if (!r.fits) return std::nullopt;
    return r;
  }
  // The largest micro-batch <= m whose first-step fit holds over two steps (rarely one less:
  // a block's rounding); 0 for none. For the optimal solver a micro-batch whose own schedule
  // fails over two steps also tries the schedule solved for one sample fewer (the solver's
  // schedules are not monotone in the micro-batch: measured, f32 on a small GPT at 40 MiB,
  // the schedule solved for 80 fails where 79's fits at 80).
  // A micro-batch the search did not probe (below the one the extension reached) is confirmed
  // with the schedule that fitted at the top, not solved for (as the extension walking one
  // sample at a time left it).
  std::int64_t confirmed(std::int64_t m, DryRunResult* out, Schedule* schedule) {
    std::optional<Schedule> top;
    for (; m >= 1; --m) {
      if (top && cache_.find(m) == cache_.end()) {
        if (std::optional<DryRunResult> r = confirm(m, 1, 0, *top)) {
          *out = *r;
          *schedule = *top;
          return m;
        }
        continue;
      }
      const std::optional<Found>& f = at(m);
      if (f && combo_.optimal() && !top) top = f->schedule;
      if (!f) continue;
      if (std::optional<DryRunResult> r = confirm(m, 1, 0, f->schedule)) {
        *out = *r;
        *schedule = f->schedule;
        return m;
      }
      if (!combo_.optimal() || m == 1) continue;
      const auto below = cache_.find(m - 1);  // (probed: solving for it here costs too much)
      if (below == cache_.end() || !below->second ||
          below->second->schedule.ops() == f->schedule.ops()) {
        continue;
      }
      const Schedule other = below->second->schedule;
      if (std::optional<DryRunResult> r = confirm(m, 1, 0, other)) {
        *out = *r;
        *schedule = other;
        return m;
      }
    }
    return 0;
  }

  // `accum` micro-batches of `micro` samples on each rank, the last one `last` (0: micro).
  RunSpec request(std::int64_t micro, std::int64_t accum, std::int64_t last) const {
    return planner_detail::request(c_, combo_, micro, accum, last);
  }

  // The bytes the optimal solver's limit leaves out besides the chain's: parameters,
  // gradients and optimizer state on this rank. One rank holding everything: the cost model's
  // static bytes. ZeRO-1/2: what rank 0 reserved building the model and its sharded optimizer
  // (an unbudgeted dry run of one sample, the one infeasible_reason makes).
  std::int64_t static_device() {
    if (!static_device_) {
      if (zero_stage(c_.o) == 0) {
        static_device_ = c_.cm.static_bytes(combo_.dtype, combo_.offload).device_total();
      } else {
        RunSpec q = request(1, 1, 0);
        q.alloc.budget = 0;
        static_device_ = static_cast<std::int64_t>(run(q).setup_peak_reserved);
      }
    }
    return *static_device_;
  }

  const Schedule& fixed_schedule() {
    if (!fixed_) fixed_ = combo_.ck.schedule(c_.n);
    return *fixed_;
  }

  // The optimal solver's answer for `micro` samples under `limit`, remembered: a probe with
  // accumulation starts from the limit of the probe without. `solver`: the probe's, made here
  // on first use (the chain at this micro-batch).
  const SolverResult& solve(std::int64_t micro, std::int64_t limit,
                            std::optional<OptimalSolver>& solver) {
    auto it = solved_.find({micro, limit});
    if (it == solved_.end()) {
      if (!solver) solver.emplace(c_.cm.chain(micro, combo_.dtype, c_.o.device));
      SolverResult s = solver->solve(limit);
      it = solved_.emplace(std::pair{micro, limit}, std::move(s)).first;
    }
    return it->second;
  }

 private:
  const Context& c_;
  Combo& combo_;
  Hint hint_;
  std::optional<std::int64_t> static_device_;
  std::optional<Schedule> fixed_;
  std::map<std::int64_t, std::optional<Found>> cache_;
  // Every dry run this search made, by (micro-batch, batch, budget, steps), with its policy
  // (the rest of the request is the combination's).
  struct Ran {
    MemoryPolicy policy;
    DryRunResult result;
  };
  std::map<std::tuple<std::int64_t, std::int64_t, std::size_t, int>, std::vector<Ran>> ran_;
  std::map<std::pair<std::int64_t, std::int64_t>, SolverResult> solved_;  // by (micro, limit)
};

// `r`: the confirming dry run of rank 0 (ZeRO: its shards are the largest), the plan's
// per-rank figures as they are. `global`: every rank's samples per step.
Plan make_plan(const Context& c, const Combo& combo, const Schedule& s, const DryRunResult& r,
               std::int64_t micro, std::int64_t accum, std::int64_t global) {
  Plan p;
  p.model = c.o.spec;
  p.device = c.o.device.name;
  p.budget = c.budget;
  p.seq_len = c.seq_len;
  p.device_kind = c.o.device.kind;
  p.accum_steps = accum;
  p.global_batch = global;
  p.policy.dtype = combo.dtype;
  p.policy.checkpoint = combo.optimal() ? Checkpointing::solved(s) : combo.ck;
  p.policy.offload = combo.offload;
  p.policy.micro_batch = micro;
  p.policy.loss = c.o.loss;
  p.ranks = c.o.ranks;
  p.zero_stage = zero_stage(c.o);
  p.overlap_comm = c.o.overlap_comm;
  p.alloc = c.o.alloc_conf;
  p.alloc.budget = 0;
  p.predicted.peaks = r.step;
  // Measured CPU rates: the confirming dry run's ops at those rates (r ran with them), plus
  // the host AdamW of optimizer offload; otherwise the cost model's analytic time. Either is
  // one rank's compute; ranks > 1 add the collectives at the device's rank_link
  // (policies/collective_cost.h), not hidden behind it.
  const RunSpec run = p.run_spec();
  p.predicted.step_seconds =
      (c.o.cpu_rates ? c.o.cpu_rates->step_seconds(run, r)
                     : c.cm.step_seconds(p.policy, s, micro, accum, c.o.device)) +
      collective_cost(run, c.o.device).seconds;
  const double tokens = double(global) * double(c.seq_len);
  p.predicted.tokens_per_second =
      p.predicted.step_seconds > 0 ? tokens / p.predicted.step_seconds : 0;
  return p;
}

std::string infeasible_reason(const Context& c, Combo& combo, Searcher& s) {
  RunSpec q = s.request(1, 1, 0);  // optimal: all(n), the least memory a per-block rule reaches
  q.alloc.budget = 0;
  const DryRunResult u = s.run(q);
  const std::size_t need = u.step.reserved;
  const std::size_t setup = u.setup_peak_reserved;
  if (setup > c.budget) {
    return combo.name() + ": the weights, gradients and optimizer state alone need " +
           gib(double(setup)) + " (budget " + gib(double(c.budget)) + ")";
  }
  return combo.name() + ": one sample needs " + gib(double(std::max(need, setup))) + " (budget " +
         gib(double(c.budget)) + ")";
}

}  // namespace

// Max-batch mode for one combination.
void search_max(const Context& c, Combo& combo, Hint hint) {
  Searcher s(c, combo, hint);
  std::int64_t m = s.max_micro(c.o.max_micro_batch);
  DryRunResult r;
  Schedule sched;
  if (m > 0) m = s.confirmed(m, &r, &sched);
  combo.max_micro = m;
  s.export_fitted();
  if (m > 0 && combo.optimal()) combo.fitted[m] = sched;  // the schedule confirmed at m
  if (m == 0) {
    combo.infeasible = infeasible_reason(c, combo, s);
    return;
  }
  combo.plan = make_plan(c, combo, sched, r, m, 1, m * c.o.ranks);
}

namespace {

// Throughput mode splits the per-rank batch into k micro-batches; ceil(per_rank / k) for k up to
// kSplits is a candidate, and so is every power of two.
constexpr std::int64_t kSplits = 8;

// Candidate micro-batches up to `cap` (<= per_rank), ascending: powers of two,
// ceil(per_rank / k) for k <= splits, and cap. Between ceil(per_rank / k) and the next larger
// such size every micro-batch takes the same k micro-batches, and the smallest of them
// recomputes least, so above ceil(per_rank / splits) nothing else can be faster.
std::vector<std::int64_t> split_candidates(std::int64_t per_rank, std::int64_t cap,
                                           std::int64_t splits) {
  std::vector<std::int64_t> cand;
  for (std::int64_t b = 1; b <= cap; b *= 2) cand.push_back(b);
  for (std::int64_t k = 1; k <= splits; ++k) {
    const std::int64_t b = ceil_div(per_rank, k);
    if (b <= cap) cand.push_back(b);
  }
  cand.push_back(cap);
  std::sort(cand.begin(), cand.end());
  cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
  return cand;
}

// Throughput mode for one combination: the micro-batch (up to the largest that fits) that
// reaches the per-rank batch fastest, confirmed by a dry run with its accumulation.
void throughput(const Context& c, Combo& combo, Searcher& s) {
  const std::int64_t per_rank = c.o.global_batch / c.o.ranks;
  const std::int64_t cap = std::min(c.o.max_micro_batch, per_rank);
  const bool optimal = combo.optimal();
  // Candidate micro-batches. A fixed rule's dry runs are cheap: the largest that fits, then
  // every one up to it when few, else split_candidates() with k <= 512. The optimal solver
  // solves a DP per micro-batch: only split_candidates() with k <= kSplits, the largest that
  // fits found among them by bisection (fitting grows no easier with the micro-batch), and the
  // exact largest only where it can matter (below per_rank / kSplits).
  std::vector<std::int64_t> cand;
  std::int64_t m = 0;
  if (optimal) {
    cand = split_candidates(per_rank, cap, kSplits);
    m = s.largest_fitting(cand, ceil_div(per_rank, kSplits), kOptimalThroughputTolerance);
    cand.push_back(m);
  } else {
    m = s.max_micro(cap);
    if (m <= 512) {
      for (std::int64_t b = 1; b <= m; ++b) cand.push_back(b);
    } else {
      cand = split_candidates(per_rank, m, 512);
    }
  }
  combo.max_micro = m;
  if (m == 0) {
    combo.infeasible = infeasible_reason(c, combo, s);
    return;
  }
  std::sort(cand.begin(), cand.end());
  cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
  cand.erase(std::upper_bound(cand.begin(), cand.end(), m), cand.end());
  struct Timed {
    double seconds;
    std::int64_t micro;
  };
  std::vector<Timed> timed;
  MemoryPolicy pol;
  pol.dtype = combo.dtype;
  pol.offload = combo.offload;
  pol.loss = c.o.loss;
  for (std::int64_t b : cand) {
    const std::int64_t accum = ceil_div(per_rank, b);
    if (accum > kMaxMicroBatches) continue;  // past what a step may hold (accumulation.h)
    Schedule sched;
    if (optimal) {
      const auto& f = s.at(b);
      if (!f) continue;
      sched = f->schedule;
    } else {
      sched = s.fixed_schedule();
    }
    timed.push_back({c.cm.step_seconds(pol, sched, b, accum, c.o.device), b});
  }
  std::sort(timed.begin(), timed.end(), [](const Timed& a, const Timed& b) {
    return a.seconds != b.seconds ? a.seconds < b.seconds : a.micro > b.micro;
  });
  // The best few confirmed with their real accumulation (an uneven last micro-batch included).
  for (std::size_t i = 0; i < timed.size() && i < 4; ++i) {
    const std::int64_t b = timed[i].micro;
    const std::int64_t accum = ceil_div(per_rank, b);
    const std::int64_t last = per_rank - (accum - 1) * b;
    Schedule sched;
    const std::int64_t uneven = last == b ? 0 : last;
    if (optimal) {
      const std::optional<DryRunResult> first = s.probe(b, accum, uneven, &sched);
      if (!first || !first->fits) continue;
    } else {
      // A fixed rule's schedule needs no probe: two steps that fit begin with one that does.
      sched = s.fixed_schedule();
    }
    const std::optional<DryRunResult> r = s.confirm(b, accum, uneven, sched);
    if (!r) continue;
    combo.plan = make_plan(c, combo, sched, *r, b, accum, c.o.global_batch);
    return;
  }
  if (ceil_div(per_rank, m) > kMaxMicroBatches) {
    combo.infeasible = combo.name() + ": a per-rank batch of " + std::to_string(per_rank) +
                       " needs more than " + std::to_string(kMaxMicroBatches) +
                       " micro-batches of at most " + std::to_string(m);
    return;
  }
  combo.infeasible =
      combo.name() + ": no micro-batch up to " + std::to_string(m) + " fits with its accumulation";
}

}  // namespace

void search_throughput(const Context& c, Combo& combo, Hint hint) {
  Searcher s(c, combo, hint);
  throughput(c, combo, s);
  s.export_fitted();
}

}  // namespace memfit::planner_detail
