// Executor: runs one micro-batch of a Model (forward, loss, backward) in the order a Schedule
// gives, holding activations only as long as the schedule says.
//
//   Executor ex(model, ctx);
//   MicroBatch mb{tokens, targets};                      // (B,T) int32 on ctx's device
//   Schedule s = Schedule::every(model.num_blocks(), 2);
//   Act losses = ex.run(s, mb, /*dloss=*/scale / rows);  // grads +=; losses (B*T) f32
//   double sum = sum_losses(ctx, *losses);               // host copy + sum (0 on meta)
//
// run() validates the schedule for the model, embeds, interprets the ops (core/schedule.h),
// runs the head when x[n] is first held, the backwards, and the embedding's backward last. On
// any exception (OutOfMemory included) every activation and every layer's saved state is
// released before it propagates, so the allocator holds only what it held before the call
// plus whatever the gradients received (the trainer zeroes them at the next step) — the
// parameters are never written by run().
// Hooks let a caller act around each stage's backward (an offloading optimizer lends gradient
// memory before it and starts copying the gradients after it while the remaining backwards
// run) and around each use of a unit's weights (weight offload fetches them before it, one use
// ahead, and takes them back after), and around each checkpoint (activation offload copies it
// to the host after the forward that keeps it and fetches it back before the recompute that
// reads it); they run on the calling thread. After an exception, checkpoints a stash hook took
// are the hook owner's to drop.
// forward_only() computes the losses without saving anything (evaluation, dry runs of
// inference). The same code runs on every backend, meta included (the planner's dry run).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/layer.h"
#include "core/model.h"
#include "core/schedule.h"

namespace memfit {

struct MicroBatch {
  IndexTensor tokens;   // (B,T) int32, ids in [0, vocab)
  IndexTensor targets;  // (B,T) int32, ids in [0, vocab)
};

// Around each backward stage, numbered as Model::backward_stages() numbers them (0: the head,
// 1 + k: block n-1-k, n + 1: the embedding, the last). before_stage(s) runs just before the
// stage's backward writes its gradients (a gradient-offloading optimizer lends them memory
// there); after_stage(s) once its backward is queued (its gradients are complete for this
// micro-batch).
// Weight units are numbered as Model::weight_units() numbers them (0: the embedding, 1 + i:
// block i, n + 1: the head). A use is a run of consecutive ops on one unit (the head's forward
// and backward; a recompute and the backward right after it): before_use(u, next) runs before
// its first op reads the weights, with the unit of the use after it (-1 for the last), and
// after_use(u) once its last op is queued. The uses of a run() are weight_uses(schedule, n),
// of a forward_only() 0, 1, ..., n + 1.
// A checkpoint is a block input x[i] that a Keep::kInput forward keeps for a later forward of
// block i (its recomputation). Once that forward is queued, stash(i, x) may take the handle
// (activation offload copies it to the host; x is left null then; one it leaves is held as
// before). Before the next op that reads a taken x[i], unstash(i, next) gives back a device
// tensor with the same bits; `next` is the checkpoint unstashed after this one (-1: none), so
// it can be fetched ahead. The reads of a run() are checkpoint_reads(schedule, n). Both hooks
// or neither.
struct ExecutorHooks {
  std::function<void(int stage)> before_stage;
  std::function<void(int stage)> after_stage;
  std::function<void(int unit, int next)> before_use;
  std::function<void(int unit)> after_use;
  std::function<void(int slot, Act& x)> stash;
  std::function<Act(int slot, int next)> unstash;
};

// The weight units in the order run() uses them for this schedule on n blocks, consecutive
// repeats merged. The schedule must be valid for n.
std::vector<int> weight_uses(const Schedule& schedule, int n);

// The checkpoints (x indices) in the order run() reads them back after keeping them, one entry
// per read: every:2 on 6 blocks gives {2, 0} (its last segment, blocks 4 and 5, keeps all),
// all on 3 blocks {2, 1, 0}, none {}. The distinct entries are the slots an activation stash
// needs. The schedule must be valid for n.
std::vector<int> checkpoint_reads(const Schedule& schedule, int n);

// For each op of the schedule: whether a forward's output x[i+1] is read later (by a forward of
// block i+1, or by the head when i+1 == n and the head has not run); 0 for backwards. run()
// stores only outputs read later (and not already held). The schedule must be valid for n.
std::vector<char> outputs_read_later(const Schedule& schedule, int n);

// For each op: whether run() runs it as Layer::forward_for_backward, a forward keeping all
// whose output it does not store (read by nothing later, or already held): a block recomputed
// right before its backward. The cost model and the checkpoint solvers price such a forward at
// LayerCost::flops_for_backward. The schedule must be valid for n.
std::vector<char> forwards_for_backward(const Schedule& schedule, int n);

// What the last run() did; counters for tests and reports.
struct ExecutorStats {
  std::int64_t forwards = 0;     // block forwards, recomputations included
  std::int64_t recomputes = 0;   // block forwards marked recompute
  std::int64_t backwards = 0;
  std::int64_t max_held_inputs = 0;  // most x[i] slots held at once (stashed ones included)
  std::int64_t stashed = 0;          // checkpoints the stash hook took
};

class Executor {
 public:
  Executor(Model& model, LayerContext ctx);

  Act run(const Schedule& schedule, const MicroBatch& mb, float dloss,
          const ExecutorHooks& hooks = {});
  Act forward_only(const MicroBatch& mb, const ExecutorHooks& hooks = {});

  const ExecutorStats& stats() const { return stats_; }
  LayerContext& context() { return ctx_; }

 private:
  Model& model_;
  LayerContext ctx_;
  ExecutorStats stats_;
};

// Sum of a losses tensor (f32 on ctx's device) in double, in index order: copies it to the
// host and synchronizes ctx.stream. Returns 0 on the meta backend.
double sum_losses(LayerContext& ctx, const Tensor& losses);

}  // namespace memfit
