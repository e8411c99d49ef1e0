// custom_loop: the pieces the Trainer is made of, used by hand in a loop of your own:
// Executor + Schedule, LossScaler, gradient accumulation, OffloadOptimizer, ActivationStash.
//
//   build/examples/example_custom_loop [data/corpus.txt] [steps]
//
// f16 weights and activations (so the dynamic loss scaler is on), a batch of 8 split into 3
// micro-batches (3 + 3 + 2: the loss gradient scale / (B*T) weights the uneven one by its
// rows), every second block checkpointed, and AdamW, the gradients and the working weights
// offloaded to the CPU: the model is built without device weights, masters or gradients
// (ParamPlacement); each use of a block's weights (forward, recompute, backward) borrows a
// device copy from a ring of two buffers, fetched one use ahead; each backward stage borrows its
// gradients' memory from a ring of two device buckets and sends them to the host as soon as it
// is done, while the remaining backwards run; the host holds the sum over the micro-batches,
// checks it for inf/NaN and runs AdamW on it, writing the new weights where the next fetches
// read them. The checkpoints (the inputs of blocks 0 and 2) go to pinned host memory after the
// forward that keeps them and come back one checkpoint read ahead of their recompute.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/executor.h"
#include "core/model.h"
#include "core/rng.h"
#include "core/schedule.h"
#include "core/text_dataset.h"
#include "memory/caching_allocator.h"
#include "memory/pinned_host_provider.h"
#include "memory/size.h"
#include "policies/accumulation.h"
#include "policies/loss_scaler.h"
#include "policies/offload_activation_stash.h"
#include "policies/offload_optimizer.h"
#include "policies/runtime_env.h"

using namespace memfit;

// Rows [row0, row0 + rows) of a host batch as int32 tensors on the device. Backend::copy moves
// floating dtypes, so the ids travel as 4-byte f32 bit patterns (copy never converts).
struct DeviceRows {
  Block tokens, targets;
  MicroBatch mb;
};
DeviceRows upload(LayerContext& ctx, const Batch& b, std::int64_t row0, std::int64_t rows) {
  const std::int64_t n = rows * b.seq_len;
  const std::size_t bytes = static_cast<std::size_t>(n) * 4;
  DeviceRows d;
  d.tokens = ctx.alloc.allocate(bytes, Category::kInput, ctx.stream, "tokens");
  d.targets = ctx.alloc.allocate(bytes, Category::kInput, ctx.stream, "targets");
  auto as_f32 = [n](const void* p, Device dev) {
    return Tensor(const_cast<void*>(p), Shape{n}, DType::kF32, dev);
  };
  const std::size_t off = static_cast<std::size_t>(row0 * b.seq_len);
  ctx.backend.copy(ctx.stream, as_f32(b.tokens.data() + off, Device::kCpu),
                   as_f32(d.tokens.data(), ctx.device()));
  ctx.backend.copy(ctx.stream, as_f32(b.targets.data() + off, Device::kCpu),
                   as_f32(d.targets.data(), ctx.device()));
  d.mb.tokens = {static_cast<const std::int32_t*>(d.tokens.data()), Shape{rows, b.seq_len},
                 ctx.device()};
  d.mb.targets = {static_cast<const std::int32_t*>(d.targets.data()), Shape{rows, b.seq_len},
                  ctx.device()};
  return d;
}

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "data/corpus.txt";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  constexpr std::int64_t kBatch = 8, kSeqLen = 64, kAccum = 3;

  // The library's runtime (policies/runtime_env.h): a CPU backend whose worker streams make the
  // offload's copy stream a real thread, and the caching allocator the GEMM scratch comes from.
  RuntimeEnv env = make_runtime(DeviceKind::kCpu, AllocatorConfig{}, {.worker_streams = true});
  LayerContext ctx{*env.backend, *env.alloc, kDefaultStream, DType::kF16};

  ModelSpec spec = ModelSpec::preset("gpt-tiny");
  spec.layers = 4;
  spec.hidden = 128;
  spec.seq_len = kSeqLen;
  Model model(spec, ctx, ParamPlacement{.weight = false, .master = false, .grad = false});

  PinnedHostProvider pinned;
  OffloadOptions oo;
  oo.adamw.lr = 2e-3;
  oo.gradients = true;  // two device buckets (oo.grad_buckets)
  oo.stages = model.backward_stages();
  oo.weights = true;  // two device buffers (oo.weight_buffers)
  oo.units = model.weight_units();
  OffloadOptimizer opt(model.parameters(), oo, ctx, pinned);  // binds host masters and
  model.init(/*seed=*/1, ctx);                                // weights, which init fills
  LossScaler scaler;                                          // 65536, x2 / 2000 clean steps
  const Schedule schedule = Schedule::every(model.num_blocks(), 2);
  Executor ex(model, ctx);

  // Every micro-batch's backward stages go through the optimizer: it lends each stage its
  // gradient memory and takes the gradients to the host after it; and every use of a unit's
  // weights: it lends them a device copy and fetches the next use's.
  const int count = static_cast<int>(split_batch(kBatch, kAccum).size());
  int m_now = 0;
  ExecutorHooks hooks;
  hooks.before_stage = [&](int s) { opt.before_stage(ctx, s, m_now, count); };
  hooks.after_stage = [&](int s) { opt.after_stage(ctx, s, m_now, count); };
  hooks.before_use = [&](int u, int next) { opt.before_use(ctx, u, next); };
  hooks.after_use = [&](int u) { opt.after_use(ctx, u); };
  // The checkpoints' host room: one (B,T,hidden) f16 tensor of the largest micro-batch for each
  // checkpoint the schedule reads, within no host budget here (0) beside the optimizer's slab.
  ActivationStash stash(ctx, pinned);
  const std::vector<std::int64_t> micro = split_batch(kBatch, kAccum);
  stash.reserve(ctx, checkpoint_reads(schedule, model.num_blocks()),
                static_cast<std::size_t>(micro[0] * kSeqLen * spec.hidden) * dtype_size(ctx.dtype),
                /*host_budget=*/0, opt.host_bytes());
  hooks.stash = [&](int i, Act& x) { stash.put(ctx, i, x); };
  hooks.unstash = [&](int i, int next) { return stash.take(ctx, i, next); };

  const TextDataset data(path);
  Rng rng(2);
  for (int step = 1; step <= steps; ++step) {
    const Batch b = data.sample(kBatch, kSeqLen, rng);
    const double scale = scaler.scale();
    const auto dloss = static_cast<float>(scale / double(kBatch * kSeqLen));
    double loss = 0;
    std::int64_t row0 = 0;
    for (std::size_t m = 0; m < micro.size(); ++m) {
      DeviceRows d = upload(ctx, b, row0, micro[m]);
      m_now = static_cast<int>(m);  // the first micro-batch starts the gradients at zero
      const Act losses = ex.run(schedule, d.mb, dloss, hooks);
      loss += sum_losses(ctx, *losses);
      row0 += micro[m];
    }
    const bool overflow = opt.grads_nonfinite(ctx);  // on the host's gradients
    const bool skip = scaler.update(overflow);
    if (skip) {
      opt.skip(ctx);
    } else {
      opt.step(ctx, 1.0 / scale);  // unscales the gradients inside the update
    }
    const OffloadOptimizer::Timing t = opt.last_timing();
    std::printf(
        "step %3d  loss %.4f  scale %-6.0f%s  cpu adamw %.1f ms, waited %.1f ms for grads\n", step,
        loss / double(kBatch * kSeqLen), scale, skip ? " (skipped)" : "", t.adamw_s * 1e3,
        t.wait_grads_s * 1e3);
  }
  std::printf(
      "peak allocated %s (weights: %s of buffers); pinned host %s (masters, moments, "
      "gradients, weights) + %s (%lld checkpoints put, %lld fetched)\n",
      format_bytes(static_cast<std::size_t>(env.alloc->stats().allocated_bytes[kStatAll].peak))
          .c_str(),
      format_bytes(opt.weight_device_bytes()).c_str(), format_bytes(opt.host_bytes()).c_str(),
      format_bytes(stash.host_bytes()).c_str(), static_cast<long long>(stash.puts()),
      static_cast<long long>(stash.fetches()));
  return 0;
}
