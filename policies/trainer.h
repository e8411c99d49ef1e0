// Trainer: the library API that wraps a training loop and applies memory policies to it:
// activation/weight dtype, checkpoint schedule, micro-batch and gradient accumulation, CPU
// offload of the optimizer, dynamic loss scaling.
//
//   CpuBackend be({.worker_streams = true});          // a real copy stream for offload
//   HostProvider host;
//   CachingAllocator alloc(host, conf, &be.stream_sync());
//   LayerContext ctx{be, alloc, kDefaultStream, DType::kBF16};
//   Model model(ModelSpec::preset("gpt-tiny"), ctx);
//   TrainerOptions opt;
//   opt.checkpoint = "every:2"; opt.micro_batch = 4; opt.offload = true; opt.adamw.lr = 3e-4;
//   Trainer trainer(model, ctx, opt);                 // initializes the model from opt.seed
//   for (...) {
//     Batch b = dataset.sample(16, 128, trainer.rng());   // core/text_dataset.h
//     StepResult r = trainer.step(b);               // r.loss, r.skipped, r.peak_by_category
//   }
//   trainer.save("run.mfstate");                    // policies/train_state.h
//
// step(batch): splits the batch into micro-batches (micro_batch_split, or split_batch when
// accum is set), zeroes the gradients, runs the Executor on each micro-batch with the schedule
// (the loss gradient scale / (B * T) for every one), checks the gradients for inf/NaN when the
// loss scaler is enabled (f16 by default), steps or skips the optimizer, updates the scaler.
// Peaks are the allocator's, reset at the start of the step. An exception during a step (an
// OutOfMemory above all) leaves parameters, optimizer state, scaler and step count as they
// were before it; the trainer stays usable (try a smaller micro-batch).
// Not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/executor.h"
#include "core/optimizer.h"
#include "core/rng.h"
#include "core/text_dataset.h"  // Batch
#include "memory/category.h"
#include "policies/loss_scaler.h"
#include "policies/train_state.h"

namespace memfit {

struct TrainerOptions {
  std::string checkpoint = "none";  // Schedule::parse: none | all | sqrt | every:K
  std::int64_t micro_batch = 0;     // samples per micro-batch; 0: the whole batch at once
  std::int64_t accum = 0;           // or: this many micro-batches (split_batch); 0: unused
  bool offload = false;             // OffloadOptimizer instead of DeviceAdamW
  bool delayed_update = false;      // offload only: ZeRO-Offload's DPU (changes the math)
  AdamWOptions adamw;
  LossScalerOptions scaler;         // scaler.enabled is forced off unless the dtype is f16...
  bool scaler_auto = true;          // ...when scaler_auto (default): on for f16, off otherwise
  std::uint64_t seed = 1337;        // model initialization and the trainer's Rng
  bool init_model = true;           // false: keep the model's current weights
};

struct StepResult {
  std::int64_t step = 0;       // 1-based number of this step
  double loss = 0;             // mean over the batch's B*T rows (0 on the meta backend)
  double loss_scale = 1;       // the scale this step's gradients carried
  bool skipped = false;        // inf/NaN gradients: no update
  double seconds = 0;          // wall time of step()
  std::int64_t tokens = 0;     // B*T
  std::int64_t micro_batches = 0;
  std::size_t peak_allocated = 0;  // allocator peaks during the step
  std::size_t peak_reserved = 0;
  std::array<std::size_t, kCategoryCount> peak_by_category{};
};

class Trainer {
 public:
  Trainer(Model& model, LayerContext ctx, TrainerOptions options);
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

 private:
  struct Offload;
  Model& model_;
  LayerContext ctx_;
  TrainerOptions options_;
  Schedule schedule_;
  Rng rng_;
  LossScaler scaler_;
  std::unique_ptr<Offload> offload_;  // the pinned provider, when offloading
  std::unique_ptr<Optimizer> optimizer_;
  std::int64_t attempted_ = 0;
};

}  // namespace memfit
