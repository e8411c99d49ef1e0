#include "policies/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "core/device_adamw.h"
#include "memory/check.h"
#include "memory/error.h"
#include "memory/pinned_host_provider.h"
#include "memory/size.h"
#include "policies/accumulation.h"
#include "policies/offload_activation_stash.h"
#include "policies/offload_optimizer.h"
#include "policies/stage_overlap.h"
#include "policies/zero_adamw.h"
#include "profiler/scoped_range.h"

namespace memfit {

namespace {

// The sum over ranks of `v`, in rank order, in double: the same on every rank.
double sum_over_ranks(Communicator& comm, double v) {
  double sum = 0;
  for (double x : gather_values(comm, v)) sum += x;
  return sum;
}

// The global batch's B*T under data parallel: InvalidArgument naming the ranks when the
// shards differ (every rank must hold the same number of samples of the same length).
std::int64_t global_rows(Communicator& comm, const Batch& batch) {
  const std::int64_t mine = batch.batch * batch.seq_len;
  const std::vector<double> all = gather_values(comm, static_cast<double>(mine));
  std::string shards;
  bool equal = true;
  for (std::size_t r = 0; r < all.size(); ++r) {
    equal = equal && all[r] == all[0];
    shards += (r ? ", " : "") + std::to_string(static_cast<std::int64_t>(all[r]));
  }
  if (!equal) {  // every rank sees the same figures, so every rank refuses
    throw InvalidArgument("data parallel step on rank " + std::to_string(comm.rank()) + " of " +
                          std::to_string(comm.size()) + ": the ranks' shards differ (B*T by "
                          "rank: " + shards + "); valid: the same samples and seq_len on every "
                          "rank (a global batch divisible by the ranks)");
  }
  return mine * comm.size();
}

// The data Rng must not replay the numbers Model::init drew from the same seed.
constexpr std::uint64_t kDataSeedSalt = 0xD6E8FEB86659FD93ull;

LossScalerOptions scaler_options(const TrainerOptions& o, DType dtype) {
  LossScalerOptions s = o.scaler;
  if (o.scaler_auto) s.enabled = dtype == DType::kF16;
  return s;
}

const TrainerOptions& validated(const TrainerOptions& o) {
  o.policy.validate();
  if (!std::isfinite(o.max_grad_norm) || o.max_grad_norm < 0) {
    throw InvalidArgument("trainer max_grad_norm " + std::to_string(o.max_grad_norm) +
                          "; valid: a finite norm > 0 to clip gradients to, or 0 for no clipping");
  }
  return o;
}

// A host int32 array seen as f32 so Backend::copy (floating dtypes only) moves its bits: copy
// never converts, it moves bytes (memcpy on the CPU, cudaMemcpy on CUDA).
Tensor bits_view(const std::int32_t* p, std::int64_t n, Device d) {
  return Tensor(const_cast<std::int32_t*>(p), Shape{n}, DType::kF32, d);
}

// One micro-batch's tokens and targets on the device (Category::kInput).
struct DeviceBatch {
  Block tokens, targets;
  MicroBatch mb;
};

DeviceBatch upload(LayerContext& ctx, const Batch& b, std::int64_t row0, std::int64_t rows) {
  const std::int64_t n = rows * b.seq_len;
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(std::int32_t);
  const std::size_t off = static_cast<std::size_t>(row0 * b.seq_len);
  DeviceBatch d;
  d.tokens = ctx.alloc.allocate(bytes, Category::kInput, ctx.stream, "tokens");
  d.targets = ctx.alloc.allocate(bytes, Category::kInput, ctx.stream, "targets");
  const auto* tok = static_cast<const std::int32_t*>(d.tokens.data());
  const auto* tgt = static_cast<const std::int32_t*>(d.targets.data());
  ctx.backend.copy(ctx.stream, bits_view(b.tokens.data() + off, n, Device::kCpu),
                   bits_view(tok, n, ctx.device()));
  ctx.backend.copy(ctx.stream, bits_view(b.targets.data() + off, n, Device::kCpu),
                   bits_view(tgt, n, ctx.device()));
  d.mb.tokens = IndexTensor{tok, Shape{rows, b.seq_len}, ctx.device()};
  d.mb.targets = IndexTensor{tgt, Shape{rows, b.seq_len}, ctx.device()};
  return d;
}

std::string options_json(const TrainerOptions& o, const Schedule& s, const Trainer::Sharding& sh) {
  nlohmann::json j;
  j["ranks"] = sh.ranks;
  j["rank"] = sh.rank;
  j["zero_stage"] = sh.zero_stage;
  j["checkpoint"] = o.policy.checkpoint.name();
  j["schedule"] = s.name();
  j["micro_batch"] = o.policy.micro_batch;
  j["accum"] = o.policy.accum;
  j["offload"] = o.policy.offload.optimizer;
  j["offload_gradients"] = o.policy.offload.gradients;
  j["offload_weights"] = o.policy.offload.weights;
  j["offload_activations"] = o.policy.offload.activations;
  j["delayed_update"] = o.policy.offload.delayed_update;
  j["loss"] = loss_mode_name(o.policy.loss);
  j["adamw"] = {{"lr", o.adamw.lr},
                {"beta1", o.adamw.beta1},
                {"beta2", o.adamw.beta2},
                {"eps", o.adamw.eps},
                {"weight_decay", o.adamw.weight_decay}};
  j["seed"] = o.seed;
  if (o.max_grad_norm > 0) j["max_grad_norm"] = o.max_grad_norm;
  return j.dump();
}

}  // namespace

struct Trainer::Offload {
  // Page-locked through the CUDA driver when the model is on a GPU (the offload copies are
  // then truly asynchronous); mlock otherwise, so CPU training in a CUDA build on a GPU
  // machine does not create a CUDA context (and its device memory) for nothing.
  explicit Offload(Device d)
      : pinned(d == Device::kCuda ? PinnedHostProvider::Mode::kCudaHostAlloc
                                  : PinnedHostProvider::Mode::kMlock) {}
  PinnedHostProvider pinned;
};

Trainer::Trainer(Model& model, LayerContext ctx, TrainerOptions options, MemoryProvider* host)
    : model_(model),
      ctx_(ctx),
      options_(validated(options)),
      schedule_(options_.policy.checkpoint.schedule(model.num_blocks())),
      rng_(options_.seed ^ kDataSeedSalt),
      scaler_(scaler_options(options_, ctx.dtype)) {
  if (ctx_.dtype != model_.dtype() || ctx_.device() != model_.device()) {
    throw InvalidArgument(std::string("trainer context (") + dtype_name(ctx_.dtype) + " on " +
                          device_name(ctx_.device()) + ") does not match the model's (" +
                          dtype_name(model_.dtype()) + " on " + device_name(model_.device()) + ")");
  }
  if (options_.policy.dtype != ctx_.dtype) {
    throw InvalidArgument(std::string("trainer policy dtype ") + dtype_name(options_.policy.dtype) +
                          " differs from the context's " + dtype_name(ctx_.dtype) +
                          "; valid: the dtype the model was built with");
  }
  model_.head().set_loss(options_.policy.loss);
  // The optimizer first: an offloading one binds host masters that init() then fills.
  const OffloadSwitches& off = options_.policy.offload;
  const bool stash = off.activations && !checkpoint_reads(schedule_, model_.num_blocks()).empty();
  if ((off.optimizer || stash) && host == nullptr) {
    offload_ = std::make_unique<Offload>(ctx_.device());
    host = &offload_->pinned;
  }
  if (options_.zero_stage != 0) {
    if (options_.zero_stage < 0 || options_.zero_stage > 2) {
      throw InvalidArgument("trainer zero_stage " + std::to_string(options_.zero_stage) +
                            "; valid: 0 (data parallel), 1 (optimizer state sharded) or 2 "
                            "(gradients too)");
    }
    if (off.gradients || off.weights || off.delayed_update) {
      throw InvalidArgument("ZeRO-" + std::to_string(options_.zero_stage) + " with " +
                            "offload " + options_.policy.offload.describe() +
                            ": sharded gradient and weight offload and the delayed update are "
                            "not built yet; valid: ZeRO-1/2 with offload optimizer (and "
                            "activations), or any offload with ZeRO-0");
    }
    Communicator* comm = options_.comm;
    if (comm == nullptr) {
      own_comm_ = std::make_unique<LocalCommunicator>(ctx_.backend);
      comm = own_comm_.get();
    }
    std::unique_ptr<ZeroAdamW> opt;
    if (off.optimizer) {  // each rank's chunks of the masters and moments on its host
      OffloadOptions o;
      o.adamw = options_.adamw;
      o.host_budget = options_.host_budget;
      opt = std::make_unique<ZeroAdamW>(model_.parameters(), o, options_.zero_stage,
                                        model_.backward_stages(), *comm, ctx_, *host);
    } else {
      opt = std::make_unique<ZeroAdamW>(model_.parameters(), options_.adamw, options_.zero_stage,
                                        model_.backward_stages(), *comm, ctx_);
    }
    opt->set_overlap(options_.overlap_comm && comm->size() > 1);  // nothing to hide at one rank
    zero_opt_ = opt.get();
    optimizer_ = std::move(opt);
  } else if (off.optimizer) {
    OffloadOptions o;
    o.adamw = options_.adamw;
    o.delayed_update = off.delayed_update;
    o.gradients = off.gradients;
    o.grad_buckets = options_.grad_buckets;
    if (off.gradients) o.stages = model_.backward_stages();
    o.weights = off.weights;
    o.weight_buffers = options_.weight_buffers;
    o.host_budget = options_.host_budget;
    if (off.weights) o.units = model_.weight_units();
    auto opt = std::make_unique<OffloadOptimizer>(model_.parameters(), std::move(o), ctx_, *host);
    offload_opt_ = opt.get();
    optimizer_ = std::move(opt);
    // A model built with device masters or gradients (not placement(policy)) just lost them;
    // hand their segments back so the reserved bytes (what a budget limits) show the saving.
    if (model_.placement() != placement(options_.policy)) ctx_.alloc.empty_cache();
  } else {
    optimizer_ = std::make_unique<DeviceAdamW>(model_.parameters(), options_.adamw, ctx_);
  }
  if (stash) stash_ = std::make_unique<ActivationStash>(ctx_, *host);
  if (options_.init_model) model_.init(options_.seed, ctx_);
}

ParamPlacement Trainer::placement(const MemoryPolicy& policy, int zero_stage) {
  return ParamPlacement{.weight = !policy.offload.weights,
                        .master = !policy.offload.optimizer && zero_stage < 1,
                        .grad = !policy.offload.gradients && zero_stage < 2};
}

Trainer::~Trainer() {
  if (optimizer_) {
    try {
      optimizer_->flush(ctx_);
    } catch (...) {  // a destructor must not throw; the weights are being dropped anyway
    }
  }
}

std::int64_t Trainer::steps() const { return optimizer_->steps(); }

Trainer::Sharding Trainer::sharding() const {
  const Communicator* c = zero_opt_ != nullptr ? &zero_opt_->comm() : options_.comm;
  return {c != nullptr ? c->size() : 1, c != nullptr ? c->rank() : 0, options_.zero_stage};
}

CategoryBytes Trainer::host_by_category() const {
  CategoryBytes b = optimizer_->host_by_category();
  if (stash_) b[category_index(Category::kActivation)] += stash_->host_bytes();
  return b;
}

void Trainer::set_repeat_check(RepeatCheck check) {
  if (check && ctx_.device() != Device::kMeta) {
    throw InvalidArgument(std::string("Trainer::set_repeat_check is for dry runs on the meta "
                                      "backend; this trainer runs on ") +
                          device_name(ctx_.device()));
  }
  repeat_check_ = std::move(check);
}

std::int64_t Trainer::steps_attempted() const { return attempted_; }

namespace {

void check_batch(const Batch& b, const ModelSpec& spec) {
  if (b.batch < 1 || b.seq_len < 1) {
    throw InvalidArgument("batch (" + std::to_string(b.batch) + " x " + std::to_string(b.seq_len) +
                          "): both sizes must be >= 1");
  }
  (void)spec.resolve_seq_len(b.seq_len);  // the one check of a sequence length
  const std::size_t n = checked_mul(static_cast<std::size_t>(b.batch),
                                    static_cast<std::size_t>(b.seq_len), "batch * seq_len");
  if (b.tokens.size() != n || b.targets.size() != n) {
    throw InvalidArgument("batch of " + std::to_string(b.batch) + " x " +
                          std::to_string(b.seq_len) + " needs " + std::to_string(n) +
                          " tokens and targets; it has " + std::to_string(b.tokens.size()) +
                          " and " + std::to_string(b.targets.size()));
  }
}

// "micro_batch 0", "micro_batch 1", ...: interned once each (a step reuses the same few).
std::uint32_t micro_batch_name(std::size_t m) {
  return intern_name("micro_batch " + std::to_string(m));
}

// One name for every step: a name per step number would grow the process-wide table of
// interned names by one every step of a long run.
std::uint32_t step_name() {
  static const std::uint32_t id = intern_name("step");
  return id;
}

}  // namespace

StepResult Trainer::step(const Batch& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  const ScopedRange step_range(RangeKind::kStep, step_name());
  check_batch(batch, model_.spec());
  const std::vector<std::int64_t> sizes = options_.policy.micro_batches(batch.batch);
  Communicator* const dp = options_.comm != nullptr && options_.comm->size() > 1 ? options_.comm
                                                                                  : nullptr;
  const std::int64_t rows = dp ? global_rows(*dp, batch) : batch.batch * batch.seq_len;
  const double scale = scaler_.scale();
  // Every micro-batch's loss gradient is scale / (B*T): the mean over the global batch, so an
  // uneven last micro-batch is weighted by its row count (policies/accumulation.h).
  const auto dloss = static_cast<float>(scale / static_cast<double>(rows));

  const std::vector<Parameter*> params = model_.parameters();
  const std::vector<Model::BackwardStage> stages = model_.backward_stages();
  const int count = static_cast<int>(sizes.size());

  ctx_.alloc.reset_peak_stats();
  Executor ex(model_, ctx_);
  bool reported = false;  // grads_ready() was called: the optimizer may hold copies in flight
  bool lent = false;      // before_stage/use() was called: gradient or weight offload lent memory
  double loss_sum = 0;
  bool found_inf = false;
  const bool clip = options_.max_grad_norm > 0;
  double grad_norm = 0;
  std::optional<StageOverlap> dp_overlap;  // ZeRO-0 over ranks, in the last micro-batch
  try {
    if (stash_) {
      // Room for every checkpoint of the largest micro-batch (blocks map (B,T,hidden) to
      // (B,T,hidden) in the compute dtype), before anything of the step runs.
      const std::size_t bytes = checked_mul(
          checked_mul(static_cast<std::size_t>(*std::max_element(sizes.begin(), sizes.end())),
                      static_cast<std::size_t>(batch.seq_len), "checkpoint"),
          checked_mul(static_cast<std::size_t>(model_.spec().hidden), dtype_size(ctx_.dtype),
                      "checkpoint"),
          "checkpoint bytes");
      stash_->reserve(ctx_, checkpoint_reads(schedule_, model_.num_blocks()), bytes,
                      options_.host_budget, optimizer_->host_bytes());
    }
    model_.zero_grad(ctx_);
    std::int64_t row0 = 0;
    for (std::size_t m = 0; m < sizes.size(); ++m) {
      const ScopedRange mb_range(RangeKind::kMicroBatch, micro_batch_name(m));
      DeviceBatch d = upload(ctx_, batch, row0, sizes[m]);
      const int mi = static_cast<int>(m);
      ExecutorHooks hooks;
      hooks.before_stage = [&](int s) {
        lent = true;
        optimizer_->before_stage(ctx_, s, mi, count);
      };
      hooks.before_use = [&](int u, int next) {
        lent = true;
        optimizer_->before_use(ctx_, u, next);
      };
      hooks.after_use = [&](int u) { optimizer_->after_use(ctx_, u); };
      if (stash_) {
        hooks.stash = [&](int i, Act& x) { stash_->put(ctx_, i, x); };
        hooks.unstash = [&](int i, int next) { return stash_->take(ctx_, i, next); };
      }
      hooks.after_stage = [&](int s) {
        const std::vector<Parameter*>* final = &stages[static_cast<std::size_t>(s)].final;
        const auto done = [&, s, final] {
          optimizer_->after_stage(ctx_, s, mi, count);
          // The last micro-batch: each stage's gradients are final once its backward ran.
          if (mi + 1 == count) {
            reported = true;
            optimizer_->grads_ready(ctx_, *final);
          }
        };
        // ZeRO-0: the stage's gradients are final: sum them beside the next stage's backward,
        // and tell the optimizer once they are summed (ZeRO-1/2's optimizer scatters).
        if (dp_overlap) {
          Communicator::Ticket t = 0;
          for (Parameter* p : *final) t = dp->start_all_reduce_sum(ctx_.stream, p->grad);
          dp_overlap->stage_done(ctx_.stream, t, done,
                                 static_cast<std::size_t>(s) + 1 == stages.size());
        } else {
          done();
        }
      };
      if (dp != nullptr && zero_opt_ == nullptr && mi + 1 == count) {
        // Gradient (and weight) offload's device buckets are a ring the next stage refills:
        // a stage's sums must finish before it moves on.
        const OffloadSwitches& off = options_.policy.offload;
        dp_overlap.emplace(*dp, options_.overlap_comm && !off.gradients && !off.weights);
      }
      const Act losses = ex.run(schedule_, d.mb, dloss, hooks);
      MEMFIT_CHECK(!dp_overlap || dp_overlap->idle()) << "gradient sums left unfinished";
      MEMFIT_CHECK(!stash_ || stash_->idle()) << "a checkpoint left stashed after a micro-batch";
      loss_sum += sum_losses(ctx_, *losses);
      row0 += sizes[m];
      if (repeat_check_ && m + 2 < sizes.size() && repeat_check_(static_cast<std::int64_t>(m))) {
        // The rest of the full micro-batches would repeat this one (meta backend: no values).
        for (std::size_t k = m + 1; k + 1 < sizes.size(); ++k) row0 += sizes[k];
        m = sizes.size() - 2;
      }
    }
    if (scaler_.enabled() || clip) {
      const SumSqResult g = zero_opt_ != nullptr ? zero_opt_->grads_sumsq(ctx_)
                            : options_.policy.offload.gradients ? offload_opt_->grads_sumsq(ctx_)
                                                                : grads_sumsq(ctx_, params);
      grad_norm = std::sqrt(g.sum_sq) / scale;  // +inf when the f32 sum overflowed
      found_inf = g.nonfinite || (clip && !std::isfinite(grad_norm));
      if (g.nonfinite) grad_norm = std::numeric_limits<double>::infinity();
    }
  } catch (...) {
    // Nothing of the training state changed yet: drop what the optimizer was told, if anything
    // (skip() leaves parameters, moments and steps as they are), and let the error through.
    // An offloading optimizer abandons the step instead, reported gradients or not: skip() would
    // land the previous step's delayed update now, and the retried step would then compute
    // with weights one update newer than the same step without the failure.
    // First the sums in flight: they read and write gradients until they finish.
    if (dp_overlap) dp_overlap->abandon(ctx_.stream);
    model_.release_saved();
    if (stash_) stash_->reset(ctx_);
    try {
      if (offload_opt_ != nullptr) {
        if (reported || lent) offload_opt_->abandon_step(ctx_);
      } else if (zero_opt_ != nullptr) {
        if (reported || lent) zero_opt_->abandon_step(ctx_);  // lent gradients, copies in flight
      } else if (reported) {
        optimizer_->skip(ctx_);
      }
    } catch (...) {  // the original error is the one to report
    }
    throw;
  }

  const LossScalerState before = scaler_.state();
  const bool skip = scaler_.update(found_inf);
  const bool clipped = !skip && clip && grad_norm > options_.max_grad_norm;
  try {
    const ScopedRange opt_range(RangeKind::kOptimizer);
    if (skip) {
      optimizer_->skip(ctx_);
    } else {
      // Clipping scales the update's gradients as clip_grad_norm_ scales them in place.
      const double coef = clipped ? options_.max_grad_norm / (grad_norm + 1e-6) : 1.0;
      optimizer_->step(ctx_, coef / scale);
    }
  } catch (...) {
    scaler_.set_state(before);
    throw;
  }
  ++attempted_;

  StepResult r;
  r.step = attempted_;
  if (dp != nullptr) loss_sum = sum_over_ranks(*dp, loss_sum);
  r.loss = loss_sum / static_cast<double>(rows);
  r.loss_scale = scale;
  r.skipped = skip;
  r.grad_norm = grad_norm;
  r.clipped = clipped;
  r.tokens = rows;
  r.micro_batches = static_cast<std::int64_t>(sizes.size());
  r.peaks = PeakFigures::of(ctx_.alloc.stats());
  r.peaks.host_at_peak = host_by_category();
  r.peaks.host_pinned = total_bytes(r.peaks.host_at_peak);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

double Trainer::evaluate(const Batch& batch) {
  check_batch(batch, model_.spec());
  optimizer_->flush(ctx_);
  // Pieces no larger than a training micro-batch; any batch size works (no split into K).
  const MemoryPolicy& pol = options_.policy;
  std::int64_t piece = pol.micro_batch > 0 ? pol.micro_batch : batch.batch;
  if (pol.accum > 0) piece = std::max<std::int64_t>(1, batch.batch / pol.accum);
  const std::vector<std::int64_t> sizes = micro_batch_split(batch.batch, piece);
  Executor ex(model_, ctx_);
  ExecutorHooks hooks;  // weight offload fetches each unit's weights for its use
  hooks.before_use = [&](int u, int next) { optimizer_->before_use(ctx_, u, next); };
  hooks.after_use = [&](int u) { optimizer_->after_use(ctx_, u); };
  double sum = 0;
  std::int64_t row0 = 0;
  try {
    for (const std::int64_t rows : sizes) {
      DeviceBatch d = upload(ctx_, batch, row0, rows);
      const Act losses = ex.forward_only(d.mb, hooks);
      sum += sum_losses(ctx_, *losses);
      row0 += rows;
    }
  } catch (...) {
    if (offload_opt_ != nullptr) {
      try {
        offload_opt_->abandon_step(ctx_);  // takes lent weights back; no gradients were lent
      } catch (...) {                      // the original error is the one to report
      }
    }
    throw;
  }
  return sum / static_cast<double>(batch.batch * batch.seq_len);
}

// ---- save / load ------------------------------------------------------------------------------

void Trainer::save(const std::string& path, const SaveOptions& o) {
  // A delayed update in flight would leave masters a step ahead of the working weights.
  optimizer_->flush(ctx_);
  TrainStateMeta meta;
  meta.model_spec = model_.spec().to_yaml();
  meta.dtype = dtype_name(ctx_.dtype);
  meta.optimizer = optimizer_->name();
  meta.options_json = options_json(options_, schedule_, sharding());
  meta.steps = optimizer_->steps();
  meta.attempted = attempted_;
  meta.scaler_enabled = scaler_.enabled();
  meta.scaler = scaler_.state();
  meta.rng = rng_.state();
  // The optimizer's state holds the FP32 values (masters, or f32 weights) and the moments; the
  // working weights are those rounded (state_loaded() rebuilds them), so they are not saved.
  write_train_state(path, meta, optimizer_->state(), ctx_.backend, ctx_.stream, o);
}

void Trainer::load(const std::string& path) {
  const TrainStateFile f = TrainStateFile::read(path);
  const TrainStateMeta& m = f.meta();
  auto refuse = [&](const std::string& what) {
    throw TrainStateError("training state '" + path + "': " + what);
  };
  // The same model: the same spec, whichever attention algorithm computes it (flash and
  // materialized attention have the same parameters; specs saved before the `attention` key
  // existed read as flash).
  ModelSpec saved;
  try {
    saved = ModelSpec::from_yaml_string(m.model_spec, path);
  } catch (const ConfigError& e) {
    refuse(std::string("its model spec does not parse: ") + e.what());
  }
  saved.attention = model_.spec().attention;
  if (saved.to_yaml() != model_.spec().to_yaml()) {
    refuse("saved from a different model:\n" + m.model_spec + "this trainer's model is:\n" +
           model_.spec().to_yaml());
  }
  if (m.dtype != dtype_name(ctx_.dtype)) {
    refuse("saved with compute dtype " + m.dtype + "; this trainer uses " + dtype_name(ctx_.dtype) +
           " (resume with the dtype the state was saved with)");
  }
  {
    // Files saved before ranks existed read as one rank, ZeRO-0. Under ZeRO-0 every rank holds
    // the same state, so any rank count resumes it; ZeRO-1/2 files hold one rank's chunks.
    Sharding saved_sh;
    const nlohmann::json j = nlohmann::json::parse(m.options_json, nullptr, false);
    const auto get = [&](const char* key, int fallback) {
      if (!j.is_object() || !j.contains(key)) return fallback;
      const nlohmann::json& v = j[key];
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > (1 << 24)) {
        refuse(std::string("its options say ") + key + " " + v.dump() +
               "; valid: a whole number from 0 to 2^24 (the file is damaged)");
      }
      return static_cast<int>(v.get<std::int64_t>());
    };
    saved_sh.ranks = get("ranks", 1);
    saved_sh.rank = get("rank", 0);
    saved_sh.zero_stage = get("zero_stage", 0);
    const Sharding mine = sharding();
    if (saved_sh.zero_stage != mine.zero_stage ||
        (mine.zero_stage > 0 && (saved_sh.ranks != mine.ranks || saved_sh.rank != mine.rank))) {
      auto text = [](const Sharding& x) {
        return "ZeRO-" + std::to_string(x.zero_stage) +
               (x.zero_stage > 0 ? " rank " + std::to_string(x.rank) + " of " +
                                       std::to_string(x.ranks)
                                 : std::string(" (any rank count)"));
      };
      refuse("saved by " + text(saved_sh) + "; this trainer is " + text(mine) +
             " (resume with the ranks and ZeRO stage the state was saved with, each rank "
             "its own file)");
    }
  }
  if (m.optimizer != optimizer_->name()) {
    refuse("saved with optimizer " + m.optimizer + "; this trainer uses " + optimizer_->name() +
           " (resume with the optimizer offload the saving run had)");
  }
  if (m.steps < 0 || m.attempted < m.steps) refuse("step counts are inconsistent");
  if (const Sharding sh = sharding(); sh.ranks > 1 && sh.zero_stage > 0) {
    // One save's set: a crash between two ranks' writes would leave files of different steps.
    // Every rank sees every rank's counts, so every rank refuses alike.
    Communicator& comm = zero_opt_->comm();
    const std::vector<double> steps = gather_values(comm, static_cast<double>(m.steps));
    const std::vector<double> tried = gather_values(comm, static_cast<double>(m.attempted));
    std::string by_rank;
    bool same = true;
    for (std::size_t r = 0; r < steps.size(); ++r) {
      same = same && steps[r] == steps[0] && tried[r] == tried[0];
      by_rank += (r ? ", " : "") + std::to_string(static_cast<std::int64_t>(steps[r]));
    }
    if (!same) {
      refuse("the ranks' files are from different saves (steps by rank: " + by_rank +
             "); valid: the files one save wrote, one per rank");
    }
  }
  {
    LossScaler probe(scaler_.options());  // set_state validates; nothing may throw after restore
    probe.set_state(m.scaler);
    Rng probe_rng;
    probe_rng.set_state(m.rng);
  }
  optimizer_->flush(ctx_);
  f.restore(optimizer_->state(), ctx_.backend, ctx_.stream);
  optimizer_->set_steps(m.steps);
  optimizer_->state_loaded(ctx_);
  scaler_.set_state(m.scaler);
  rng_.set_state(m.rng);
  attempted_ = m.attempted;
}

}  // namespace memfit
