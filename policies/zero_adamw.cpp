#include "policies/zero_adamw.h"

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "memory/error.h"
#include "profiler/scoped_range.h"

namespace memfit {

namespace {

void check_lr(double lr) {
  if (!(lr >= 0.0) || !std::isfinite(lr)) {
    throw InvalidArgument("ZeroAdamW: lr = " + std::to_string(lr) +
                          "; valid: a finite value >= 0");
  }
}

std::uint32_t range_id() {
  static const std::uint32_t id = intern_name("zero_adamw");
  return id;
}

}  // namespace

ZeroAdamW::ZeroAdamW(std::vector<Parameter*> params, AdamWOptions options, int stage,
                     std::vector<Model::BackwardStage> stages, Communicator& comm,
                     LayerContext& ctx)
    : params_(std::move(params)), options_(options), stage_(stage), comm_(comm) {
  (void)adamw_constants(options_, 1, 1.0);  // InvalidArgument naming a bad option, first
  if (stage != 1 && stage != 2) {
    throw InvalidArgument("ZeroAdamW: stage " + std::to_string(stage) +
                          "; valid: 1 (optimizer state sharded) or 2 (gradients too)");
  }
  std::map<const Parameter*, std::size_t> index;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter* p = params_[i];
    if (p == nullptr) {
      throw InvalidArgument("ZeroAdamW: parameter " + std::to_string(i) +
                            " is null; valid: the model's parameters");
    }
    if (!index.emplace(p, i).second) {
      throw InvalidArgument("ZeroAdamW: parameter '" + p->name +
                            "' listed twice; valid: each parameter once (a tied one too)");
    }
    const Tensor& w = p->weight.view();
    const bool grad_ok = stage == 1 ? p->grad_on_device() : !p->grad_on_device();
    if (w.device() != ctx.device() || p->master_on_device() || !grad_ok) {
      throw InvalidArgument("ZeroAdamW (stage " + std::to_string(stage) + "): parameter '" +
                            p->name + "' was not built for it (weight on " +
                            device_name(w.device()) + ", device master " +
                            (p->master_on_device() ? "yes" : "no") + ", device gradient " +
                            (p->grad_on_device() ? "yes" : "no") +
                            "); valid: a model built with Trainer::placement(policy, stage)");
    }
  }
  // Each parameter's stages: where it is first written (stage 2 lends its gradient there) and
  // where it is final (reduced there).
  opens_.resize(stages.size());
  finals_.resize(stages.size());
  std::set<const Parameter*> opened, finished;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    for (const Parameter* p : stages[s].writes) {
      const auto it = index.find(p);
      if (it == index.end()) {
        throw InvalidArgument("ZeroAdamW: backward stage " + std::to_string(s) + " writes '" +
                              p->name + "', which is not among the optimizer's parameters");
      }
      if (opened.insert(p).second) opens_[s].push_back(it->second);
    }
    for (const Parameter* p : stages[s].final) {
      const auto it = index.find(p);
      if (it == index.end() || !opened.count(p) || !finished.insert(p).second) {
        throw InvalidArgument("ZeroAdamW: backward stage " + std::to_string(s) + " lists '" +
                              p->name + "' as final; valid: each parameter final in exactly one "
                              "stage, at or after the first stage that writes it");
      }
      finals_[s].push_back(it->second);
    }
  }
  if (finished.size() != params_.size()) {
    throw InvalidArgument("ZeroAdamW: " + std::to_string(params_.size() - finished.size()) +
                          " parameters are final in no backward stage; valid: the model's "
                          "backward_stages()");
  }
  // All state now, so step() never allocates (core/optimizer.h); an OutOfMemory unwinds it.
  const int n = comm_.size(), r = comm_.rank();
  master_.resize(params_.size());
  exp_avg_.reserve(params_.size());
  exp_avg_sq_.reserve(params_.size());
  grad_shard_.resize(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const Chunk c = chunk(p.numel(), n, r);
    if (c.count == 0) {
      throw InvalidArgument("ZeroAdamW: parameter '" + p.name + "' has " +
                            std::to_string(p.numel()) + " elements, fewer than the " +
                            std::to_string(n) + " ranks; valid: at most as many ranks as the "
                            "smallest parameter has elements");
    }
    const Shape shape{c.count};
    if (p.weight.view().dtype() != DType::kF32) {
      master_[i] = OwnedTensor::empty(ctx.alloc, shape, DType::kF32, ctx.device(),
                                      Category::kOptimizerState, ctx.stream, "master/" + p.name);
      p.shard_master = master_[i].view();
      p.shard_offset = c.offset;
    }
    exp_avg_.push_back(OwnedTensor::empty(ctx.alloc, shape, DType::kF32, ctx.device(),
                                          Category::kOptimizerState, ctx.stream,
                                          "exp_avg/" + p.name));
    exp_avg_sq_.push_back(OwnedTensor::empty(ctx.alloc, shape, DType::kF32, ctx.device(),
                                             Category::kOptimizerState, ctx.stream,
                                             "exp_avg_sq/" + p.name));
    if (stage_ == 2) {
      grad_shard_[i] = OwnedTensor::empty(ctx.alloc, shape, DType::kF32, ctx.device(),
                                          Category::kGradient, ctx.stream, "grad_shard/" + p.name);
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ctx.backend.fill(ctx.stream, exp_avg_[i].view(), 0.0f);
    ctx.backend.fill(ctx.stream, exp_avg_sq_[i].view(), 0.0f);
  }
}

ZeroAdamW::~ZeroAdamW() {
  release_lent();
  for (Parameter* p : params_) {
    p->shard_master = Tensor();
    p->shard_offset = 0;
  }
}

void ZeroAdamW::release_lent() {
  if (stage_ != 2) return;
  for (Parameter* p : params_) p->grad.reset();
}

void ZeroAdamW::before_stage(LayerContext& ctx, int stage, int micro_batch, int count) {
  (void)micro_batch, (void)count;
  if (stage_ != 2) return;
  for (const std::size_t i : opens_.at(static_cast<std::size_t>(stage))) {
    Parameter& p = *params_[i];
    p.grad = OwnedTensor::empty(ctx.alloc, p.shape, DType::kF32, ctx.device(),
                                Category::kGradient, ctx.stream, p.name);
    ctx.backend.fill(ctx.stream, p.grad.view(), 0.0f);
  }
}

void ZeroAdamW::after_stage(LayerContext& ctx, int stage, int micro_batch, int count) {
  const std::vector<std::size_t>& done = finals_.at(static_cast<std::size_t>(stage));
  if (stage_ == 1) {
    // Whole gradients accumulate over the micro-batches; the last one's are reduced in place.
    if (micro_batch + 1 != count) return;
    for (const std::size_t i : done) {
      const Tensor g = params_[i]->grad.view();
      comm_.reduce_scatter_sum(ctx.stream, g, grad_chunk(i));
    }
    return;
  }
  for (const std::size_t i : done) {
    Parameter& p = *params_[i];
    if (micro_batch == 0) {
      comm_.reduce_scatter_sum(ctx.stream, p.grad.view(), grad_shard_[i].view());
    } else {
      OwnedTensor sum = OwnedTensor::empty(ctx.alloc, grad_shard_[i].view().shape(), DType::kF32,
                                           ctx.device(), Category::kTemporary, ctx.stream,
                                           "grad_recv/" + p.name);
      comm_.reduce_scatter_sum(ctx.stream, p.grad.view(), sum.view());
      ctx.backend.axpy(ctx.stream, 1.0f, sum.view(), grad_shard_[i].view());
    }
    p.grad.reset();
  }
}

Tensor ZeroAdamW::grad_chunk(std::size_t i) const {
  if (stage_ == 2) return grad_shard_[i].view();
  return chunk_view(params_[i]->grad.view(), comm_.size(), comm_.rank());
}

void ZeroAdamW::step(LayerContext& ctx, double grad_scale) {
  const ScopedRange range(RangeKind::kOptimizer, range_id());
  const AdamWConstants k = adamw_constants(options_, steps_ + 1, grad_scale);
  const int n = comm_.size(), r = comm_.rank();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const Tensor weight = chunk_view(p.weight.view(), n, r);
    if (master_[i].view().raw() != nullptr) {
      ctx.backend.adamw(ctx.stream, k, master_[i].view(), grad_chunk(i), exp_avg_[i].view(),
                        exp_avg_sq_[i].view(), &weight);
    } else {
      ctx.backend.adamw(ctx.stream, k, weight, grad_chunk(i), exp_avg_[i].view(),
                        exp_avg_sq_[i].view(), nullptr);
    }
  }
  for (Parameter* p : params_) {
    comm_.all_gather(ctx.stream, chunk_view(p->weight.view(), n, r), p->weight.view());
  }
  ++steps_;
}

void ZeroAdamW::skip(LayerContext& ctx) {
  (void)ctx;  // the shards are rewritten by the next step's first micro-batch
  release_lent();
}

SumSqResult ZeroAdamW::grads_sumsq(LayerContext& ctx) {
  if (ctx.device() == Device::kMeta) return {};
  Backend& be = ctx.backend;
  Block slots = ctx.alloc.allocate(kSumSqSlots * sizeof(float), Category::kTemporary, ctx.stream,
                                   "zero.sumsq");
  const Tensor dev(slots.data(), Shape{kSumSqSlots}, DType::kF32, ctx.device());
  be.fill(ctx.stream, dev, 0.0f);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = grad_chunk(i);
    if (g.numel() > 0) be.sumsq(ctx.stream, g, dev);
  }
  float host[kSumSqSlots] = {0.0f, 0.0f};
  const Tensor out(host, Shape{kSumSqSlots}, DType::kF32, Device::kCpu);
  be.copy(ctx.stream, dev, out);
  be.synchronize(ctx.stream);
  const SumSqResult mine = read_sumsq(out);
  // Every rank's figures in rank order; a non-finite rank counts as +inf.
  const std::vector<double> all = gather_values(
      comm_, mine.nonfinite ? std::numeric_limits<double>::infinity() : mine.sum_sq);
  SumSqResult total;
  for (const double v : all) {
    if (std::isinf(v)) {
      total.nonfinite = true;
    } else {
      total.sum_sq += v;
    }
  }
  return total;
}

void ZeroAdamW::set_steps(std::int64_t steps) {
  if (steps < 0) {
    throw InvalidArgument("ZeroAdamW::set_steps(" + std::to_string(steps) + "): valid: >= 0");
  }
  steps_ = steps;
}

std::vector<StateTensor> ZeroAdamW::state() {
  std::vector<StateTensor> out;
  out.reserve(3 * params_.size());
  const int n = comm_.size(), r = comm_.rank();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    if (master_[i].view().raw() != nullptr) {
      out.push_back({"master/" + p.name, master_[i].view()});
    } else {
      out.push_back({"weight/" + p.name, chunk_view(p.weight.view(), n, r)});
    }
    out.push_back({"exp_avg/" + p.name, exp_avg_[i].view()});
    out.push_back({"exp_avg_sq/" + p.name, exp_avg_sq_[i].view()});
  }
  return out;
}

void ZeroAdamW::state_loaded(LayerContext& ctx) {
  // Each rank loaded its chunks: round this rank's masters into its chunk of the working
  // weights, then every rank gathers the whole weights.
  const int n = comm_.size(), r = comm_.rank();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const Tensor mine = chunk_view(p.weight.view(), n, r);
    if (master_[i].view().raw() != nullptr) ctx.backend.cast(ctx.stream, master_[i].view(), mine);
    comm_.all_gather(ctx.stream, mine, p.weight.view());
  }
}

void ZeroAdamW::set_lr(double lr) {
  check_lr(lr);
  options_.lr = lr;
}

}  // namespace memfit
