#include "policies/dry_run.h"

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/device_adamw.h"
#include "core/executor.h"
#include "core/meta/meta_backend.h"
#include "core/model.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/null_provider.h"
#include "memory/size.h"

namespace memfit {

namespace {

// This file mirrors what Trainer (policies/trainer.cpp) allocates, in the same order; the
// proof tests (tests/policies/dry_run_test.cpp) run both and compare the peaks byte for byte,
// so a change to one that the other does not follow shows there.

void validate(const DryRunRequest& q, std::int64_t seq_len) {
  q.spec.validate();
  auto bad = [](const std::string& what) { throw InvalidArgument("dry run: " + what); };
  if (q.micro_batch < 1) bad("micro_batch " + std::to_string(q.micro_batch) + " must be >= 1");
  if (q.accum < 1) bad("accum " + std::to_string(q.accum) + " must be >= 1");
  if (q.last_micro_batch < 0 || q.last_micro_batch > q.micro_batch) {
    bad("last_micro_batch " + std::to_string(q.last_micro_batch) + ": valid: 0 (even) to " +
        std::to_string(q.micro_batch) + " (the micro-batch)");
  }
  if (q.last_micro_batch > 0 && q.last_micro_batch < q.micro_batch && q.accum < 2) {
    bad("an uneven last micro-batch (" + std::to_string(q.last_micro_batch) +
        ") needs accum >= 2; with one micro-batch give micro_batch = " +
        std::to_string(q.last_micro_batch));
  }
  if (seq_len < 1 || seq_len > q.spec.seq_len) {
    bad("seq_len " + std::to_string(seq_len) + ": valid: 1 to the model's seq_len " +
        std::to_string(q.spec.seq_len));
  }
  // Token buffers of micro_batch * seq_len int32 must be addressable.
  checked_mul(checked_mul(static_cast<std::size_t>(q.micro_batch),
                          static_cast<std::size_t>(seq_len), "micro_batch * seq_len"),
              sizeof(std::int32_t), "micro_batch * seq_len * 4");
}

// Trainer's upload(): tokens then targets, Category::kInput, copied from the host.
struct DeviceBatch {
  Block tokens, targets;
  MicroBatch mb;
};

DeviceBatch upload(LayerContext& ctx, const std::vector<std::int32_t>& host, std::int64_t rows,
                   std::int64_t seq_len) {
  const std::int64_t n = rows * seq_len;
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(std::int32_t);
  DeviceBatch d;
  d.tokens = ctx.alloc.allocate(bytes, Category::kInput, ctx.stream, "tokens");
  d.targets = ctx.alloc.allocate(bytes, Category::kInput, ctx.stream, "targets");
  // Backend::copy moves floating dtypes only; the trainer moves int32 bits as f32 the same way.
  auto* src = const_cast<std::int32_t*>(host.data());
  const Tensor hs(src, Shape{n}, DType::kF32, Device::kCpu);
  ctx.backend.copy(ctx.stream, hs, Tensor(d.tokens.data(), Shape{n}, DType::kF32, ctx.device()));
  ctx.backend.copy(ctx.stream, hs, Tensor(d.targets.data(), Shape{n}, DType::kF32, ctx.device()));
  const auto* tok = static_cast<const std::int32_t*>(d.tokens.data());
  const auto* tgt = static_cast<const std::int32_t*>(d.targets.data());
  d.mb.tokens = IndexTensor{tok, Shape{rows, seq_len}, ctx.device()};
  d.mb.targets = IndexTensor{tgt, Shape{rows, seq_len}, ctx.device()};
  return d;
}

struct Work {
  double gemm_flops = 0;
  double bytes = 0;
};

Work work_of(const MetaStats& s) {
  return {static_cast<double>(s.gemm_flops), static_cast<double>(s.bytes_moved())};
}

Work operator-(Work a, Work b) { return {a.gemm_flops - b.gemm_flops, a.bytes - b.bytes}; }

void take_peaks(const CachingAllocator& alloc, DryRunResult& r) {
  const AllocatorStats s = alloc.stats();
  r.peak_reserved = static_cast<std::size_t>(s.reserved_bytes[kStatAll].peak);
  r.peak_allocated = static_cast<std::size_t>(s.allocated_bytes[kStatAll].peak);
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    r.peak_by_category[c] = static_cast<std::size_t>(s.category_bytes[c].peak);
  }
}

}  // namespace

DryRunResult dry_run(const DryRunRequest& q) {
  const std::int64_t seq_len = q.seq_len > 0 ? q.seq_len : q.spec.seq_len;
  validate(q, seq_len);
  const int n = static_cast<int>(q.spec.layers);
  const Schedule schedule =
      q.schedule.ops().empty() ? Schedule::parse(q.policy.checkpoint, n) : q.schedule;
  schedule.validate(n);

  const bool uneven = q.last_micro_batch > 0 && q.last_micro_batch < q.micro_batch;
  const std::int64_t full = q.accum - (uneven ? 1 : 0);

  MetaBackend meta;
  NullProvider null;
  CachingAllocator alloc(null, q.alloc_conf, &meta.stream_sync());
  if (q.gpu_gemm_workspace > 0) {
    meta.set_workspace_allocator(&alloc);
    meta.set_gemm_workspace_bytes(q.gpu_gemm_workspace);
  } else if (q.cpu_gemm_scratch) {
    meta.set_workspace_allocator(&alloc);
  }
  LayerContext ctx{meta, alloc, kDefaultStream, q.policy.dtype};
  DryRunResult r;
  bool in_step = false;
  try {
    // Setup, as Model + Trainer's constructor: parameters, init, then the optimizer.
    Model model(q.spec, ctx);
    model.init(/*seed=*/0, ctx);
    std::unique_ptr<DeviceAdamW> adamw;
    if (q.policy.offload) {
      // OffloadOptimizer moves each master to pinned host memory (outside the budget, not
      // simulated) and resets it on the device, in parameters() order; then the trainer
      // empties the cache so the freed segments leave the reserved bytes.
      for (Parameter* p : model.parameters()) p->master.reset();
      alloc.empty_cache();
    } else {
      adamw = std::make_unique<DeviceAdamW>(model.parameters(), AdamWOptions{}, ctx);
    }
    r.setup_peak_reserved =
        static_cast<std::size_t>(alloc.stats().reserved_bytes[kStatAll].peak);

    // The step, as Trainer::step.
    in_step = true;
    alloc.reset_peak_stats();
    meta.reset_stats();
    std::vector<std::int32_t> host(static_cast<std::size_t>(q.micro_batch * seq_len), 0);
    Executor ex(model, ctx);
    const float dloss = 1.0f;  // values are irrelevant on meta
    model.zero_grad(ctx);
    Work before = work_of(meta.stats());
    Work total = before;
    auto micro_batch = [&](std::int64_t rows) {
      {
        DeviceBatch d = upload(ctx, host, rows, seq_len);
        const Act losses = ex.run(schedule, d.mb, dloss);
        (void)sum_losses(ctx, *losses);
      }
      const Work now = work_of(meta.stats());
      const Work one = now - before;
      before = now;
      return one;
    };
    // Full micro-batches until two in a row take no segment from the provider, return none and
    // leave the allocator's counters where the previous one left them: the rest repeat them.
    // One is not enough: the small-block free cache and a tight budget's release-and-retry
    // can change the next micro-batch's layout (the proof test caught a third micro-batch that
    // ran out of memory where the second fitted).
    int quiet = 0;
    std::array<std::int64_t, 5> last_sig{};
    for (std::int64_t m = 0; m < full; ++m) {
      const std::int64_t calls = null.num_allocs() + null.num_frees();
      const Work one = micro_batch(q.micro_batch);
      const AllocatorStats st = alloc.stats();
      const std::array<std::int64_t, 5> sig{
          st.allocated_bytes[kStatAll].current, st.reserved_bytes[kStatAll].current,
          st.active_bytes[kStatAll].current, st.inactive_split_bytes[kStatAll].current,
          st.num_alloc_retries};
      const bool no_calls = null.num_allocs() + null.num_frees() == calls;
      quiet = no_calls && (quiet == 0 || sig == last_sig) ? quiet + 1 : 0;
      last_sig = sig;
      const bool settled = quiet >= 2;
      const double times = settled ? static_cast<double>(full - m) : 1.0;
      total.gemm_flops += one.gemm_flops * times;
      total.bytes += one.bytes * times;
      if (settled) break;
    }
    if (uneven) {
      const Work one = micro_batch(q.last_micro_batch);
      total.gemm_flops += one.gemm_flops;
      total.bytes += one.bytes;
    }
    // The loss scaler's inf/NaN check (f16): on a real device one tiny temporary block.
    if (q.policy.dtype == DType::kF16) {
      Block slots = alloc.allocate(kSumSqSlots * sizeof(float), Category::kTemporary, ctx.stream,
                                   "loss_scaler.nonfinite");
    }
    if (adamw) {
      const Work pre = work_of(meta.stats());
      adamw->step(ctx, 1.0);
      const Work opt = work_of(meta.stats()) - pre;
      total.gemm_flops += opt.gemm_flops;
      total.bytes += opt.bytes;
    }
    r.fits = true;
    r.gemm_flops = total.gemm_flops;
    r.bytes_moved = total.bytes;
    take_peaks(alloc, r);
  } catch (const OutOfMemory& e) {
    r.fits = false;
    r.failed_request = e.info().requested_bytes;
    r.failure = e.what();
    if (in_step) {
      take_peaks(alloc, r);
    } else {
      r.setup_peak_reserved =
          static_cast<std::size_t>(alloc.stats().reserved_bytes[kStatAll].peak);
    }
  }
  if (q.alloc_conf.budget > 0 && r.setup_peak_reserved > q.alloc_conf.budget) r.fits = false;
  return r;
}

}  // namespace memfit
