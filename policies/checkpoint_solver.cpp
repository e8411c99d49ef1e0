// The memory model of checkpoint_solver.h, op by op as core/executor.cpp runs a schedule, and
// the solvers: the fixed rules (Schedule's builders, judged by simulate()) and `optimal` (the
// dynamic program of checkpoint_dp.cpp, judged the same way).
//
// Bytes in use at any moment (simulate() tracks each term):
//   x[k]      block input k is alive while the executor's slot holds it, or while block k holds
//             saved state and saves its input (the same tensor: counted once). A slot is filled
//             exactly as the executor fills it: a forward's output is stored only when a later
//             forward reads it (or it is x[n], the head's, the first time), and only if not
//             already held; kAll and kNothing forwards drop x[i]; a backward drops x[i], x[i+1].
//   saved     saved_bytes of every block holding saved state (kAll forward until its backward).
//   gradient  once the head has run: the gradient at x[b+1] (size of x[b+1]; b the next
//             backward), and after the last backward the gradient at x[0].
// Transients, added while one op runs:
//   Forward(i, keep): its output (always allocated, then dropped if not stored) + fwd_workspace
//     + saved_bytes when keep is kAll.
//   Backward(i): its input gradient (the size of x[i]) + bwd_workspace, beside its saved state
//     and the incoming gradient.
//   The head, right after the forward that first stores x[n]: head_bytes beside everything held
//     (x[n] included); then x[n] goes and the gradient at x[n] takes its place.
// Not included (the same in every schedule, or outside the chain; the planner's dry run through
// the real allocator has them): the embedding's forward and backward beyond x[0], the per-row
// losses the head returns (held to the end of the step), parameters, gradients and optimizer
// state, and allocator rounding. A block is assumed not to keep a handle on its own output.
#include "policies/checkpoint_solver.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/executor.h"  // outputs_read_later, forwards_for_backward
#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"
#include "policies/checkpoint_dp.h"

namespace memfit {

namespace {

constexpr const char* kValidSolvers =
    "none, all, sqrt, every:K (K an integer >= 1), optimal, or an op list as Schedule::str() "
    "prints it";

void check_chain(const Chain& c, const char* where) {
  const auto bad = [&](const std::string& what) {
    throw InvalidArgument(std::string(where) + ": chain " + what);
  };
  if (c.blocks.empty()) bad("has no blocks; valid: at least 1");
  const auto check_bytes = [&](std::int64_t v, const std::string& name) {
    // Bounded so that sums of a few hundred terms cannot overflow int64.
    if (v < 0 || v > (std::int64_t{1} << 52)) {
      bad(name + " = " + std::to_string(v) + "; valid: 0 to 2^52");
    }
  };
  const auto check_time = [&](double v, const std::string& name) {
    if (!(v >= 0) || !std::isfinite(v)) bad(name + " is not a finite time >= 0");
  };
  for (std::size_t i = 0; i < c.blocks.size(); ++i) {
    const ChainBlock& b = c.blocks[i];
    const std::string at = "block " + std::to_string(i) + " ";
    check_bytes(b.input_bytes, at + "input_bytes");
    check_bytes(b.saved_bytes, at + "saved_bytes");
    check_bytes(b.fwd_workspace, at + "fwd_workspace");
    check_bytes(b.bwd_workspace, at + "bwd_workspace");
    check_time(b.fwd_time, at + "fwd_time");
    if (b.fwd_for_backward_time >= 0 || std::isnan(b.fwd_for_backward_time)) {
      check_time(b.fwd_for_backward_time, at + "fwd_for_backward_time");
    }
    check_time(b.bwd_time, at + "bwd_time");
  }
  check_bytes(c.output_bytes, "output_bytes");
  check_bytes(c.head_bytes, "head_bytes");
  check_time(c.head_time, "head_time");
}

std::string describe(const SimulateResult& r, std::int64_t limit) {
  std::ostringstream os;
  os << "peak " << format_bytes(static_cast<std::size_t>(r.peak_bytes))
     << (r.peak_bytes <= limit ? " fits " : " exceeds ") << "the limit "
     << format_bytes(static_cast<std::size_t>(std::max<std::int64_t>(limit, 0)));
  return os.str();
}

SolverResult fixed(const Chain& chain, std::int64_t limit, Schedule s) {
  SolverResult r;
  const SimulateResult sim = simulate(chain, s);
  r.feasible = sim.peak_bytes <= limit;
  r.peak_bytes = sim.peak_bytes;
  r.compute_time = sim.compute_time;
  r.why = s.name() + ": " + describe(sim, limit) + ", " + std::to_string(s.recomputed_forwards()) +
          " recomputed forwards";
  r.schedule = std::move(s);
  return r;
}

// The optimal solver's answer from the DP's (`dp`, solved for `limit` or above).
SolverResult optimal(const Chain& chain, std::int64_t limit, int slots,
                     const std::optional<DpSolution>& dp) {
  const int n = static_cast<int>(chain.blocks.size());
  std::optional<SolverResult> best;
  if (dp) {
    best = fixed(chain, limit, dp->schedule);
    // Rounding up is term by term, so the DP's schedule fits in bytes too.
    MEMFIT_CHECK(best->feasible) << "optimal schedule " << dp->schedule.str() << " peaks at "
                                 << best->peak_bytes << " > " << limit;
    best->why = "optimal (dynamic program, " + std::to_string(dp->budget_units) + " units of " +
                format_bytes(static_cast<std::size_t>(dp->unit)) + "): " + best->why;
  }
  // Rounding sizes up can cost the DP a schedule that fits in bytes; a fixed rule that fits
  // and is faster is then the better answer (at most 3 simulations, linear in n).
  for (Schedule s : {Schedule::none(n), Schedule::sqrt_n(n), Schedule::all(n)}) {
    SolverResult r = fixed(chain, limit, std::move(s));
    if (r.feasible && (!best || r.compute_time < best->compute_time)) {
      r.why = "optimal: " + r.why + " (faster than the dynamic program's schedule after its " +
              "rounding to " + std::to_string(slots) + " slots)";
      best = std::move(r);
    }
  }
  if (best) return *best;
  SolverResult r = fixed(chain, limit, Schedule::all(n));
  r.feasible = false;
  r.why = "optimal: no schedule fits the limit " +
          format_bytes(static_cast<std::size_t>(std::max<std::int64_t>(limit, 0))) +
          " (all, checkpointing every block, peaks at " +
          format_bytes(static_cast<std::size_t>(r.peak_bytes)) + ")";
  return r;
}

bool looks_like_op_list(std::string_view s) {
  s.remove_prefix(std::min(s.find_first_not_of(' '), s.size()));
  return s.size() >= 2 && (s[0] == 'F' || s[0] == 'R' || s[0] == 'B') && s[1] >= '0' && s[1] <= '9';
}

}  // namespace

SimulateResult simulate(const Chain& chain, const Schedule& schedule) {
  check_chain(chain, "simulate");
  const int n = static_cast<int>(chain.blocks.size());
  schedule.validate(n);
  const auto un = static_cast<std::size_t>(n);
  const std::vector<char> needed = outputs_read_later(schedule, n);
  const std::vector<char> for_backward = forwards_for_backward(schedule, n);
  const auto x_bytes = [&](std::size_t k) {
    return k < un ? chain.blocks[k].input_bytes : chain.output_bytes;
  };

  std::vector<char> held(un + 1, 0), saved(un, 0);
  held[0] = 1;
  std::int64_t gradient = 0;  // bytes of the gradient in flight (0 before the head)
  bool head_ran = false;
  const auto in_use = [&] {
    std::int64_t b = gradient;
    for (std::size_t k = 0; k <= un; ++k) {
      const bool kept_by_block = k < un && saved[k] && chain.blocks[k].saves_input;
      if (held[k] || kept_by_block) b += x_bytes(k);
      if (k < un && saved[k]) b += chain.blocks[k].saved_bytes;
    }
    return b;
  };

  SimulateResult r;
  r.peak_bytes = in_use();
  const auto& ops = schedule.ops();
  for (std::size_t j = 0; j < ops.size(); ++j) {
    const ScheduleOp& op = ops[j];
    const auto i = static_cast<std::size_t>(op.block);
    const ChainBlock& b = chain.blocks[i];
    if (op.kind == ScheduleOp::Kind::kForward) {
      const std::int64_t during =
          in_use() + x_bytes(i + 1) + b.fwd_workspace + (op.keep == Keep::kAll ? b.saved_bytes : 0);
      r.peak_bytes = std::max(r.peak_bytes, during);
      r.compute_time += for_backward[j] ? b.for_backward_time() : b.fwd_time;
      if (op.keep == Keep::kAll) saved[i] = 1;
      if (op.keep != Keep::kInput) held[i] = 0;
      if (needed[j]) held[i + 1] = 1;  // already held: the copy is dropped, same bytes
      if (op.block == n - 1 && !head_ran) {
        head_ran = true;
        r.peak_bytes = std::max(r.peak_bytes, in_use() + chain.head_bytes);
        r.compute_time += chain.head_time;
        held[un] = 0;
        gradient = chain.output_bytes;
      }
    } else {
      r.peak_bytes = std::max(r.peak_bytes, in_use() + b.input_bytes + b.bwd_workspace);
      r.compute_time += b.bwd_time;
      saved[i] = 0;
      held[i] = 0;
      held[i + 1] = 0;
      gradient = b.input_bytes;
    }
  }
  return r;
}

SolverResult solve_checkpoint(const Chain& chain, std::int64_t limit, std::string_view solver,
                              int slots) {
  check_chain(chain, "solve_checkpoint");
  if (slots < 1) {
    throw InvalidArgument("solve_checkpoint: slots = " + std::to_string(slots) +
                          "; valid: slots >= 1 (memory units of the optimal solver)");
  }
  const int n = static_cast<int>(chain.blocks.size());
  if (solver == "optimal") return optimal(chain, limit, slots, optimal_checkpoint_dp(chain, limit, slots));
  if (looks_like_op_list(solver)) return fixed(chain, limit, Schedule::parse(solver, n));
  try {
    return fixed(chain, limit, Schedule::parse(solver, n));
  } catch (const InvalidArgument&) {
    throw InvalidArgument("checkpoint solver '" + std::string(solver) +
                          "': unknown; valid: " + kValidSolvers);
  }
}

OptimalSolver::OptimalSolver(Chain chain, int slots) : chain_(std::move(chain)), slots_(slots) {
  check_chain(chain_, "OptimalSolver");
  if (slots < 1) {
    throw InvalidArgument("OptimalSolver: slots = " + std::to_string(slots) +
                          "; valid: slots >= 1 (memory units of the optimal solver)");
  }
}

OptimalSolver::~OptimalSolver() = default;

SolverResult OptimalSolver::solve(std::int64_t limit) {
  const auto solve_for = [&] {
    tables_.reset();  // its storage back to the pool first: the new tables may take it
    tables_ = std::make_unique<CheckpointDpTables>(chain_, limit, slots_);
  };
  // Below 3/4 of the solved limit the first unit leaves fewer than 3/4 of the slots: solve
  // again rather than lose that resolution.
  if (!tables_ || limit > tables_->limit() || limit < tables_->limit() / 4 * 3) solve_for();
  SolverResult r = optimal(chain_, limit, slots_, tables_->at(limit));
  if (!r.feasible && tables_->limit() != limit) {
    // The first unit's rounding may hide a schedule that the limit's own finer unit finds.
    solve_for();
    r = optimal(chain_, limit, slots_, tables_->at(limit));
  }
  return r;
}

std::vector<std::string> checkpoint_solver_names() { return {"none", "all", "sqrt", "optimal"}; }

}  // namespace memfit
