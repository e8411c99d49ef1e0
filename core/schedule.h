// Schedule: the order in which an Executor runs the forward and backward passes of a chain of
// n blocks, and what each forward keeps: the unit every checkpointing policy produces.
//
//   Schedule s = Schedule::every(12, 3);     // keep the input of blocks 0, 3, 6; 9-11 keep all
//   s.validate(12);                          // InvalidArgument naming the first bad op
//   std::cout << s.str();                    // "F0:input F1:nothing ... F9:all ... B9 R6:all ..."
//
// The executor's state is which block inputs x[0..n] it holds (x[0] is the embedding's output,
// x[n] the head's input) and which blocks hold their saved internals. The ops:
//   Forward(i, keep): needs x[i], and block i holding no saved state (layers refuse a forward
//     then) and its backward not yet run. Runs block i; stores its output x[i+1] unless already
//     held (a recomputation reproduces the same bits, so the copy is dropped) or no later op
//     reads it (a later Forward(i+1), or the head when i = n-1 and it has not run). Then
//       kAll:     block i saves what its backward needs (it holds x[i] itself if it needs it);
//                 the executor's own x[i] slot is dropped.
//       kInput:   x[i] stays held (a checkpoint); block i saves nothing.
//       kNothing: x[i] is dropped; block i saves nothing.
//     `recompute` marks forwards run during the backward phase (reports and flop counts).
//   The head (final LayerNorm, output projection, loss) runs as soon as x[n] is first held,
//   keeping all it needs; its backward then starts the gradient at x[n].
//   Backward(i): needs block i saved (a kAll forward since its last backward) and the
//     gradient at x[i+1]; produces the gradient at x[i] and frees block i's saved state; x[i]
//     and x[i+1] are dropped (no valid later op reads them).
// A valid schedule runs each Backward(i) exactly once, for i = n-1 down to 0, after the head,
// and every op's needs are met when it runs. Any valid schedule gives bit-identical losses and
// gradients (layers are deterministic); only memory and time differ.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace memfit {

enum class Keep : std::uint8_t { kAll, kInput, kNothing };
const char* keep_name(Keep k);  // "all", "input", "nothing"

struct ScheduleOp {
  enum class Kind : std::uint8_t { kForward, kBackward };
  Kind kind = Kind::kForward;
  int block = 0;
  Keep keep = Keep::kAll;  // forwards only
  bool recompute = false;  // forwards only

  static ScheduleOp forward(int block, Keep keep, bool recompute = false) {
    return {Kind::kForward, block, keep, recompute};
  }
  static ScheduleOp backward(int block) { return {Kind::kBackward, block, Keep::kAll, false}; }
  bool operator==(const ScheduleOp& o) const = default;
};

class Schedule {
 public:
  Schedule() = default;
  Schedule(std::string name, std::vector<ScheduleOp> ops)
      : name_(std::move(name)), ops_(std::move(ops)) {}

  // No checkpointing: every forward keeps all.
  static Schedule none(int n);
  // Every block checkpointed, the last included: forwards keep only their input; before
  // Backward(i), Forward(i) is recomputed keeping all (torch.utils.checkpoint on each block, as
  // Hugging Face gradient checkpointing does). n recomputed forwards.
  static Schedule all(int n);
  // Segments of k blocks from block 0 (the last one holds the n % k left over, if any), as
  // torch.utils.checkpoint_sequential runs them: every segment but the last is checkpointed
  // (its first block keeps its input, the others nothing; its backward recomputes its forwards
  // keeping all, then runs its backwards); the last segment's forwards keep all and its
  // backwards follow the head directly, with nothing recomputed. every(6, 2):
  //   F0:input F1:nothing F2:input F3:nothing F4:all F5:all B5 B4 R2:all R3:all B3 B2 R0:all
  //   R1:all B1 B0
  // So every(n, 1) is not all(n) (its last block is not recomputed), and k >= n is a single
  // segment: the ops of none(n), under the name "every:K".
  static Schedule every(int n, int k);
  // every(n, round(sqrt(n))), at least 1: about sqrt(n) segments, the last not recomputed.
  static Schedule sqrt_n(int n);
  // "none", "all", "sqrt", "every:K" (K >= 1), or an explicit op list in str()'s format
  // ("F0:input F1:all B1 R0:all B0", named "ops", validated for n: how a solver's schedule is
  // written into a plan file and read back). InvalidArgument listing these otherwise.
  static Schedule parse(std::string_view spec, int n);

  // Throws InvalidArgument "schedule '<name>' op <j> (<op>): <what is wrong>" when the schedule
  // is not valid for n blocks (see above).
  void validate(int n) const;

  const std::string& name() const { return name_; }
  const std::vector<ScheduleOp>& ops() const { return ops_; }
  std::string str() const;  // "F0:all F1:input R1:all B1 B0" (R = recomputing forward)
  std::int64_t recomputed_forwards() const;

 private:
  std::string name_;
  std::vector<ScheduleOp> ops_;
};

}  // namespace memfit
