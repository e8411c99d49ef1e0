// OffloadOptimizer: AdamW with FP32 master weights and Adam moments in pinned host memory,
// updated by the CPU (ZeRO-Offload's split: the device keeps only the working weights in the
// compute dtype and the FP32 gradients).
//
//   PinnedHostProvider pinned;                 // or a NullProvider: a dry run (below)
//   OffloadOptions o; o.adamw.lr = 3e-4;
//   OffloadOptimizer opt(model.parameters(), o, ctx, pinned);  // masters move to the host
//   ... executor hooks call opt.grads_ready(ctx, block params) in the last micro-batch ...
//   opt.step(ctx, 1.0 / scale);     // waits for the gradients, CPU AdamW, weights copied back
//
// Per step: each parameter's FP32 gradient is copied device -> host on a copy stream of its
// own as soon as grads_ready() reports it final, so the copies overlap the rest of the
// backward; step() waits for them (events, not device-wide syncs), runs the vectorized CPU
// AdamW (core/cpu/adamw.h: AVX-512 / AVX2+FMA / scalar, OpenMP over tiles) writing the
// updated weights rounded to the compute dtype into a host staging buffer, and copies them
// back to Parameter::weight on the copy stream; the compute stream waits on that copy's event
// before the next forward reads the weights. On the CPU backend the copy stream is a worker
// thread (CpuBackend's worker streams), so the overlap is real and measurable.
// The arithmetic is core/adamw.h's, so with delayed_update off the results are bit-identical
// to DeviceAdamW (tests check it).
// delayed_update (ZeRO-Offload's one-step delayed parameter update, DPU): step() starts the
// CPU update of step t in the background and returns; its weights are copied back at the start
// of step t+1's optimizer call, so step t+1's forward and backward use the weights of step
// t-1. This changes the math (a stale-by-one update); the paper reports no loss in accuracy
// after the first few steps. Off by default.
// Memory: host (pinned, outside the device budget): 12 bytes per parameter (master, m, v) +
// 4 (gradient staging) + the working dtype's size (weight staging; none for f32 weights, which
// are copied back straight from the masters: 16 bytes then), within OffloadOptions::host_budget
// when one is set. Device: nothing beyond the Parameters' weight and grad (their masters are
// released at construction; under gradient offload the grads too, replaced by the GradRing's
// buckets; under weight offload the weights, replaced by the WeightRing's buffers). A parameter
// listed twice is an InvalidArgument. State names: master/<name>, exp_avg/<name>,
// exp_avg_sq/<name> (DeviceAdamW names an f32 model's master weight/<name>).
// Gradient offload (OffloadOptions::gradients): the gradient region of the slab becomes the
// gradients themselves, summed over the step's micro-batches exactly as the device would
// (GradRing), so the step waits only for the last stages' copies; the loss scaler's inf/NaN
// check reads them there (grads_nonfinite()). Bit-identical to resident gradients.
// Weight offload (OffloadOptions::weights): the working weights live on the host too (the
// weight staging, or the masters for f32: no more host bytes), and a WeightRing
// (policies/offload_weight_ring.h) lends each use of a unit device copies from `weight_buffers`
// buffers; step() writes the updated weights there instead of copying them back. Bit-identical
// to resident weights. Not with delayed_update (the update in flight would rewrite the weights
// the next step's fetches read): InvalidArgument.
// Host masters: the constructor binds each Parameter::host_master to its slab slice, so
// Model::init() writes a fresh model's FP32 values there directly (no device master needed,
// ever); the destructor unbinds them.
// Dry runs: over a host provider of MemoryKind::kNone (NullProvider) the slab is an address
// range only, so the optimizer makes the same allocations, copies and events on the (meta)
// backend but never reads or writes host memory: no moment zeroing, no widening of masters, no
// CPU AdamW. host_by_category() is then what a real run would pin.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/model.h"
#include "core/optimizer.h"
#include "memory/provider.h"
#include "policies/offload_grad_ring.h"    // kDefaultGradBuckets
#include "policies/offload_weight_ring.h"  // kDefaultWeightBuffers

namespace memfit {

struct OffloadOptions {
  AdamWOptions adamw;
  bool delayed_update = false;
  int threads = 0;  // CPU AdamW threads; 0 = OpenMP's default
  // Gradient offload (policies/offload_grad_ring.h): the gradients live in the host slab's
  // gradient region, streamed out stage by stage through `grad_buckets` device buckets
  // (1: no refill ahead; 2, the default: each stage's copies overlap the next stage's
  // backward). `stages` is the model's backward_stages(); the trainer calls before_stage() and
  // after_stage() around each stage in every micro-batch. Device gradients the parameters
  // still have are released (build the model with ParamPlacement{.grad = false} to never make
  // them).
  bool gradients = false;
  int grad_buckets = kDefaultGradBuckets;
  std::vector<Model::BackwardStage> stages;
  // Weight offload (policies/offload_weight_ring.h): `units` is the model's weight_units(); the
  // trainer calls before_use() and after_use() around every use. Device weights the parameters
  // still have are released (build the model with ParamPlacement{.weight = false} to never
  // make them).
  bool weights = false;
  int weight_buffers = kDefaultWeightBuffers;
  std::vector<std::vector<Parameter*>> units;
  // Pinned host bytes the slab may take (0: no limit): a larger slab is an OutOfMemory with
  // OomInfo::host set, before anything is pinned.
  std::size_t host_budget = 0;
};

class OffloadOptimizer final : public Optimizer {
 public:
  // Moves each parameter's master (or, for f32 weights, a copy of them) to pinned host memory
  // from `host` (a PinnedHostProvider; a NullProvider for a dry run), which must outlive the
  // optimizer, and resets Parameter::master.
  OffloadOptimizer(std::vector<Parameter*> params, OffloadOptions options, LayerContext& ctx,
                   MemoryProvider& host);
  ~OffloadOptimizer() override;

  const char* name() const override { return "offload-adamw"; }
  void grads_ready(LayerContext& ctx, const std::vector<Parameter*>& params) override;
  void before_stage(LayerContext& ctx, int stage, int micro_batch, int count) override;
  void after_stage(LayerContext& ctx, int stage, int micro_batch, int count) override;
  void before_use(LayerContext& ctx, int unit, int next) override;
  void after_use(LayerContext& ctx, int unit) override;
  // Gradient offload: waits for the gradients' copies and reads them on the host: the sum of
  // squares of the finite elements and whether any is inf/NaN (zero and false in a dry run),
  // summed exactly as the CPU backend's sumsq sums the device's gradients (the same bits
  // whatever the thread count). The loss scaler's check and gradient clipping read it.
  // Without gradient offload: InvalidArgument (the device's, grads_sumsq in
  // policies/loss_scaler.h, applies).
  SumSqResult grads_sumsq(LayerContext& ctx);
  bool grads_nonfinite(LayerContext& ctx) { return grads_sumsq(ctx).nonfinite; }
  // A step that failed, before or after its last micro-batch's gradients were reported: the
  // copies in flight are waited for and every lent gradient and weight is taken back; nothing
  // else changes: the step before's delayed update stays in flight, unlanded (skip() lands it).
  void abandon_step(LayerContext& ctx);
  // Device bytes of the gradient ring (0 without gradient offload) and of the weight ring (0
  // without weight offload).
  std::size_t grad_device_bytes() const;
  std::size_t weight_device_bytes() const;
  const WeightRing* weight_ring() const;  // null without weight offload
  void step(LayerContext& ctx, double grad_scale) override;
  void skip(LayerContext& ctx) override;
  // Waits for a delayed update in flight and copies its weights back (before a save, or at
  // the end of training). No-op otherwise.
  void flush(LayerContext& ctx) override;

  std::int64_t steps() const override;
  void set_steps(std::int64_t steps) override;
  std::vector<StateTensor> state() override;  // master/<name>, exp_avg/<name>, exp_avg_sq/<name>
  void state_loaded(LayerContext& ctx) override;
  const AdamWOptions& options() const override;
  void set_lr(double lr) override;

  // Pinned bytes held: masters and moments (optimizer state), gradients, and the staged
  // weights (parameter). Each part is a HostRegion (profiler/host_region.h) unless dry.
  CategoryBytes host_by_category() const override;
  // Seconds the last step() spent waiting for gradient copies, in CPU AdamW, and copying
  // weights back (measured on the host clock): what the overlap hides shows as a small wait.
  struct Timing {
    double wait_grads_s = 0, adamw_s = 0, copy_back_s = 0;
  };
  Timing last_timing() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memfit
