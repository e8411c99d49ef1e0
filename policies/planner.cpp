#include "policies/planner.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <typeinfo>

#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"
#include "policies/checkpoint_solver.h"
#include "policies/cost_model.h"
#include "policies/dry_run.h"
#include "policies/planner_search.h"

namespace memfit {

using planner_detail::Combo;
using planner_detail::Context;
using planner_detail::gib;
using planner_detail::search_max;
using planner_detail::search_throughput;
using planner_detail::unsupported;

namespace {

void validate(const PlannerOptions& o) {
  auto bad = [](const std::string& what) { throw InvalidArgument("plan: " + what); };
  if (o.ranks < 1) bad("ranks " + std::to_string(o.ranks) + " must be >= 1");
  if (o.zero_stage < 0 || o.zero_stage > 2) {
    bad("zero_stage " + std::to_string(o.zero_stage) +
        "; valid: 0, 1 (optimizer state "
        "sharded), 2 (+ gradients)");
  }
  if (o.global_batch < 0) bad("global batch " + std::to_string(o.global_batch) + " must be >= 0");
  if (o.global_batch > 0 && o.global_batch % o.ranks != 0) {
    bad("a global batch of " + std::to_string(o.global_batch) + " cannot be split over " +
        std::to_string(o.ranks) + " ranks; valid: a multiple of " + std::to_string(o.ranks));
  }
  if (o.max_micro_batch < 1) bad("max_micro_batch must be >= 1");
  if (o.dtypes.empty() || o.checkpoints.empty() || o.offloads.empty()) {
    bad("at least one dtype, one checkpointing and one offload setting are needed");
  }
  for (const Checkpointing& ck : o.checkpoints) {
    if (ck.kind() == Checkpointing::Kind::kOptimal) continue;
    try {
      (void)ck.schedule(static_cast<int>(o.spec.layers));
    } catch (const InvalidArgument& e) {
      bad("checkpoint " + ck.name() + ": " + e.what());
    }
  }
  for (const OffloadSwitches& off : o.offloads) {
    if (off.delayed_update && !off.optimizer) bad("offload: a delayed update needs the optimizer");
  }
  if (o.threads < 0) bad("threads must be >= 0");
}

// The least the parameters, gradients and optimizer state need on one rank with every policy
// the options allow, and for what; nullopt when the budget covers it. One rank holding them
// whole: the cost model's static bytes. ZeRO-1/2: what rank 0 reserves building the model and
// its sharded optimizer, by a dry run of one sample per dtype and (runnable) offload setting.
std::optional<std::string> weights_shortfall(const Context& c) {
  std::optional<std::pair<std::size_t, std::string>> best;
  const bool zero = planner_detail::zero_stage(c.o) > 0;
  for (DType dt : c.o.dtypes) {
    for (const OffloadSwitches& off : c.o.offloads) {
      if (!unsupported(c.o, off).empty()) continue;  // not offered (planner_search.h)
      std::array<std::int64_t, kCategoryCount> by{};
      std::size_t need = 0;
      if (zero) {
        const Combo cb(dt, Checkpointing::all(), off);
        RunSpec q = planner_detail::request(c, cb, 1, 1, 0);
        const DryRunResult u = dry_run(q, /*steps=*/1);
        need = u.setup_peak_reserved;
        for (std::size_t k = 0; k < kCategoryCount; ++k) {
          by[k] = static_cast<std::int64_t>(u.step.category_peaks[k]);
        }
      } else {
        const StaticBytes s = c.cm.static_bytes(dt, off);
        need = static_cast<std::size_t>(s.device_total());
        by = s.device;
      }
      if (best && best->first <= need) continue;
      auto b = [&](Category k) { return gib(double(by[category_index(k)])); };
      best = {need, std::string(dtype_name(dt)) + " weights " + b(Category::kParameter) +
                        ", f32 gradients " + b(Category::kGradient) + ", optimizer state " +
                        b(Category::kOptimizerState) +
                        (off.weights     ? " (weights: the buffer ring; the rest on the host)"
                         : off.gradients ? " (gradients: the bucket ring; optimizer on the host)"
                         : off.optimizer ? " (offloaded: on the host)"
                                         : "") +
                        (zero ? " on rank 0 of " + std::to_string(c.o.ranks) + " with ZeRO-" +
                                    std::to_string(c.o.zero_stage)
                              : "")};
    }
  }
  if (!best || best->first <= c.budget) return std::nullopt;
  return "budget " + gib(double(c.budget)) +
         " is below what the weights need even with every "
         "policy on: " +
         gib(double(best->first)) + " for " + c.o.spec.name + " (" +
         std::to_string(c.cm.parameter_count()) + " parameters: " + best->second +
         ") before any activation; valid: a budget above that, more ranks with ZeRO, or a "
         "smaller model" +
         (zero ? std::string(" (ZeRO-1/2 takes no optimizer, gradient or weight offload yet; "
                             "ZeRO-0 does)")
               : std::string());
}

}  // namespace

PlanResult plan(const PlannerOptions& o) {
  o.spec.validate();
  const std::int64_t seq_len = o.spec.resolve_seq_len(o.seq_len);
  validate(o);
  const std::size_t budget = o.budget > 0 ? o.budget : o.device.usable_bytes();
  if (budget == 0) {
    throw InvalidArgument("plan: no budget: device '" + o.device.name +
                          "' has no usable memory (memory - context); give a budget");
  }
  const CostModel cm = [&] {
    try {
      return o.calibrate ? CostModel::calibrate(o.spec, seq_len, 1, 2, o.loss)
                         : CostModel::analytic(o.spec, seq_len, o.loss);
    } catch (const InvalidArgument& e) {
      if (typeid(e) != typeid(InvalidArgument)) throw;
      // A size past 64 bits ("layer cost overflows: ..."): name the model and seq_len it is.
      throw InvalidArgument("plan: " + o.spec.name + " at seq_len " + std::to_string(seq_len) +
                            ": " + e.what() + "; valid: a shorter seq_len or a smaller model");
    }
  }();
  const Context c{o, cm, seq_len, budget, static_cast<int>(o.spec.layers)};
  if (const auto msg = weights_shortfall(c)) throw InvalidArgument("plan: " + *msg);

  std::vector<Combo> combos;
  for (const OffloadSwitches& off : o.offloads) {
    for (const Checkpointing& ck : o.checkpoints) {
      // No checkpoints, nothing for activation offload to move: the same plan as without it.
      if (off.activations && ck.kind() == Checkpointing::Kind::kNone) {
        OffloadSwitches without = off;
        without.activations = false;
        if (std::find(o.offloads.begin(), o.offloads.end(), without) != o.offloads.end()) continue;
      }
      for (DType dt : o.dtypes) combos.emplace_back(dt, ck, off);
    }
  }
  // f16 and bf16 allocate the same bytes: a twin searched second starts from the first's
  // answer (two dry runs when it holds) and, for the optimal solver, tries the first's
  // schedules before solving its own (planner_search.h's Hint). Twins are adjacent, so each
  // thread takes a pair.
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < combos.size(); ++i) {
    if (!groups.empty() && combos[i].dtype != DType::kF32) {
      const Combo& prev = combos[groups.back().back()];
      if (prev.dtype != DType::kF32 && prev.ck == combos[i].ck &&
          prev.offload == combos[i].offload) {
        groups.back().push_back(i);
        continue;
      }
    }
    groups.push_back({i});
  }
  // The longest searches first, so that no thread starts one when the others are about done:
  // the optimal solver's (a DP per probe, and several probes per micro-batch), twins before
  // singles. Each group's answer is its own, whichever thread takes it and when.
  const auto weight = [&](const std::vector<std::size_t>& g) {
    return (combos[g.front()].optimal() ? 4 : 0) + static_cast<int>(g.size());
  };
  std::stable_sort(groups.begin(), groups.end(),
                   [&](const auto& a, const auto& b) { return weight(a) > weight(b); });
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  std::exception_ptr error;
  auto worker = [&] {
    for (std::size_t g; (g = next.fetch_add(1)) < groups.size();) {
      try {
        planner_detail::Hint hint;
        for (std::size_t i : groups[g]) {
          Combo& cb = combos[i];
          if (const std::string why = unsupported(o, cb.offload); !why.empty()) {
            cb.infeasible = cb.name() + ": " + why;
            continue;
          }
          const auto host =
              static_cast<std::size_t>(cm.static_bytes(cb.dtype, cb.offload).host_pinned);
          if (o.host_budget > 0 && host > o.host_budget) {
            cb.infeasible = cb.name() + ": offload pins " + gib(double(host)) +
                            " of host memory, over the host budget of " +
                            gib(double(o.host_budget));
            continue;
          }
          if (o.global_batch > 0) {
            search_throughput(c, combos[i], hint);
          } else {
            search_max(c, combos[i], hint);
          }
          hint = planner_detail::Hint::of(combos[i]);
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t nthreads =
      std::min<std::size_t>(groups.size(), o.threads > 0 ? unsigned(o.threads) : hw);
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < nthreads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);

  PlanResult result;
  std::vector<std::size_t> feasible;  // combos with a plan, in the candidates' order
  for (std::size_t i = 0; i < combos.size(); ++i) {
    Combo& cb = combos[i];
    result.dry_runs += cb.dry_runs;
    if (cb.plan) {
      feasible.push_back(i);
    } else {
      result.infeasible.push_back(cb.infeasible);
    }
  }
  if (feasible.empty()) {
    std::string msg = "plan: nothing fits in " + gib(double(budget)) + " for " + o.spec.name +
                      " at seq_len " + std::to_string(seq_len) + ":";
    for (const std::string& s : result.infeasible) msg += "\n  " + s;
    msg += std::string("\nvalid: a larger budget") + (o.host_budget > 0 ? " or host budget" : "") +
           ", a shorter seq_len, or a smaller model" +
           (planner_detail::zero_stage(o) > 0
                ? " (ZeRO-1/2 plans take no optimizer, gradient or weight offload; ZeRO-0 does)"
                : "");
    throw InvalidArgument(msg);
  }
  const bool throughput = o.global_batch > 0;
  const auto better = [&](const Plan& a, const Plan& b) {
        if (throughput) return a.predicted.step_seconds < b.predicted.step_seconds;
        if (a.policy.micro_batch != b.policy.micro_batch) {
          return a.policy.micro_batch > b.policy.micro_batch;
        }
        if (a.predicted.tokens_per_second != b.predicted.tokens_per_second) {
          return a.predicted.tokens_per_second > b.predicted.tokens_per_second;
        }
        // A true tie: bf16 before f16 (f32's range, no loss scaler to tune).
        auto pref = [](DType d) { return d == DType::kBF16 ? 0 : d == DType::kF16 ? 1 : 2; };
        return pref(a.policy.dtype) < pref(b.policy.dtype);
      };
  std::stable_sort(feasible.begin(), feasible.end(), [&](std::size_t a, std::size_t b) {
    return better(*combos[a].plan, *combos[b].plan);
  });
  for (std::size_t i : feasible) result.candidates.push_back(*combos[i].plan);
  // The allocator: when the caller leaves it to the planner, the best combination is searched
  // again with expandable segments, which it takes when that fits a larger micro-batch (or,
  // for a global batch, is faster: fewer accumulation steps).
  std::string allocator_note;
  if (o.choose_allocator && !o.alloc_conf.expandable_segments) {
    PlannerOptions ox = o;
    ox.alloc_conf.expandable_segments = true;
    const Context cx{ox, cm, seq_len, budget, static_cast<int>(o.spec.layers)};
    const Combo& base = combos[feasible.front()];
    Combo cb(base.dtype, base.ck, base.offload);
    if (throughput) {
      search_throughput(cx, cb, planner_detail::Hint::of(base));
    } else {
      search_max(cx, cb, planner_detail::Hint::of(base));
    }
    result.dry_runs += cb.dry_runs;
    const Plan fixed = result.candidates.front();
    if (cb.plan && better(*cb.plan, fixed) &&
        (throughput || cb.plan->policy.micro_batch > fixed.policy.micro_batch)) {
      allocator_note = "; expandable segments (micro-batch " +
                       std::to_string(cb.plan->policy.micro_batch) + " against " +
                       std::to_string(fixed.policy.micro_batch) + " with fixed segments)";
      result.candidates.front() = *cb.plan;  // the same combination, its better allocator
    } else {
      allocator_note = "; fixed segments (expandable segments fit no more)";
    }
  }
  Plan& best = result.candidates.front();
  char why[768];
  if (throughput) {
    const Plan* runner = result.candidates.size() > 1 ? &result.candidates[1] : nullptr;
    std::snprintf(why, sizeof why,
                  "fastest to a global batch of %lld: %.3g s per step (%.0f tokens/s) with %s, "
                  "peak %s of %s%s%s%s",
                  static_cast<long long>(o.global_batch), best.predicted.step_seconds,
                  best.predicted.tokens_per_second, best.describe().c_str(),
                  gib(double(best.predicted.peaks.reserved)).c_str(), gib(double(budget)).c_str(),
                  runner ? "; next: " : "",
                  runner ? (runner->describe() + " at " +
                            std::to_string(runner->predicted.step_seconds) + " s")
                               .c_str()
                         : "",
                  allocator_note.c_str());
  } else {
    const bool tie = result.candidates.size() > 1 &&
                     result.candidates[1].policy.micro_batch == best.policy.micro_batch;
    std::snprintf(why, sizeof why,
                  "largest micro-batch that fits %s: %s (peak %s, %.0f tokens/s predicted)%s%s",
                  gib(double(budget)).c_str(), best.describe().c_str(),
                  gib(double(best.predicted.peaks.reserved)).c_str(),
                  best.predicted.tokens_per_second,
                  tie ? "; ties broken by predicted tokens/s" : "", allocator_note.c_str());
  }
  best.why = why;
  for (std::size_t i = 1; i < result.candidates.size(); ++i) {
    Plan& p = result.candidates[i];
    p.why = throughput ? "predicted " + std::to_string(p.predicted.step_seconds) + " s per step"
                       : "largest micro-batch for " + p.describe();
  }
  if (!throughput) {
    const Plan* fastest = &best;
    const Plan* near = nullptr;
    const auto lowest = static_cast<std::int64_t>(
        std::ceil(double(best.policy.micro_batch) * (1.0 - kNearLargest)));
    for (const Plan& p : result.candidates) {
      const double tps = p.predicted.tokens_per_second;
      if (tps > fastest->predicted.tokens_per_second) fastest = &p;
      if (&p != &best && p.policy.micro_batch >= lowest &&
          tps > best.predicted.tokens_per_second &&
          (near == nullptr || tps > near->predicted.tokens_per_second)) {
        near = &p;
      }
    }
    if (fastest != &best) result.fastest = *fastest;
    if (near != nullptr) result.near_largest = *near;
  }
  result.recommended = best;
  return result;
}

}  // namespace memfit
