// Trainer: the library API that wraps a training loop and applies a MemoryPolicy to it
// (policies/policy.h: activation/weight dtype, checkpointing, micro-batch and gradient
// accumulation, offload switches), with dynamic loss scaling for f16.
//
// Most programs get one from RunSetup (policies/run_setup.h), which builds the backend, the
// budgeted allocator and the model for it exactly as `memfit train` does:
//   RunSetup run(spec);                              // spec: model, policy, batch, budget, ...
//   for (...) run.step(dataset.sample(16, 128, run.trainer().rng()));
// By hand, over a backend and allocator of your own:
//   LayerContext ctx{be, alloc, kDefaultStream, DType::kBF16};
//   Model model(ModelSpec::preset("gpt-tiny"), ctx);
//   TrainerOptions opt;
//   opt.policy.dtype = DType::kBF16;                 // must be the context's dtype
//   opt.policy.checkpoint = Checkpointing::every(2);
//   opt.policy.micro_batch = 4; opt.policy.offload.optimizer = true; opt.adamw.lr = 3e-4;
//   Trainer trainer(model, ctx, opt);                // initializes the model from opt.seed
//   StepResult r = trainer.step(batch);              // r.loss, r.skipped, r.peaks
//   trainer.save("run.mfstate");                     // policies/train_state.h
//
// step(batch): splits the batch into micro-batches (MemoryPolicy::micro_batches), zeroes the
// gradients, runs the Executor on each micro-batch with the schedule (the loss gradient
// scale / (B * T) for every one), checks the gradients for inf/NaN when the loss scaler is
// enabled (f16 by default) or clipping is on, clips them, steps or skips the optimizer,
// updates the scaler.
// Gradient clipping (options.max_grad_norm > 0), as PyTorch's clip_grad_norm_ (L2): the global
// norm of the unscaled gradients is sqrt(sum of squares) / loss scale, from the one sumsq pass
// the inf/NaN check makes (on the device, or on the host under gradient offload:
// OffloadOptimizer::grads_sumsq); when it is above max_grad_norm the optimizer's grad_scale is
// multiplied by max_grad_norm / (norm + 1e-6), which scales every gradient as clipping them in
// place would. A step whose norm is not finite is skipped, as the loss scaler skips one.
// r.grad_norm says the norm (0 when neither the scaler nor clipping asked for it). Peaks are the
// allocator's, reset at the start of the step (r.peaks: PeakFigures, with the pinned host
// bytes the optimizer holds). An exception during a step (an OutOfMemory above all) leaves
// parameters, optimizer state, scaler and step count as they were before it; the trainer
// stays usable (try a smaller micro-batch). Under the delayed update that includes the update
// in flight: the previous step's stays unlanded, and the next step's optimizer call lands it,
// as it would have without the failure (tests/policies/trainer_oom_test.cpp fails every
// allocation of a step in turn, under every policy).
// The optimizer is built before init(): an offloading one binds pinned host masters that the
// initialization writes directly (core/model.h). Gradient offload (policy.offload.gradients)
// runs the executor's stage hooks into the optimizer in every micro-batch and checks the loss
// scaler's inf/NaN on the host; weight offload (policy.offload.weights) its use hooks, in
// evaluate() too. Activation offload (policy.offload.activations, under a schedule with
// checkpoints) runs the executor's stash hooks into an ActivationStash
// (policies/offload_activation_stash.h) whose host room for the step's checkpoints is reserved
// at the step's start, within options.host_budget beside the optimizer's slab; the room stays
// for later steps (host_bytes() and StepResult::peaks.host_pinned count it once reserved).
// placement(policy, zero_stage) is the ParamPlacement a model for the policy is built with
// (no device weights, masters or gradients that the policy offloads or ZeRO shards). options.host_budget
// limits the pinned bytes (an OutOfMemory with OomInfo::host before anything is pinned).
// Offload's pinned host memory comes from `host` when given (it must outlive the trainer; a
// NullProvider in dry runs), else from a PinnedHostProvider the trainer owns (page-locked
// through the CUDA driver for a model on a GPU, mlock otherwise).
// The same Trainer runs on the meta backend for dry runs (policies/dry_run.h): its
// set_repeat_check() lets a dry run skip full micro-batches that would repeat the allocator's
// state exactly (meta backend only; a real run would lose their gradients).
// Not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/executor.h"
#include "core/optimizer.h"
#include "core/rng.h"
#include "core/text_dataset.h"  // Batch
#include "memory/peak_figures.h"
#include "memory/provider.h"
#include "policies/loss_scaler.h"
#include "policies/offload_grad_ring.h"    // kDefaultGradBuckets
#include "policies/offload_weight_ring.h"  // kDefaultWeightBuffers
#include "policies/policy.h"
#include "policies/train_state.h"

namespace memfit {

struct TrainerOptions {
  MemoryPolicy policy;              // policy.dtype: the context's (and model's) dtype
  AdamWOptions adamw;
  LossScalerOptions scaler;         // scaler.enabled is forced off unless the dtype is f16...
  bool scaler_auto = true;          // ...when scaler_auto (default): on for f16, off otherwise
  std::uint64_t seed = 1337;        // model initialization and the trainer's Rng
  int grad_buckets = kDefaultGradBuckets;  // gradient offload's device bucket ring (OffloadOptions)
  int weight_buffers = kDefaultWeightBuffers;  // weight offload's device buffer ring
  std::size_t host_budget = 0;                 // pinned host bytes offload may take (0: no limit)
  bool init_model = true;           // false: keep the model's current weights
  double max_grad_norm = 0;         // gradient clipping's L2 bound (0: off; finite, >= 0)
  // Data parallel over comm's ranks (ZeRO-0: every rank holds the whole model and optimizer).
  // Each rank's step() gets its own shard of the global batch, the same number of samples on
  // every rank; the loss gradient is scale / (global B * T), each stage's final gradients are
  // summed over ranks (Communicator::all_reduce_sum, in rank order) in the last micro-batch as
  // its backward completes, before the optimizer sees them, and StepResult::loss and tokens
  // are the global batch's. Every rank initializes from the same seed and applies the same
  // update, so the weights stay identical. nullptr or one rank: a single-rank run. Must
  // outlive the trainer. A dry run simulates one rank with a SimulatedCommunicator.
  Communicator* comm = nullptr;
  // ZeRO stage over comm's ranks (policies/zero_adamw.h): 0 (above), 1 (FP32 masters and Adam
  // moments sharded by rank: each rank updates its chunk of every parameter, then the ranks
  // all-gather the working weights; the last micro-batch's gradients are reduce-scattered
  // instead of all-reduced) or 2 (gradients sharded too: reduce-scattered per backward stage in
  // every micro-batch). 1 and 2 work at one rank too (comm nullptr: the trainer's own local
  // communicator). With optimizer offload each rank's chunks of the masters and moments live
  // in its pinned host memory, updated by the CPU AdamW (ZeRO-Offload's multi-rank form); not
  // with gradient or weight offload or the delayed update yet. Build the model with
  // placement(policy, zero_stage).
  int zero_stage = 0;
  // Several ranks: each backward stage's gradient sums (ZeRO-0's all-reduce, ZeRO-1/2's
  // reduce-scatter) run beside the next stage's backward and are finished after it
  // (policies/stage_overlap.h), so they hold their gradients one stage longer; false: each
  // stage's sums finish before the next stage starts. The dry run follows the same choice.
  // Not with gradient or weight offload (their device buckets are a ring the next stage
  // refills): there the sums finish stage by stage whatever this says.
  bool overlap_comm = true;
};

struct StepResult {
  std::int64_t step = 0;       // 1-based number of this step
  double loss = 0;             // mean over the (global) batch's B*T rows (0 on the meta backend)
  double loss_scale = 1;       // the scale this step's gradients carried
  bool skipped = false;        // inf/NaN gradients: no update
  double grad_norm = 0;        // global L2 norm of the unscaled gradients (0: not computed)
  bool clipped = false;        // grad_norm was above max_grad_norm: the update was scaled
  double seconds = 0;          // wall time of step()
  std::int64_t tokens = 0;     // B*T (of the global batch under data parallel)
  std::int64_t micro_batches = 0;
  PeakFigures peaks;           // the allocator's during the step; host_pinned: offload's bytes
};

class ActivationStash;
class OffloadOptimizer;
class ZeroAdamW;

class Trainer {
 public:
  Trainer(Model& model, LayerContext ctx, TrainerOptions options, MemoryProvider* host = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  StepResult step(const Batch& batch);
  double evaluate(const Batch& batch);  // mean loss, no gradients, nothing saved

  // Atomic; policies/train_state.h. `o` injects faults for tests.
  void save(const std::string& path, const SaveOptions& o = {});
  void load(const std::string& path);  // all or nothing

  std::int64_t steps() const;  // optimizer updates done (skipped steps not counted)
  std::int64_t steps_attempted() const;
  Rng& rng() { return rng_; }
  Model& model() { return model_; }
  Optimizer& optimizer() { return *optimizer_; }
  LossScaler& scaler() { return scaler_; }
  const TrainerOptions& options() const { return options_; }
  const Schedule& schedule() const { return schedule_; }
  LayerContext& context() { return ctx_; }
  // Pinned host bytes offload holds, by category: the optimizer's slab (optimizer state,
  // gradients, parameters) and the checkpoints' room (activations); none without offload.
  CategoryBytes host_by_category() const;
  std::size_t host_bytes() const { return total_bytes(host_by_category()); }

  // What a model trained under `policy` needs on the device: no masters with optimizer
  // offload, no gradients with gradient offload. Build the model with it (RunSetup and dry
  // runs do) and nothing is ever allocated on the device only to move to the host at setup.
  static ParamPlacement placement(const MemoryPolicy& policy, int zero_stage = 0);

  // The ranks this trainer runs over, its rank and ZeRO stage (one rank, rank 0 without a
  // communicator). Saved with the state; load() refuses a file saved under another ZeRO stage,
  // and under ZeRO-1/2 one saved by another rank or rank count.
  struct Sharding {
    int ranks = 1, rank = 0, zero_stage = 0;
  };
  Sharding sharding() const;

  // Dry runs (meta backend only: InvalidArgument otherwise). Called after each full
  // micro-batch but the last with its index; true skips the full micro-batches that follow
  // (the last micro-batch, uneven or not, still runs), because the caller saw the allocator
  // settle into a repeating state. StepResult::micro_batches still counts every one.
  using RepeatCheck = std::function<bool(std::int64_t micro_batch)>;
  void set_repeat_check(RepeatCheck check);

 private:
  struct Offload;
  Model& model_;
  LayerContext ctx_;
  TrainerOptions options_;
  Schedule schedule_;
  Rng rng_;
  LossScaler scaler_;
  std::unique_ptr<Offload> offload_;  // the owned pinned provider, when offloading without `host`
  // ZeRO at one rank without options.comm; outlives the optimizer that uses it.
  std::unique_ptr<Communicator> own_comm_;
  std::unique_ptr<Optimizer> optimizer_;
  OffloadOptimizer* offload_opt_ = nullptr;  // optimizer_, when it offloads
  ZeroAdamW* zero_opt_ = nullptr;            // optimizer_, under ZeRO-1/2
  std::unique_ptr<ActivationStash> stash_;   // activation offload under a checkpoint schedule
  std::int64_t attempted_ = 0;
  RepeatCheck repeat_check_;
};

}  // namespace memfit
