// OffloadOptimizer: one pinned host slab holds every parameter's FP32 master, Adam moments and
// gradient staging, laid out by kind at the same element offsets, so one CPU AdamW call covers
// a whole run of parameters with the same weight dtype (OpenMP over all of it, rather than a
// thread team per small tensor). Layout, each region 64-byte aligned:
//   [master f32 x N][exp_avg f32 x N][exp_avg_sq f32 x N][grad f32 x N][weight staging]
// Weight staging holds the updated weights rounded to the compute dtype, for runs whose weights
// are not f32; f32 weights are copied back straight from the masters (their rounding is the
// identity), which saves 4 bytes per parameter.
// Ordering, all on one copy stream (FIFO): the D2H gradient copies of step t+1 queue behind the
// H2D weight copies of step t, so waiting for gradients also proves the staging free; the
// compute stream waits on an event after each H2D batch, and after in-flight D2H copies before
// a skip hands the gradients back (zero_grad must not race a copy still reading them).
#include "policies/offload_optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/cpu/adamw.h"
#include "core/cpu/sumsq.h"
#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"
#include "policies/offload_grad_ring.h"
#include "profiler/host_region.h"
#include "profiler/scoped_range.h"

namespace memfit {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kAlign = 64;

// The profiler's names for what this optimizer does (kOffload ranges), interned once.
struct OffloadRangeIds {
  std::uint32_t grads_to_host = intern_name("grads_to_host");
  std::uint32_t wait_grads = intern_name("wait_grads");
  std::uint32_t host_adamw = intern_name("host_adamw");
  std::uint32_t weights_to_device = intern_name("weights_to_device");
};
const OffloadRangeIds& range_ids() {
  static const OffloadRangeIds ids;
  return ids;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void bad(const std::string& what) {
  throw InvalidArgument("OffloadOptimizer: " + what);
}

}  // namespace

struct OffloadOptimizer::Impl {
  struct Slot {
    Parameter* p;
    std::size_t offset;  // element offset in the f32 regions
    std::size_t n;
    DType dtype;             // the working weight's dtype
    std::size_t stage_byte;  // byte offset in weight staging (non-f32 only)
    bool copied = false;     // this step's gradient is queued D2H
  };
  // Consecutive slots with one weight dtype: one adamw_step each.
  struct Run {
    std::size_t first, last;  // slots [first, last)
    std::size_t offset, n;    // elements
    DType dtype;
  };

  Backend* be = nullptr;
  MemoryProvider* host = nullptr;
  bool dry = false;  // a NullProvider's slab: addresses only, never touched
  OffloadOptions options;
  StreamId copy = kDefaultStream;
  std::vector<Slot> slots;
  std::vector<Run> runs;
  std::unordered_map<const Parameter*, std::size_t> index;
  std::size_t total = 0;  // elements
  void* slab = nullptr;
  std::size_t slab_bytes = 0;
  CategoryBytes slab_by_category{};
  std::vector<HostRegion> regions;  // the slab's parts, for the profiler (not dry)
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* grad = nullptr;
  unsigned char* stage = nullptr;
  std::int64_t steps = 0;
  std::vector<EventHandle> grad_events;  // D2H batches of this step
  std::vector<EventHandle> pending_h2d;  // weight copy-backs not yet known complete
  std::unique_ptr<GradRing> ring;        // gradient offload
  std::unique_ptr<WeightRing> wring;     // weight offload
  std::future<double> update;            // delayed update in flight: its AdamW seconds
  bool update_unlanded = false;          // a delayed update's weights are not copied back yet
  Timing timing;

  ~Impl() {
    if (update.valid()) update.wait();
    if (be != nullptr) {
      try {
        for (EventHandle e : grad_events) be->release_event(e);
        for (EventHandle e : pending_h2d) be->release_event(e);
        if (copy != kDefaultStream) be->destroy_stream(copy);  // drains
      } catch (...) {  // a destructor reports nothing; the copies are over either way
      }
    }
    ring.reset();  // its copies are over
    wring.reset();
    for (Slot& s : slots) {
      s.p->host_master = Tensor();
      s.p->host_weight = Tensor();
    }
    regions.clear();
    if (slab != nullptr) host->deallocate(slab, slab_bytes);
  }

  Tensor host_f32(float* base, const Slot& s) const {
    return Tensor(base + s.offset, s.p->shape, DType::kF32, Device::kCpu);
  }
  Tensor host_grad(const Slot& s) const { return host_f32(grad, s); }
  // Where the updated working weights come from on the host.
  Tensor host_weights(const Slot& s) const {
    if (s.dtype == DType::kF32) return host_f32(master, s);
    return Tensor(stage + s.stage_byte, s.p->shape, s.dtype, Device::kCpu);
  }

  // D2H copies of the slots' gradients on the copy stream, after the compute stream's work so
  // far (which produced them); one event marks the batch.
  void copy_grads(LayerContext& ctx, const std::vector<std::size_t>& which) {
    if (which.empty()) return;
    const ScopedRange r(RangeKind::kOffload, range_ids().grads_to_host);
    finish_update();  // a delayed update may still read the staging
    const EventHandle produced = be->record_event(ctx.stream);
    be->wait_event(copy, produced);
    be->release_event(produced);
    for (std::size_t i : which) {
      Slot& s = slots[i];
      if (s.n > 0) be->copy(copy, s.p->grad.view(), host_grad(s));
      s.copied = true;
    }
    grad_events.push_back(be->record_event(copy));
  }

  void copy_remaining_grads(LayerContext& ctx) {
    std::vector<std::size_t> rest;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      if (!slots[i].copied) rest.push_back(i);
    }
    copy_grads(ctx, rest);
  }

  // The host holds every gradient copy queued so far.
  void sync_grads() {
    for (EventHandle e : grad_events) {
      be->synchronize_event(e);
      be->release_event(e);
    }
    grad_events.clear();
  }
  void wait_grads() {
    sync_grads();
    for (Slot& s : slots) s.copied = false;
  }

  // The gradients are dropped: the compute stream waits for copies still reading them.
  void drop_grads(LayerContext& ctx) {
    if (!grad_events.empty()) {
      be->wait_event(ctx.stream, grad_events.back());  // FIFO: the last covers the rest
      for (EventHandle e : grad_events) be->release_event(e);
      grad_events.clear();
    }
    for (Slot& s : slots) s.copied = false;
    if (ring) ring->reset(ctx);
    if (wring) wring->reset(ctx);
  }

  // H2D copies of the updated weights; the compute stream waits for them, and so does the host
  // before the next update writes the staging (or masters) they read. Under weight offload the
  // ring's buffers go stale instead: each use fetches the new weights.
  void copy_weights_back(LayerContext& ctx) {
    if (wring) {
      wring->invalidate();
      return;
    }
    const ScopedRange r(RangeKind::kOffload, range_ids().weights_to_device);
    const auto t0 = Clock::now();
    for (const Slot& s : slots) {
      if (s.n > 0) be->copy(copy, host_weights(s), s.p->weight.view());
    }
    const EventHandle done = be->record_event(copy);
    be->wait_event(ctx.stream, done);
    pending_h2d.push_back(done);
    timing.copy_back_s = seconds_since(t0);
  }
  void wait_h2d() {
    for (EventHandle e : pending_h2d) {
      be->synchronize_event(e);
      be->release_event(e);
    }
    pending_h2d.clear();
  }

  double run_adamw(const AdamWConstants& k) {
    // On the calling thread or, for a delayed update, on std::async's: each has its own stack.
    const ScopedRange r(RangeKind::kOffload, range_ids().host_adamw);
    const auto t0 = Clock::now();
    if (dry) return 0;
    for (const Run& r : runs) {
      if (r.n == 0) continue;
      AdamWBuffers b;
      b.n = r.n;
      b.param = master + r.offset;
      b.exp_avg = exp_avg + r.offset;
      b.exp_avg_sq = exp_avg_sq + r.offset;
      b.grad = grad + r.offset;
      b.grad_dtype = DType::kF32;
      if (r.dtype != DType::kF32) {
        b.param_out = stage + slots[r.first].stage_byte;
        b.out_dtype = r.dtype;
      }
      adamw_step(k, b, options.threads);
    }
    return seconds_since(t0);
  }

  // Waits for a delayed update's AdamW (not its copy-back).
  void finish_update() {
    if (update.valid()) timing.adamw_s = update.get();  // rethrows what the update threw
  }
  // Waits for a delayed update and copies its weights back, once.
  void land_update(LayerContext& ctx) {
    finish_update();
    if (!update_unlanded) return;
    update_unlanded = false;
    copy_weights_back(ctx);
  }
};

OffloadOptimizer::OffloadOptimizer(std::vector<Parameter*> params, OffloadOptions options,
                                   LayerContext& ctx, MemoryProvider& host)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.host = &host;
  m.dry = host.kind() == MemoryKind::kNone;
  m.options = options;
  (void)adamw_constants(options.adamw, 1);  // validates the options: InvalidArgument
  if (options.threads < 0) {
    bad("threads = " + std::to_string(options.threads) + "; valid: >= 0 (0: OpenMP's default)");
  }
  // Validate everything before anything moves.
  if (options.gradients && options.stages.empty()) {
    bad("gradient offload needs the model's backward stages (OffloadOptions::stages = "
        "model.backward_stages())");
  }
  if (options.weights && options.units.empty()) {
    bad("weight offload needs the model's weight units (OffloadOptions::units = "
        "model.weight_units())");
  }
  if (options.weights && options.delayed_update) {
    bad("weight offload with a delayed update: the update in flight would rewrite the host "
        "weights the next step fetches; valid: one of the two");
  }
  std::size_t stage_bytes = 0;
  for (Parameter* p : params) {
    if (p == nullptr) bad("a null Parameter in the list");
    if (m.index.count(p) != 0) {
      bad("parameter '" + p->name + "' listed twice; valid: each parameter once (a tied one too)");
    }
    const Tensor& w = p->weight.view();
    const Tensor& g = p->grad.view();
    const std::int64_t n = p->numel();
    // Under gradient (weight) offload a parameter needs no device gradient (weight): any it
    // has is released.
    const bool grad_needed = !options.gradients;
    const bool weight_needed = !options.weights;
    if ((weight_needed && (w.numel() != n || (n > 0 && w.raw() == nullptr))) ||
        (grad_needed && (g.numel() != n || (n > 0 && g.raw() == nullptr)))) {
      bad("parameter '" + p->name + "' " + p->shape.str() + " has no weight" +
          (grad_needed ? " or gradient" : "") + " of that size; valid: allocate_parameter() first");
    }
    if ((p->weight_on_device() && w.device() != ctx.device()) ||
        (p->grad_on_device() && g.device() != ctx.device())) {
      bad("parameter '" + p->name + "' lives on " + device_name(w.device()) + "; valid: on " +
          device_name(ctx.device()) + ", the context's device");
    }
    if (p->grad_on_device() && g.dtype() != DType::kF32) {
      bad("parameter '" + p->name + "': gradient must be f32");
    }
    if (p->master_on_device() &&
        (p->master.view().dtype() != DType::kF32 || p->master.view().numel() != n)) {
      bad("parameter '" + p->name + "': master must be f32 of the weight's size");
    }
    // A weight not on the device (a model built for weight offload) is in the context's dtype.
    Impl::Slot s{p, m.total, static_cast<std::size_t>(n),
                 p->weight_on_device() ? w.dtype() : ctx.dtype, 0};
    if (s.dtype != DType::kF32) {
      // A run of one dtype is contiguous in the staging; a new run starts aligned.
      if (m.slots.empty() || m.slots.back().dtype != s.dtype)
        stage_bytes = checked_align_up(stage_bytes, kAlign, "OffloadOptimizer staging");
      s.stage_byte = stage_bytes;
      stage_bytes = checked_add(stage_bytes, checked_mul(s.n, dtype_size(s.dtype), "staging"),
                                "OffloadOptimizer weight staging");
    }
    m.total = checked_add(m.total, s.n, "OffloadOptimizer parameter count");
    m.index.emplace(p, m.slots.size());
    m.slots.push_back(s);
  }
  for (std::size_t i = 0; i < m.slots.size(); ++i) {
    const Impl::Slot& s = m.slots[i];
    if (m.runs.empty() || m.runs.back().dtype != s.dtype) {
      m.runs.push_back({i, i + 1, s.offset, s.n, s.dtype});
    } else {
      m.runs.back().last = i + 1;
      m.runs.back().n += s.n;
    }
  }
  const std::size_t f32_region = checked_align_up(
      checked_mul(m.total, 4, "OffloadOptimizer masters"), kAlign, "OffloadOptimizer host slab");
  m.slab_bytes = checked_add(checked_mul(f32_region, 4, "OffloadOptimizer host slab"),
                             checked_align_up(stage_bytes, kAlign, "OffloadOptimizer host slab"),
                             "OffloadOptimizer host slab");
  if (m.slab_bytes > 0) {
    OomInfo info;
    info.requested_bytes = m.slab_bytes;
    info.budget_bytes = options.host_budget;
    info.host = true;
    const std::string what = format_bytes(m.slab_bytes) + " of " + host.name() + " memory for " +
                             std::to_string(m.total) +
                             " parameters (masters, Adam moments, gradients, staging)";
    if (options.host_budget > 0 && m.slab_bytes > options.host_budget) {
      throw OutOfMemory("OffloadOptimizer: " + what + " exceed the host budget of " +
                            format_bytes(options.host_budget),
                        info);
    }
    m.slab = host.allocate(m.slab_bytes);
    if (m.slab == nullptr) {
      throw OutOfMemory("OffloadOptimizer: " + what + " are not available", info);
    }
    auto* base = static_cast<unsigned char*>(m.slab);
    m.master = reinterpret_cast<float*>(base);
    m.exp_avg = reinterpret_cast<float*>(base + f32_region);
    m.exp_avg_sq = reinterpret_cast<float*>(base + 2 * f32_region);
    m.grad = reinterpret_cast<float*>(base + 3 * f32_region);
    m.stage = base + 4 * f32_region;
    if (!m.dry) std::memset(m.exp_avg, 0, 2 * f32_region);  // moments start at 0 (and grads)
    // ZeRO's accounting: FP32 masters and moments are optimizer state.
    m.slab_by_category[category_index(Category::kOptimizerState)] = 3 * f32_region;
    m.slab_by_category[category_index(Category::kGradient)] = f32_region;
    m.slab_by_category[category_index(Category::kParameter)] = m.slab_bytes - 4 * f32_region;
    if (!m.dry) {
      m.regions.emplace_back(Category::kOptimizerState, f32_region, "fp32_masters");
      m.regions.emplace_back(Category::kOptimizerState, 2 * f32_region, "adam_moments");
      m.regions.emplace_back(Category::kGradient, f32_region, "gradients");
      m.regions.emplace_back(Category::kParameter, m.slab_bytes - 4 * f32_region, "weight_staging");
    }
  }
  m.be = &ctx.backend;
  m.copy = ctx.backend.create_stream();

  // Masters to the host: the device master when there is one, else the weight itself (f32),
  // else the weight widened (a low-precision weight with no master: all there is). Under
  // weight offload a low-precision device weight goes to the staging as it is too. A model
  // built without device weights has no values yet: Model::init writes them on the host.
  for (Impl::Slot& s : m.slots) {
    if (s.n == 0 || (!s.p->weight_on_device() && !s.p->master_on_device())) continue;
    if (s.p->master_on_device()) {
      m.be->copy(ctx.stream, s.p->master.view(), m.host_f32(m.master, s));
      if (options.weights && s.dtype != DType::kF32 && s.p->weight_on_device()) {
        m.be->copy(ctx.stream, s.p->weight.view(), m.host_weights(s));
      }
    } else if (s.dtype == DType::kF32) {
      m.be->copy(ctx.stream, s.p->weight.view(), m.host_f32(m.master, s));
    } else {
      m.be->copy(ctx.stream, s.p->weight.view(), m.host_weights(s));
    }
  }
  m.be->synchronize(ctx.stream);
  for (Impl::Slot& s : m.slots) {
    if (!m.dry && s.n > 0 && s.p->weight_on_device() && !s.p->master_on_device() &&
        s.dtype != DType::kF32) {
      convert(m.host_weights(s).raw(), s.dtype, m.master + s.offset, DType::kF32, s.n);
    }
    if (options.weights && !m.dry && s.n > 0 && s.dtype != DType::kF32 &&
        s.p->master_on_device() && !s.p->weight_on_device()) {
      // A device master without a device weight: the host weight is its rounding.
      convert(m.master + s.offset, DType::kF32, m.host_weights(s).raw(), s.dtype, s.n);
    }
    s.p->master.reset();
    s.p->host_master = m.host_f32(m.master, s);  // Model::init writes fresh values here
    if (options.weights) {
      s.p->weight.reset();  // the host copy replaces it
      s.p->host_weight = m.host_weights(s);
    }
  }
  if (options.gradients) {
    std::vector<GradRing::Home> homes;
    homes.reserve(m.slots.size());
    for (Impl::Slot& s : m.slots) {
      s.p->grad.reset();  // the host's gradient region replaces it
      homes.push_back({s.p, m.grad + s.offset});
    }
    m.ring = std::make_unique<GradRing>(ctx, m.copy, std::move(homes), options.stages,
                                        options.grad_buckets);
  }
  if (options.weights) {
    for (const auto& unit : options.units) {
      for (const Parameter* p : unit) {
        if (m.index.count(p) == 0) {
          bad("weight unit parameter '" + (p ? p->name : std::string("(null)")) +
              "' is not one this optimizer holds");
        }
      }
    }
    m.wring = std::make_unique<WeightRing>(ctx, options.units, options.weight_buffers);
  }
}

OffloadOptimizer::~OffloadOptimizer() = default;

void OffloadOptimizer::grads_ready(LayerContext& ctx, const std::vector<Parameter*>& params) {
  Impl& m = *impl_;
  if (m.ring) return;  // after_stage() of the last micro-batch sent them already
  std::vector<std::size_t> which;
  which.reserve(params.size());
  for (const Parameter* p : params) {
    auto it = m.index.find(p);
    if (it == m.index.end()) {
      bad("grads_ready: parameter '" + (p ? p->name : std::string("(null)")) +
          "' is not one this optimizer was built over");
    }
    // A repeat (a tied parameter reported by each user) copies again: the later values win.
    which.push_back(it->second);
  }
  m.copy_grads(ctx, which);
}

void OffloadOptimizer::before_stage(LayerContext& ctx, int stage, int micro_batch, int count) {
  Impl& m = *impl_;
  if (!m.ring) return;
  (void)count;
  // The step's first copy into the gradient region: a delayed update may still read it.
  if (stage == 0 && micro_batch == 0) m.finish_update();
  m.ring->before_stage(ctx, stage, micro_batch == 0);
}

void OffloadOptimizer::after_stage(LayerContext& ctx, int stage, int micro_batch, int count) {
  Impl& m = *impl_;
  if (!m.ring) return;
  const std::vector<std::size_t>& sent = m.ring->after_stage(ctx, stage);
  if (micro_batch + 1 == count) {
    for (std::size_t i : sent) m.slots[i].copied = true;  // GradRing's homes are the slots
    m.grad_events.push_back(m.be->record_event(m.copy));
  }
}

void OffloadOptimizer::before_use(LayerContext& ctx, int unit, int next) {
  if (impl_->wring) impl_->wring->before_use(ctx, unit, next);
}

void OffloadOptimizer::after_use(LayerContext& ctx, int unit) {
  if (impl_->wring) impl_->wring->after_use(ctx, unit);
}

SumSqResult OffloadOptimizer::grads_sumsq(LayerContext& ctx) {
  Impl& m = *impl_;
  (void)ctx;
  if (!m.ring) {
    bad("grads_sumsq: the gradients are on the device (no gradient offload); use "
        "grads_sumsq(ctx, params) from policies/loss_scaler.h");
  }
  m.sync_grads();
  if (m.dry) return {};
  // The CPU backend's sumsq (core/cpu/sumsq.h), parameter by parameter in the model's order,
  // gathered as grads_sumsq(ctx, params) gathers it on the device. The same bits as the
  // device's check on the CPU backend, so clipping under gradient offload trains bit for bit as
  // without it there (a CUDA device's sumsq adds in another order: the norms differ in their
  // last bits). Every (parameter, block) pair is one task: small parameters cost no team each.
  constexpr std::int64_t kBlock = kSumSqBlock;
  struct Task {
    std::int64_t begin, end;  // element range in the gradient region
  };
  std::vector<Task> tasks;
  std::vector<std::size_t> first;  // each parameter's first task
  for (const Impl::Slot& sl : m.slots) {
    if (sl.n == 0) continue;
    first.push_back(tasks.size());
    const auto off = static_cast<std::int64_t>(sl.offset), n = static_cast<std::int64_t>(sl.n);
    for (std::int64_t b = 0; b < n; b += kBlock) {
      tasks.push_back({off + b, off + std::min(n, b + kBlock)});
    }
  }
  first.push_back(tasks.size());
  std::vector<double> sums(tasks.size(), 0.0);
  std::vector<std::int64_t> bad(tasks.size(), 0);
  const float* g = m.grad;
  const auto count = static_cast<std::int64_t>(tasks.size());
#pragma omp parallel for schedule(static) if (m.total >= 2 * kBlock)
  for (std::int64_t t = 0; t < count; ++t) {
    const Task& k = tasks[static_cast<std::size_t>(t)];
    double sum = 0.0;
    std::int64_t nf = 0;
    sumsq_block(g + k.begin, k.end - k.begin, sum, nf);
    sums[static_cast<std::size_t>(t)] = sum;
    bad[static_cast<std::size_t>(t)] = nf;
  }
  float slot[2] = {0.0f, 0.0f};
  for (std::size_t k = 0; k + 1 < first.size(); ++k) {
    double total = 0.0;
    std::int64_t nonfinite = 0;
    for (std::size_t t = first[k]; t < first[k + 1]; ++t) {
      total += sums[t];
      nonfinite += bad[t];
    }
    slot[0] = static_cast<float>(static_cast<double>(slot[0]) + total);
    slot[1] = static_cast<float>(static_cast<double>(slot[1]) + static_cast<double>(nonfinite));
  }
  return read_sumsq(Tensor(slot, Shape{kSumSqSlots}, DType::kF32, Device::kCpu));
}

void OffloadOptimizer::abandon_step(LayerContext& ctx) { impl_->drop_grads(ctx); }

std::size_t OffloadOptimizer::grad_device_bytes() const {
  return impl_->ring ? impl_->ring->device_bytes() : 0;
}

std::size_t OffloadOptimizer::weight_device_bytes() const {
  return impl_->wring ? impl_->wring->device_bytes() : 0;
}

const WeightRing* OffloadOptimizer::weight_ring() const { return impl_->wring.get(); }

void OffloadOptimizer::step(LayerContext& ctx, double grad_scale) {
  Impl& m = *impl_;
  const AdamWConstants k = adamw_constants(m.options.adamw, m.steps + 1, grad_scale);
  m.timing = Timing{};
  m.land_update(ctx);
  if (m.ring) {
    for (const Impl::Slot& s : m.slots) {
      if (!s.copied) {
        bad("step(): the gradient of '" + s.p->name +
            "' never left the device: gradient "
            "offload needs before_stage()/after_stage() around every stage of the last "
            "micro-batch");
      }
    }
  } else {
    m.copy_remaining_grads(ctx);
  }
  const auto t0 = Clock::now();
  {
    const ScopedRange r(RangeKind::kOffload, range_ids().wait_grads);
    m.wait_grads();  // FIFO: the H2D copies queued before them are done too
  }
  m.timing.wait_grads_s = seconds_since(t0);
  m.wait_h2d();                   // already complete; releases their events
  if (m.wring) m.wring->drain();  // the update rewrites the host weights the fetches read
  if (m.options.delayed_update) {
    // The masters, moments and staging belong to the update until finish_update(); the next
    // gradient copy, optimizer call, state() or flush() waits for it. The step counts once the
    // update is started: a thread that cannot be made (std::system_error) leaves steps as it was.
    m.update = std::async(std::launch::async, [&m, k] { return m.run_adamw(k); });
    ++m.steps;
    m.update_unlanded = true;
    return;
  }
  ++m.steps;
  m.timing.adamw_s = m.run_adamw(k);
  m.copy_weights_back(ctx);
}

void OffloadOptimizer::skip(LayerContext& ctx) {
  flush(ctx);  // a delayed update of an earlier step still lands
  impl_->drop_grads(ctx);
}

void OffloadOptimizer::flush(LayerContext& ctx) { impl_->land_update(ctx); }

std::int64_t OffloadOptimizer::steps() const { return impl_->steps; }

void OffloadOptimizer::set_steps(std::int64_t steps) {
  if (steps < 0) bad("set_steps(" + std::to_string(steps) + "); valid: >= 0");
  impl_->steps = steps;
}

std::vector<StateTensor> OffloadOptimizer::state() {
  Impl& m = *impl_;
  m.finish_update();  // the host tensors must hold the last update's values
  m.wait_h2d();       // and a load may overwrite what a copy-back still reads
  if (m.wring) m.wring->drain();  // or what a fetch still reads
  std::vector<StateTensor> out;
  out.reserve(3 * m.slots.size());
  for (const Impl::Slot& s : m.slots)
    out.push_back({"master/" + s.p->name, m.host_f32(m.master, s)});
  for (const Impl::Slot& s : m.slots) {
    out.push_back({"exp_avg/" + s.p->name, m.host_f32(m.exp_avg, s)});
  }
  for (const Impl::Slot& s : m.slots) {
    out.push_back({"exp_avg_sq/" + s.p->name, m.host_f32(m.exp_avg_sq, s)});
  }
  return out;
}

void OffloadOptimizer::state_loaded(LayerContext& ctx) {
  Impl& m = *impl_;
  m.finish_update();  // obsolete now: its copy-back is dropped
  m.update_unlanded = false;
  m.wait_h2d();
  m.drop_grads(ctx);
  if (m.wring) m.wring->drain();
  for (const Impl::Slot& s : m.slots) {
    if (!m.dry && s.n > 0 && s.dtype != DType::kF32) {
      convert(m.master + s.offset, DType::kF32, m.host_weights(s).raw(), s.dtype, s.n);
    }
  }
  m.copy_weights_back(ctx);
}

const AdamWOptions& OffloadOptimizer::options() const { return impl_->options.adamw; }

void OffloadOptimizer::set_lr(double lr) {
  AdamWOptions o = impl_->options.adamw;
  o.lr = lr;
  (void)adamw_constants(o, 1);  // InvalidArgument for a bad lr; nothing changes then
  impl_->options.adamw = o;
}

CategoryBytes OffloadOptimizer::host_by_category() const { return impl_->slab_by_category; }

OffloadOptimizer::Timing OffloadOptimizer::last_timing() const { return impl_->timing; }

}  // namespace memfit
