#include "policies/dry_run.h"

#include <array>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/comm/communicator.h"
#include "core/meta/meta_backend.h"
#include "core/model.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/null_provider.h"
#include "policies/trainer.h"

namespace memfit {

namespace {

// A step of more micro-batches runs as one of this many, the repeats extrapolated...
constexpr std::int64_t kMaxDryMicroBatches = 64;
// ...unless the allocator never settles in them: then one of up to this many runs whole.
constexpr std::int64_t kMaxWholeDryMicroBatches = 4096;

// Token vectors up to this many entries are kept per thread between dry runs (64 MiB each):
// enough for 64 micro-batches of one 131072-token sample (Llama 3.1's context), whose fresh
// vectors, zero-filled per dry run, took two thirds of planning llama-3.1-8b for a global batch.
// A planner's worker threads free theirs when the plan is done; the calling thread keeps its own.
constexpr std::size_t kKeptTokens = std::size_t{1} << 24;

struct NotSettled {};  // thrown past the OutOfMemory handling: dry_run() decides what next

struct Work {
  double gemm_flops = 0;
  double bytes = 0;
  double seconds = 0;  // with RunSpec::op_rates
  std::array<double, kMetaOps> op_seconds{};
  double calls = 0;

  Work minus(const Work& o) const {
    Work d{gemm_flops - o.gemm_flops, bytes - o.bytes, seconds - o.seconds, {}, calls - o.calls};
    for (std::size_t i = 0; i < kMetaOps; ++i) d.op_seconds[i] = op_seconds[i] - o.op_seconds[i];
    return d;
  }
};

Work work_of(const MetaStats& s) {
  return {static_cast<double>(s.gemm_flops), static_cast<double>(s.bytes_moved()), s.seconds,
          s.op_seconds, static_cast<double>(s.total_calls())};
}

// Watches the allocator between micro-batches: once the full ones take no segment from the
// provider and the allocator's counters repeat with a period p (1, or 2 when a tight budget
// alternates between two layouts, ...) for two periods in a row, the rest would repeat them,
// and skipping a multiple of p of them leaves the allocator where the skipped ones would have.
// One quiet micro-batch is not enough: the small-block free cache and a tight budget's
// release-and-retry can change the next micro-batch's layout (a proof test caught a third
// micro-batch that ran out of memory where the second fitted).
class RepeatWatch {
 public:
  static constexpr int kMaxPeriod = 4;

  RepeatWatch(const CachingAllocator& alloc, const NullProvider& device, const MetaBackend& meta)
      : alloc_(alloc), device_(device), meta_(meta) {}

  // Before a step: nothing seen quiet yet.
  void start() {
    calls_ = provider_calls();
    before_ = work_of(meta_.stats());
    quiet_ = 0;
    history_.clear();
  }

  // After a full micro-batch: the period the allocator repeats with, or 0 while it does not.
  int period() {
    const Work now = work_of(meta_.stats());
    last_ = now.minus(before_);
    before_ = now;
    const AllocatorStats st = alloc_.stats();
    const Signature sig{st.allocated_bytes[kStatAll].current, st.reserved_bytes[kStatAll].current,
                        st.active_bytes[kStatAll].current,
                        st.inactive_split_bytes[kStatAll].current, st.num_alloc_retries};
    const std::int64_t calls = provider_calls();
    quiet_ = calls == calls_ ? quiet_ + 1 : 0;
    calls_ = calls;
    history_.push_back(sig);
    if (history_.size() > 2 * kMaxPeriod) history_.erase(history_.begin());
    const auto n = static_cast<int>(history_.size());
    for (int p = 1; p <= kMaxPeriod; ++p) {
      if (quiet_ < 2 * p || n < 2 * p) continue;
      bool repeats = true;
      for (int i = 1; i <= p && repeats; ++i) {
        repeats = history_[static_cast<std::size_t>(n - i)] ==
                  history_[static_cast<std::size_t>(n - i - p)];
      }
      if (repeats) return p;
    }
    return 0;
  }

  Work last_micro_batch() const { return last_; }

 private:
  std::int64_t provider_calls() const { return device_.num_allocs() + device_.num_frees(); }

  const CachingAllocator& alloc_;
  const NullProvider& device_;
  const MetaBackend& meta_;
  std::int64_t calls_ = 0;
  using Signature = std::array<std::int64_t, 5>;
  int quiet_ = 0;
  std::vector<Signature> history_;
  Work before_, last_;
};

// One dry run whose step runs at most `cap` micro-batches (the same micro-batch size and last
// micro-batch): the allocator settles within a few and the rest repeat them, so the peaks are
// the same and the work is extrapolated, in time and memory independent of the batch (a
// planner may ask for a global batch of 10^12). NotSettled when the step had more than `cap`
// and the allocator did not settle in them.
DryRunResult dry_run_capped(const RunSpec& run, int steps, std::int64_t cap) {
  const std::int64_t seq_len = run.resolved_seq_len();
  const Split split = run.trainer.policy.split(run.rank_batch());
  TrainerOptions options = run.trainer;
  std::int64_t samples = run.rank_batch();
  if (split.count > cap) {
    options.policy.accum = 0;
    options.policy.micro_batch = split.size;
    samples = (cap - 1) * split.size + split.last;
  }
  const std::int64_t count = split.count;

  MetaBackend meta;
  NullProvider device;
  NullProvider host;  // offload's pinned memory: addresses only
  CachingAllocator alloc(device, run.alloc, &meta.stream_sync());
  // The GEMM workspace as the run's backend takes it (RunSetup gives every backend the
  // budgeted allocator): the CPU's 16-bit widening scratch, or cuBLASLt's fixed workspace.
  // (kCuda with no workspace: cuBLASLt without one; the meta backend then takes none.)
  if (run.device == DeviceKind::kCpu || run.gpu_gemm_workspace > 0) {
    meta.set_workspace_allocator(&alloc);
  }
  if (run.device == DeviceKind::kCuda) meta.set_gemm_workspace_bytes(run.gpu_gemm_workspace);
  meta.set_rates(run.op_rates.get());
  LayerContext ctx{meta, alloc, kDefaultStream, run.trainer.policy.dtype};
  // One rank of a data-parallel run: its collectives touch nothing and allocate nothing, as
  // the MPI communicator allocates nothing from the caching allocator.
  SimulatedCommunicator comm(meta, run.ranks, run.rank);
  options.comm = run.ranks > 1 || run.trainer.zero_stage > 0 ? &comm : nullptr;

  DryRunResult r;
  bool in_step = false;
  try {
    Model model(run.model, ctx, Trainer::placement(run.trainer.policy, run.trainer.zero_stage));
    Trainer trainer(model, ctx, options, &host);
    r.setup_peak_reserved = static_cast<std::size_t>(alloc.stats().reserved_bytes[kStatAll].peak);
    r.host_pinned = trainer.host_bytes();

    RepeatWatch watch(alloc, device, meta);
    std::int64_t skipped = 0;
    bool settled = false;
    trainer.set_repeat_check([&](std::int64_t m) {
      const int p = watch.period();
      // Skipping to the last micro-batch passes count - 2 - m full ones: a whole number of
      // periods, or wait for the next micro-batch.
      if (p == 0 || (count - 2 - m) % p != 0) return false;
      settled = true;
      skipped = count - 2 - m;  // of the whole step's micro-batches
      return true;
    });
    // The meta backend never reads the tokens: the thread's zeros, grown as needed, instead of
    // two fresh vectors per dry run (a planner makes hundreds; at 500 x 1024 tokens the
    // allocation, fill and copy were ~3% of its time). A huge batch gets its own, not kept.
    const auto tokens = static_cast<std::size_t>(samples * seq_len);
    thread_local Batch kept;
    Batch huge;
    Batch& b = tokens <= kKeptTokens ? kept : huge;
    b.batch = samples;
    b.seq_len = seq_len;
    b.tokens.resize(tokens, 0);
    b.targets.resize(tokens, 0);
    in_step = true;
    meta.reset_stats();
    watch.start();
    const StepResult s = trainer.step(b);
    if (count > cap && !settled) throw NotSettled{};
    r.fits = true;
    r.step = s.peaks;
    const Work total = work_of(meta.stats());
    const Work repeat = watch.last_micro_batch();
    r.gemm_flops = total.gemm_flops + repeat.gemm_flops * static_cast<double>(skipped);
    r.bytes_moved = total.bytes + repeat.bytes * static_cast<double>(skipped);
    r.compute_seconds = total.seconds + repeat.seconds * static_cast<double>(skipped);
    r.op_calls = total.calls + repeat.calls * static_cast<double>(skipped);
    for (std::size_t i = 0; i < kMetaOps; ++i) {
      r.op_seconds[i] = total.op_seconds[i] + repeat.op_seconds[i] * static_cast<double>(skipped);
    }
    r.micro_batches_run = count - skipped;
    if (steps == 2) {
      // From the cache the first step left: where every later step starts.
      watch.start();
      r.step.take_max(trainer.step(b).peaks);
    }
    // Activation offload reserves its room in the step.
    r.host_pinned = trainer.host_bytes();
    r.step.host_at_peak = trainer.host_by_category();
  } catch (const InvalidArgument& e) {
    // Sizes past 64 bits (seq_len 2^31: "layer cost overflows ...") say which run they came
    // from; a subclass (a caller may catch it by type) goes on as it is.
    if (typeid(e) != typeid(InvalidArgument)) throw;
    throw InvalidArgument(std::string(e.what()) + " (in a dry run of " + run.describe() + ")");
  } catch (const OutOfMemory& e) {
    r.fits = false;
    r.failed_request = e.info().requested_bytes;
    r.failure = e.what();
    if (e.info().host) r.host_pinned = e.info().requested_bytes;  // what the slab would take
    if (in_step) {
      r.step = PeakFigures::of(alloc.stats());
    } else {
      r.setup_peak_reserved = static_cast<std::size_t>(alloc.stats().reserved_bytes[kStatAll].peak);
    }
  }
  r.step.host_pinned = r.host_pinned;
  if (run.alloc.budget > 0 && r.setup_peak_reserved > run.alloc.budget) r.fits = false;
  return r;
}

}  // namespace

DryRunResult dry_run(const RunSpec& run, int steps) {
  run.validate();
  if (steps != 1 && steps != 2) {
    throw InvalidArgument("dry_run: steps = " + std::to_string(steps) + "; valid: 1 or 2");
  }
  try {
    return dry_run_capped(run, steps, kMaxDryMicroBatches);
  } catch (const NotSettled&) {
    const std::int64_t count = run.trainer.policy.split(run.rank_batch()).count;
    if (count <= kMaxWholeDryMicroBatches) return dry_run_capped(run, steps, count);  // exact
    throw DryRunUnsettled("dry run of " + run.describe() + ": the allocator did not settle into a "
                          "repeating state within " + std::to_string(kMaxDryMicroBatches) +
                          " micro-batches, so a step of " + std::to_string(count) +
                          " cannot be predicted from a shorter one; valid: at most " +
                          std::to_string(kMaxWholeDryMicroBatches) +
                          " micro-batches (a larger micro-batch)");
  }
}

}  // namespace memfit
