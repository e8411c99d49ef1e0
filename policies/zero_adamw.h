// ZeroAdamW: AdamW on the device with its state sharded over data-parallel ranks, ZeRO stage 1
// or 2 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", 2020). Each parameter is cut into Communicator chunks (core/comm/communicator.h:
// chunk r of its flattened elements belongs to rank r); each rank updates its own chunk of
// every parameter and the ranks all-gather the working weights.
//
//   ZeroAdamW opt(model.parameters(), adamw, /*stage=*/2, model.backward_stages(), comm, ctx);
//   ... Trainer::step drives before_stage/after_stage and step()/skip() ...
//
// Stage 1: the FP32 masters (16-bit compute; with f32 the weight is its own master) and both
// Adam moments exist for this rank's chunks only: K = 12 bytes per parameter becomes 12 / N.
// The gradients are whole on every rank (ParamPlacement::grad); in the last micro-batch, as
// each backward stage's gradients become final, they are reduce-scattered in place (the sum of
// chunk r over ranks lands in chunk r of rank r's gradient; the other chunks are stale).
// Stage 2: the gradients are sharded too. The model has none of its own (ParamPlacement::grad
// false); before each backward stage the parameters it writes get a whole gradient from the
// caching allocator, zeroed (a tied wte keeps its one from the first stage writing it to the
// last); after the stage the final ones are reduce-scattered into this rank's FP32 gradient
// shard (the first micro-batch writes it, later ones add to it) and handed back. No rank holds
// more than its shards plus the gradients of the stages in flight.
// Overlap (policies/stage_overlap.h, on unless set_overlap(false)): a stage's reduce-scatters
// are started after its backward and finished after the next stage's, so they run beside it;
// what waits for them (stage 2 hands the gradient back and adds a later micro-batch's sum,
// offload sends the chunk to the host) runs then. Stage 2 thus holds two stages' gradients at
// the turn of a stage, and the dry run holds them at the same points.
// Memory, from ctx.alloc, tagged with the parameter's name: master shards
// ("master/<name>", Category::kOptimizerState), moments ("exp_avg/<name>", "exp_avg_sq/<name>",
// kOptimizerState), stage 2's gradient shards ("grad_shard/<name>", kGradient), all made at
// construction; the lent whole gradients (kGradient) and a later micro-batch's received sums
// (kTemporary) during the backward.
// step(): Backend::adamw on each chunk (the same arithmetic as DeviceAdamW, so at one rank the
// same bits), the rounded working chunk written beside its master, then one all_gather per
// parameter rebuilds every rank's whole working weights.
// Reduction order: the communicator's (rank order, float32); across micro-batches under stage 2
// each micro-batch's sum over ranks is added to the shard in micro-batch order.
// grads_sumsq(): the sum of squares of this rank's gradient chunks, summed over ranks in rank
// order (in double), and whether any rank saw inf/NaN: the same figures on every rank.
// state(): this rank's chunks ("master/<name>" or "weight/<name>" for f32, the moments): a
// state file of one rank.
// With optimizer offload (ZeRO-Offload's multi-rank form: `host` given), each rank's chunks of
// the FP32 masters and moments live in pinned host memory and the CPU AdamW updates them: an
// OffloadOptimizer (policies/offload_optimizer.h) runs over one stand-in Parameter per chunk
// (its weight a view of this rank's chunk of the device weight, its gradient this rank's
// reduced chunk), so the chunk's gradient goes device -> host as soon as it is final and the
// updated weight chunk comes back before the all_gather. Not with gradient or weight offload
// or the delayed update (InvalidArgument). State names are the OffloadOptimizer's.
// Contract: core/optimizer.h. Not thread-safe.
#pragma once

#include <memory>
#include <vector>

#include "core/backend.h"  // SumSqResult
#include "core/comm/communicator.h"
#include "core/model.h"
#include "core/optimizer.h"
#include "memory/provider.h"
#include "policies/offload_optimizer.h"
#include "policies/stage_overlap.h"

namespace memfit {

class ZeroAdamW final : public Optimizer {
 public:
  // stage 1 or 2. `stages`: Model::backward_stages() (stage 2 lends and collects the gradients
  // by them; stage 1 reduce-scatters each stage's final gradients). Parameters as Model
  // allocates them for Trainer::placement(policy, stage): no device masters; stage 2 no device
  // gradients, stage 1 whole ones. InvalidArgument otherwise.
  ZeroAdamW(std::vector<Parameter*> params, AdamWOptions options, int stage,
            std::vector<Model::BackwardStage> stages, Communicator& comm, LayerContext& ctx);
  // The same with optimizer offload: `offload` (its adamw, threads and host_budget; no
  // gradients, weights or delayed update) over pinned memory from `host`.
  ZeroAdamW(std::vector<Parameter*> params, const OffloadOptions& offload, int stage,
            std::vector<Model::BackwardStage> stages, Communicator& comm, LayerContext& ctx,
            MemoryProvider& host);
  ~ZeroAdamW() override;

  const char* name() const override;
  void grads_ready(LayerContext& ctx, const std::vector<Parameter*>& params) override;
  void before_stage(LayerContext& ctx, int stage, int micro_batch, int count) override;
  void after_stage(LayerContext& ctx, int stage, int micro_batch, int count) override;
  void step(LayerContext& ctx, double grad_scale) override;
  void skip(LayerContext& ctx) override;
  void flush(LayerContext& ctx) override;
  // A step that failed part-way: gradients lent are handed back, offload's copies in flight
  // waited for; nothing else changes.
  void abandon_step(LayerContext& ctx);
  CategoryBytes host_by_category() const override;
  std::int64_t steps() const override { return offload_ ? offload_->steps() : steps_; }
  void set_steps(std::int64_t steps) override;
  std::vector<StateTensor> state() override;
  void state_loaded(LayerContext& ctx) override;
  const AdamWOptions& options() const override { return options_; }
  void set_lr(double lr) override;

  // The step's gradients over every rank (see above). Zero and false on the meta backend.
  SumSqResult grads_sumsq(LayerContext& ctx);
  int stage() const { return stage_; }
  Communicator& comm() { return comm_; }
  // Whether a stage's sums finish after the next stage (true, the default) or at once
  // (TrainerOptions::overlap_comm); set before the first step.
  void set_overlap(bool on);

 private:
  Tensor grad_chunk(std::size_t i) const;  // this rank's reduced gradient of params_[i]
  void release_lent();
  void build(LayerContext& ctx, std::vector<Model::BackwardStage> stages);
  void gather_weights(LayerContext& ctx);
  // Offload: this rank's reduced chunks of params_[done...] to the host optimizer.
  void send_chunks(LayerContext& ctx, const std::vector<std::size_t>& done);

  std::vector<Parameter*> params_;
  AdamWOptions options_;
  int stage_;
  std::vector<std::vector<std::size_t>> opens_;   // per stage: params_ first written there
  std::vector<std::vector<std::size_t>> finals_;  // per stage: params_ final after it
  Communicator& comm_;
  std::vector<OwnedTensor> master_, exp_avg_, exp_avg_sq_, grad_shard_;  // per parameter
  std::int64_t steps_ = 0;  // without offload (the OffloadOptimizer counts its own)
  // Optimizer offload: a stand-in per parameter (this rank's chunk) and the host optimizer.
  std::vector<std::unique_ptr<Parameter>> chunks_;
  std::unique_ptr<OffloadOptimizer> offload_;
  StageOverlap overlap_;  // the sums in flight and what waits for them
  StreamId stream_ = kDefaultStream;  // the step's stream (the destructor's abandon orders it)
};

}  // namespace memfit
