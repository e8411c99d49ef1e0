#include "core/schedule.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <system_error>

#include "memory/error.h"

namespace memfit {

namespace {

// Appended, not "B" + std::to_string(...): GCC 12 at -O3 warns -Wrestrict (falsely) there.
std::string op_str(const ScheduleOp& op) {
  const bool backward = op.kind == ScheduleOp::Kind::kBackward;
  std::string s = backward ? "B" : op.recompute ? "R" : "F";
  s += std::to_string(op.block);
  if (!backward) {
    s += ':';
    s += keep_name(op.keep);
  }
  return s;
}

void check_n(int n, const char* what) {
  if (n < 1) {
    throw InvalidArgument(std::string("Schedule::") + what + ": n = " + std::to_string(n) +
                          " blocks; valid: n >= 1");
  }
}

}  // namespace

const char* keep_name(Keep k) {
  switch (k) {
    case Keep::kAll:
      return "all";
    case Keep::kInput:
      return "input";
    case Keep::kNothing:
      return "nothing";
  }
  return "?";
}

Schedule Schedule::none(int n) {
  check_n(n, "none");
  std::vector<ScheduleOp> ops;
  ops.reserve(2 * static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) ops.push_back(ScheduleOp::forward(i, Keep::kAll));
  for (int i = n - 1; i >= 0; --i) ops.push_back(ScheduleOp::backward(i));
  return Schedule("none", std::move(ops));
}

Schedule Schedule::all(int n) {
  check_n(n, "all");
  std::vector<ScheduleOp> ops;
  ops.reserve(3 * static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) ops.push_back(ScheduleOp::forward(i, Keep::kInput));
  // The last block is recomputed too: checkpoint() wraps every block, the last included.
  for (int i = n - 1; i >= 0; --i) {
    ops.push_back(ScheduleOp::forward(i, Keep::kAll, true));
    ops.push_back(ScheduleOp::backward(i));
  }
  return Schedule("all", std::move(ops));
}

Schedule Schedule::every(int n, int k) {
  check_n(n, "every");
  if (k < 1) {
    throw InvalidArgument("Schedule::every: k = " + std::to_string(k) + "; valid: k >= 1");
  }
  std::vector<ScheduleOp> ops;
  const int last_start = ((n - 1) / k) * k;
  // Forward phase: a checkpointed segment's first block keeps its input, the rest nothing; the
  // last segment is not checkpointed (its backward follows the head at once, so recomputing it
  // would buy nothing), its forwards keep all.
  for (int i = 0; i < n; ++i) {
    const Keep keep = i >= last_start ? Keep::kAll : i % k == 0 ? Keep::kInput : Keep::kNothing;
    ops.push_back(ScheduleOp::forward(i, keep));
  }
  // Backward phase: the last segment's backwards, then each earlier segment, last first:
  // recompute it keeping all, then its backwards.
  for (int i = n - 1; i >= last_start; --i) ops.push_back(ScheduleOp::backward(i));
  for (int start = last_start - k; start >= 0; start -= k) {
    for (int i = start; i < start + k; ++i) ops.push_back(ScheduleOp::forward(i, Keep::kAll, true));
    for (int i = start + k - 1; i >= start; --i) ops.push_back(ScheduleOp::backward(i));
  }
  return Schedule("every:" + std::to_string(k), std::move(ops));
}

Schedule Schedule::sqrt_n(int n) {
  check_n(n, "sqrt_n");
  const int k = std::max(1, static_cast<int>(std::lround(std::sqrt(static_cast<double>(n)))));
  Schedule s = every(n, k);
  return Schedule("sqrt", s.ops());
}

namespace {

// One token of str()'s format: "F<i>:<keep>", "R<i>:<keep>" or "B<i>"; false if malformed.
bool parse_op(std::string_view tok, ScheduleOp& op) {
  if (tok.size() < 2 || (tok[0] != 'F' && tok[0] != 'R' && tok[0] != 'B')) return false;
  const char* end = tok.data() + tok.size();
  int block = 0;
  const auto r = std::from_chars(tok.data() + 1, end, block);
  if (r.ec != std::errc() || r.ptr == tok.data() + 1) return false;
  const std::string_view rest(r.ptr, static_cast<std::size_t>(end - r.ptr));
  if (tok[0] == 'B') {
    if (!rest.empty()) return false;
    op = ScheduleOp::backward(block);
    return true;
  }
  for (Keep k : {Keep::kAll, Keep::kInput, Keep::kNothing}) {
    if (rest.size() == 1 + std::string_view(keep_name(k)).size() && rest[0] == ':' &&
        rest.substr(1) == keep_name(k)) {
      op = ScheduleOp::forward(block, k, tok[0] == 'R');
      return true;
    }
  }
  return false;
}

// An explicit op list in str()'s format, validated for n.
Schedule parse_ops(std::string_view spec, int n) {
  std::vector<ScheduleOp> ops;
  std::size_t pos = 0;
  while (pos < spec.size()) {
    if (spec[pos] == ' ') {
      ++pos;
      continue;
    }
    const std::size_t end = std::min(spec.find(' ', pos), spec.size());
    const std::string_view tok = spec.substr(pos, end - pos);
    ScheduleOp op;
    if (!parse_op(tok, op)) {
      throw InvalidArgument("checkpoint schedule op list: token " + std::to_string(ops.size()) +
                            " '" + std::string(tok) +
                            "' is not an op; valid: F<i>:all|input|nothing (forward), R<i>:... "
                            "(recomputing forward), B<i> (backward), separated by spaces");
    }
    ops.push_back(op);
    pos = end;
  }
  Schedule s("ops", std::move(ops));
  s.validate(n);
  return s;
}

}  // namespace

Schedule Schedule::parse(std::string_view spec, int n) {
  check_n(n, "parse");
  // An op list as str() prints it ("F0:input F1:all ... B0"): a solver's schedule read back
  // from a plan file.
  const std::size_t first = std::min(spec.find_first_not_of(' '), spec.size());
  if (spec.size() >= first + 2 &&
      (spec[first] == 'F' || spec[first] == 'R' || spec[first] == 'B') && spec[first + 1] >= '0' &&
      spec[first + 1] <= '9') {
    return parse_ops(spec, n);
  }
  if (spec == "none") return none(n);
  if (spec == "all") return all(n);
  if (spec == "sqrt") return sqrt_n(n);
  constexpr std::string_view kEvery = "every:";
  if (spec.substr(0, kEvery.size()) == kEvery) {
    const std::string_view num = spec.substr(kEvery.size());
    int k = 0;
    const auto r = std::from_chars(num.data(), num.data() + num.size(), k);
    if (!num.empty() && r.ec == std::errc() && r.ptr == num.data() + num.size() && k >= 1) {
      return every(n, k);
    }
  }
  throw InvalidArgument("checkpoint schedule '" + std::string(spec) +
                        "': unknown; valid: none, all, sqrt, every:K (K an integer >= 1), or an op "
                        "list as Schedule::str() prints it (\"F0:input R0:all B0\")");
}

void Schedule::validate(int n) const {
  check_n(n, "validate");
  const auto fail = [&](std::size_t j, const std::string& what) {
    const std::string op = j < ops_.size() ? op_str(ops_[j]) : std::string("end");
    throw InvalidArgument("schedule '" + name_ + "' op " + std::to_string(j) + " (" + op +
                          "): " + what);
  };
  // The executor's state, simulated: held inputs, blocks holding saved state, the gradient.
  std::vector<char> held(static_cast<std::size_t>(n) + 1, 0);
  std::vector<char> saved(static_cast<std::size_t>(n), 0);
  std::vector<char> done(static_cast<std::size_t>(n), 0);
  held[0] = 1;
  bool head_ran = false;
  int next_backward = n - 1;
  for (std::size_t j = 0; j < ops_.size(); ++j) {
    const ScheduleOp& op = ops_[j];
    const int i = op.block;
    if (i < 0 || i >= n) {
      fail(j, "block " + std::to_string(i) + " out of range; valid: 0 to " + std::to_string(n - 1));
    }
    const auto u = static_cast<std::size_t>(i);
    if (op.kind == ScheduleOp::Kind::kForward) {
      if (done[u]) fail(j, "forward of block " + std::to_string(i) + " after its backward");
      if (!held[u]) {
        fail(j, "needs x[" + std::to_string(i) + "] (block " + std::to_string(i) +
                    "'s input), which is not held: no earlier forward kept it");
      }
      if (saved[u]) {
        // Layers refuse any forward while they hold saved state (core/layer.h).
        fail(j, "block " + std::to_string(i) +
                    " still holds saved state from an earlier forward keeping all; its backward "
                    "must run before it runs forward again");
      }
      held[u + 1] = 1;  // a superset of what the executor stores: it drops unread outputs
      if (op.keep == Keep::kAll) saved[u] = 1;
      if (op.keep != Keep::kInput) held[u] = 0;
      if (i == n - 1 && !head_ran) head_ran = true;
    } else {
      if (done[u]) fail(j, "duplicate backward of block " + std::to_string(i));
      if (!head_ran) {
        fail(j,
             "backward before the head has run (x[" + std::to_string(n) + "] was never computed)");
      }
      if (i != next_backward) {
        fail(j, "backward out of order: the gradient at x[" + std::to_string(i + 1) +
                    "] is not ready; the next backward must be B" + std::to_string(next_backward));
      }
      if (!saved[u]) {
        fail(j, "block " + std::to_string(i) +
                    " holds no saved state: it needs a forward keeping all since its last "
                    "backward");
      }
      saved[u] = 0;
      done[u] = 1;
      held[u] = 0;
      held[u + 1] = 0;
      --next_backward;
    }
  }
  if (next_backward >= 0) {
    fail(ops_.size(), "missing backward of block " + std::to_string(next_backward) +
                          " (every block's backward must run once, n-1 down to 0)");
  }
}

std::string Schedule::str() const {
  std::string s;
  for (const ScheduleOp& op : ops_) {
    if (!s.empty()) s += ' ';
    s += op_str(op);
  }
  return s;
}

std::int64_t Schedule::recomputed_forwards() const {
  std::int64_t r = 0;
  for (const ScheduleOp& op : ops_) {
    if (op.kind == ScheduleOp::Kind::kForward && op.recompute) ++r;
  }
  return r;
}

}  // namespace memfit
