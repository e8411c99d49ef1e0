#include "core/executor.h"

#include <optional>
#include <string>
#include <vector>

#include "memory/check.h"
#include "memory/error.h"
#include "profiler/scoped_range.h"

namespace memfit {

namespace {

void check_batch(const MicroBatch& mb, const LayerContext& ctx) {
  if (mb.tokens.shape.ndim() != 2 || mb.targets.shape != mb.tokens.shape) {
    throw InvalidArgument("Executor: tokens " + mb.tokens.shape.str() + " and targets " +
                          mb.targets.shape.str() + "; valid: both (B, T), the same shape");
  }
  if (mb.tokens.device != ctx.device() || mb.targets.device != ctx.device()) {
    throw InvalidArgument(std::string("Executor: tokens on ") + device_name(mb.tokens.device) +
                          ", targets on " + device_name(mb.targets.device) +
                          "; valid: both on the backend's device, " + device_name(ctx.device()));
  }
}

}  // namespace

// Outputs nobody reads are not stored, so a recomputation whose output is already held, or not
// needed (the last block recomputed after the head), costs no extra slot.
std::vector<char> outputs_read_later(const Schedule& s, int n) {
  const auto& ops = s.ops();
  std::vector<char> needed(ops.size(), 0);
  std::vector<char> forward_later(static_cast<std::size_t>(n) + 1, 0);  // x[i] read by a later op
  for (std::size_t j = ops.size(); j-- > 0;) {
    const ScheduleOp& op = ops[j];
    if (op.kind != ScheduleOp::Kind::kForward) continue;
    needed[j] = forward_later[static_cast<std::size_t>(op.block) + 1];
    forward_later[static_cast<std::size_t>(op.block)] = 1;
  }
  bool head_ran = false;
  for (std::size_t j = 0; j < ops.size(); ++j) {
    const ScheduleOp& op = ops[j];
    if (op.kind == ScheduleOp::Kind::kForward && op.block == n - 1 && !head_ran) {
      needed[j] = 1;
      head_ran = true;
    }
  }
  return needed;
}

// The slots as run() fills them: x[0] from the embedding; a forward stores its output when read
// later and not held, and drops its input unless it keeps it as a checkpoint; the head takes
// x[n]; a backward drops x[i] and x[i+1].
std::vector<char> forwards_for_backward(const Schedule& s, int n) {
  const std::vector<char> needed = outputs_read_later(s, n);
  const auto& ops = s.ops();
  std::vector<char> out(ops.size(), 0);
  std::vector<char> held(static_cast<std::size_t>(n) + 1, 0);
  held[0] = 1;
  bool head_ran = false;
  for (std::size_t j = 0; j < ops.size(); ++j) {
    const ScheduleOp& op = ops[j];
    const auto i = static_cast<std::size_t>(op.block);
    if (op.kind == ScheduleOp::Kind::kForward) {
      const bool output_read = needed[j] && !held[i + 1];
      out[j] = op.keep == Keep::kAll && !output_read;
      if (op.keep != Keep::kInput) held[i] = 0;
      if (output_read) held[i + 1] = 1;
      if (op.block == n - 1 && !head_ran) {
        head_ran = true;
        held[i + 1] = 0;
      }
    } else {
      held[i] = 0;
      held[i + 1] = 0;
    }
  }
  return out;
}

namespace {

// The profiler's names for this model's stages: block i's layer name, "embedding", "head".
// Interned once per run() (n + 2 lookups per micro-batch), so each range costs a push and a pop.
struct RangeIds {
  explicit RangeIds(Model& model) {
    blocks.reserve(static_cast<std::size_t>(model.num_blocks()));
    for (int i = 0; i < model.num_blocks(); ++i)
      blocks.push_back(intern_name(model.block(i).name()));
    embedding = intern_name("embedding");
    head = intern_name("head");
  }
  std::vector<std::uint32_t> blocks;
  std::uint32_t embedding = 0, head = 0;
};

// The phase range open around the ops: consecutive ops of one phase share it (a forward pass
// is one "forward" range, a recomputation inside the backwards its own "recompute" range).
class PhaseRange {
 public:
  void enter(RangeKind kind) {
    if (range_ && kind_ == kind) return;
    range_.reset();
    kind_ = kind;
    range_.emplace(kind);
  }

 private:
  RangeKind kind_ = RangeKind::kOther;
  std::optional<ScopedRange> range_;
};

// Calls the use hooks as the ops go: enter(u) before an op on unit u, finish() after the last.
class UseTracker {
 public:
  UseTracker(const ExecutorHooks& hooks, std::vector<int> uses)
      : hooks_(hooks), uses_(std::move(uses)) {}
  void enter(int unit) {
    if (!hooks_.before_use && !hooks_.after_use) return;
    if (started_ && uses_[at_] == unit) return;
    if (started_) {
      if (hooks_.after_use) hooks_.after_use(uses_[at_]);
      ++at_;
    }
    started_ = true;
    MEMFIT_CHECK(at_ < uses_.size() && uses_[at_] == unit)
        << "executor: use " << at_ << " of unit " << unit << " not in weight_uses()";
    const int next = at_ + 1 < uses_.size() ? uses_[at_ + 1] : -1;
    if (hooks_.before_use) hooks_.before_use(unit, next);
  }
  void finish() {
    if (started_ && hooks_.after_use) hooks_.after_use(uses_[at_]);
    started_ = false;
  }

 private:
  const ExecutorHooks& hooks_;
  std::vector<int> uses_;
  std::size_t at_ = 0;
  bool started_ = false;
};

}  // namespace

std::vector<int> weight_uses(const Schedule& schedule, int n) {
  std::vector<int> out;
  const auto use = [&](int u) {
    if (out.empty() || out.back() != u) out.push_back(u);
  };
  use(0);
  bool head_ran = false;
  for (const ScheduleOp& op : schedule.ops()) {
    use(1 + op.block);
    if (op.kind == ScheduleOp::Kind::kForward && op.block == n - 1 && !head_ran) {
      head_ran = true;
      use(n + 1);
    }
  }
  use(0);
  return out;
}

std::vector<int> checkpoint_reads(const Schedule& schedule, int n) {
  std::vector<char> kept(static_cast<std::size_t>(n) + 1, 0);
  std::vector<int> out;
  for (const ScheduleOp& op : schedule.ops()) {
    if (op.kind != ScheduleOp::Kind::kForward) continue;
    const auto i = static_cast<std::size_t>(op.block);
    if (kept[i]) out.push_back(op.block);
    kept[i] = op.keep == Keep::kInput;
  }
  return out;
}

Executor::Executor(Model& model, LayerContext ctx) : model_(model), ctx_(ctx) {}

Act Executor::run(const Schedule& schedule, const MicroBatch& mb, float dloss,
                  const ExecutorHooks& hooks) {
  const int n = model_.num_blocks();
  schedule.validate(n);
  check_batch(mb, ctx_);
  stats_ = ExecutorStats{};
  const std::vector<char> needed = outputs_read_later(schedule, n);
  const std::vector<char> for_backward = forwards_for_backward(schedule, n);
  const RangeIds ids(model_);
  const bool use_hooks = hooks.before_use || hooks.after_use;
  UseTracker uses(hooks, use_hooks ? weight_uses(schedule, n) : std::vector<int>{});
  if (static_cast<bool>(hooks.stash) != static_cast<bool>(hooks.unstash)) {
    throw InvalidArgument(
        "Executor: a stash hook without an unstash hook (or the reverse); "
        "valid: both or neither");
  }
  const std::vector<int> reads = hooks.stash ? checkpoint_reads(schedule, n) : std::vector<int>{};
  std::size_t read_at = 0;  // the next entry of `reads`

  std::vector<Act> x(static_cast<std::size_t>(n) + 1);  // x[i]: block i's input
  std::vector<char> stashed(x.size(), 0);               // x[i] taken by the stash hook
  std::vector<char> kept(x.size(), 0);                  // x[i] is a checkpoint (as reads has it)
  Act dy;                                               // the gradient at x[next backward + 1]
  Act losses;
  const auto count_held = [&] {
    std::int64_t h = 0;
    for (std::size_t i = 0; i < x.size(); ++i) h += x[i] != nullptr || stashed[i];
    if (h > stats_.max_held_inputs) stats_.max_held_inputs = h;
  };
  try {
    // Declared inside the try: a failing op closes its ranges before the cleanup below runs.
    PhaseRange phase;
    phase.enter(RangeKind::kForward);
    {
      ScopedRange b(RangeKind::kBlock, ids.embedding);
      uses.enter(0);
      x[0] = model_.embedding().forward(ctx_, mb.tokens);
    }
    count_held();
    bool head_ran = false;
    const auto& ops = schedule.ops();
    for (std::size_t j = 0; j < ops.size(); ++j) {
      const ScheduleOp& op = ops[j];
      const auto i = static_cast<std::size_t>(op.block);
      Layer& blk = model_.block(op.block);
      if (op.kind == ScheduleOp::Kind::kForward) {
        phase.enter(op.recompute ? RangeKind::kRecompute : RangeKind::kForward);
        std::optional<ScopedRange> block_range(std::in_place, RangeKind::kBlock, ids.blocks[i]);
        uses.enter(1 + op.block);
        if (hooks.stash) {
          // The forward of block i after a checkpoint of x[i] reads it (checkpoint_reads()).
          if (kept[i]) ++read_at;
          kept[i] = op.keep == Keep::kInput;
          if (stashed[i]) {
            const int next = read_at < reads.size() ? reads[read_at] : -1;
            x[i] = hooks.unstash(op.block, next);
            stashed[i] = 0;
            MEMFIT_CHECK(x[i] != nullptr) << "executor: unstash(" << op.block << ") gave nothing";
          }
        }
        // A forward keeping all whose output nobody reads (a recomputation just before its
        // backward, or one whose output is already held) runs only what the backward needs.
        const bool output_read = needed[j] && !x[i + 1] && !stashed[i + 1];
        MEMFIT_CHECK((op.keep == Keep::kAll && !output_read) == (for_backward[j] != 0))
            << "executor: forwards_for_backward disagrees at op " << j;
        Act y;
        if (for_backward[j]) {
          blk.forward_for_backward(ctx_, x[i]);
        } else {
          y = blk.forward(ctx_, x[i], op.keep == Keep::kAll);
        }
        ++stats_.forwards;
        if (op.recompute) ++stats_.recomputes;
        // The block keeps its input itself when it needs it (kAll); a checkpoint stays here,
        // or goes to the stash.
        if (op.keep != Keep::kInput) {
          x[i].reset();
        } else if (hooks.stash) {
          hooks.stash(op.block, x[i]);
          if (x[i] == nullptr) {
            stashed[i] = 1;
            ++stats_.stashed;
          }
        }
        if (output_read) x[i + 1] = std::move(y);
        y.reset();
        count_held();
        block_range.reset();
        if (op.block == n - 1 && !head_ran) {
          head_ran = true;
          Act xn = std::move(x[static_cast<std::size_t>(n)]);
          {
            ScopedRange h(RangeKind::kBlock, ids.head);
            uses.enter(n + 1);
            losses = model_.head().forward(ctx_, xn, mb.targets);
            xn.reset();  // the head holds what its backward needs
          }
          // Backward right away: the logits (the largest tensor of a small-vocabulary GPT)
          // become dlogits and go before any block's backward adds its temporaries.
          phase.enter(RangeKind::kBackward);
          ScopedRange h(RangeKind::kBlock, ids.head);
          if (hooks.before_stage) hooks.before_stage(0);
          dy = model_.head().backward(ctx_, mb.targets, dloss);
          if (hooks.after_stage) hooks.after_stage(0);
        }
      } else {
        phase.enter(RangeKind::kBackward);
        ScopedRange block_range(RangeKind::kBlock, ids.blocks[i]);
        const int stage = n - op.block;  // Model::backward_stages(): 1 + (n - 1 - block)
        uses.enter(1 + op.block);
        if (hooks.before_stage) hooks.before_stage(stage);
        Act dx = blk.backward(ctx_, dy);
        dy = std::move(dx);
        ++stats_.backwards;
        x[i].reset();  // nothing after this backward reads block i's input or output
        x[i + 1].reset();
        if (hooks.after_stage) hooks.after_stage(stage);
      }
    }
    MEMFIT_CHECK(read_at == reads.size())
        << "executor: " << read_at << " of " << reads.size() << " checkpoint reads ran";
    phase.enter(RangeKind::kBackward);
    ScopedRange b(RangeKind::kBlock, ids.embedding);
    uses.enter(0);
    if (hooks.before_stage) hooks.before_stage(n + 1);
    model_.embedding().backward(ctx_, mb.tokens, dy);
    dy.reset();
    if (hooks.after_stage) hooks.after_stage(n + 1);
    uses.finish();
  } catch (...) {
    // An aborted step holds nothing: every slot, the gradient in flight, the losses and every
    // layer's saved state go before the exception does (the parameters were only read).
    x.clear();
    dy.reset();
    losses.reset();
    model_.release_saved();
    throw;
  }
  return losses;
}

Act Executor::forward_only(const MicroBatch& mb, const ExecutorHooks& hooks) {
  check_batch(mb, ctx_);
  stats_ = ExecutorStats{};
  Act x;
  Act losses;
  const RangeIds ids(model_);
  const int n = model_.num_blocks();
  std::vector<int> order;
  if (hooks.before_use || hooks.after_use) {
    for (int u = 0; u <= n + 1; ++u) order.push_back(u);
  }
  UseTracker uses(hooks, std::move(order));
  try {
    ScopedRange phase(RangeKind::kForward);
    {
      ScopedRange b(RangeKind::kBlock, ids.embedding);
      uses.enter(0);
      x = model_.embedding().forward(ctx_, mb.tokens);
    }
    for (int i = 0; i < n; ++i) {
      ScopedRange b(RangeKind::kBlock, ids.blocks[static_cast<std::size_t>(i)]);
      uses.enter(1 + i);
      Act y = model_.block(i).forward(ctx_, x, /*save=*/false);
      x = std::move(y);
      ++stats_.forwards;
    }
    stats_.max_held_inputs = 1;
    ScopedRange h(RangeKind::kBlock, ids.head);
    uses.enter(n + 1);
    losses = model_.head().forward(ctx_, x, mb.targets);
    x.reset();
    model_.head().release_saved();  // the head always saves; nothing here runs its backward
    uses.finish();
  } catch (...) {
    x.reset();
    losses.reset();
    model_.release_saved();
    throw;
  }
  return losses;
}

double sum_losses(LayerContext& ctx, const Tensor& losses) {
  if (losses.dtype() != DType::kF32) {
    throw InvalidArgument(std::string("sum_losses: losses are ") + dtype_name(losses.dtype()) +
                          "; valid: f32 (LmHead's per-row losses)");
  }
  if (ctx.device() == Device::kMeta) return 0.0;
  std::vector<float> host(static_cast<std::size_t>(losses.numel()));
  const Tensor dst(host.data(), losses.shape(), DType::kF32, Device::kCpu);
  ctx.backend.copy(ctx.stream, losses, dst);
  ctx.backend.synchronize(ctx.stream);
  double sum = 0.0;
  for (float v : host) sum += static_cast<double>(v);
  return sum;
}

}  // namespace memfit
