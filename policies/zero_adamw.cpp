#include "policies/zero_adamw.h"

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "memory/error.h"
#include "profiler/scoped_range.h"

namespace memfit {

namespace {

std::uint32_t range_id() {
  static const std::uint32_t id = intern_name("zero_adamw");
  return id;
}

}  // namespace

ZeroAdamW::ZeroAdamW(std::vector<Parameter*> params, AdamWOptions options, int stage,
                     std::vector<Model::BackwardStage> stages, Communicator& comm,
                     LayerContext& ctx)
    : params_(std::move(params)),
      options_(options),
      stage_(stage),
      comm_(comm),
      overlap_(comm, /*on=*/true) {
  build(ctx, std::move(stages));
  // All state now, so step() never allocates (core/optimizer.h); an OutOfMemory unwinds it.
  const int n = comm_.size(), r = comm_.rank();
  master_.resize(params_.size());
  exp_avg_.reserve(params_.size());
  exp_avg_sq_.reserve(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const Chunk c = chunk(p.numel(), n, r);
    const Shape shape{c.count};
    if (p.weight.view().dtype() != DType::kF32) {
      master_[i] = OwnedTensor::empty(ctx.alloc, shape, DType::kF32, ctx.device(),
                                      Category::kOptimizerState, ctx.stream, "master/" + p.name);
    }
    exp_avg_.push_back(OwnedTensor::empty(ctx.alloc, shape, DType::kF32, ctx.device(),
                                          Category::kOptimizerState, ctx.stream,
                                          "exp_avg/" + p.name));
    exp_avg_sq_.push_back(OwnedTensor::empty(ctx.alloc, shape, DType::kF32, ctx.device(),
                                             Category::kOptimizerState, ctx.stream,
                                             "exp_avg_sq/" + p.name));
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ctx.backend.fill(ctx.stream, exp_avg_[i].view(), 0.0f);
    ctx.backend.fill(ctx.stream, exp_avg_sq_[i].view(), 0.0f);
    // Bound once everything is allocated: a failed construction leaves no binding behind.
    if (master_[i].view().raw() != nullptr) {
      params_[i]->shard_master = master_[i].view();
      params_[i]->shard_offset = chunk(params_[i]->numel(), n, r).offset;
    }
  }
}

ZeroAdamW::ZeroAdamW(std::vector<Parameter*> params, const OffloadOptions& offload, int stage,
                     std::vector<Model::BackwardStage> stages, Communicator& comm,
                     LayerContext& ctx, MemoryProvider& host)
    : params_(std::move(params)),
      options_(offload.adamw),
      stage_(stage),
      comm_(comm),
      overlap_(comm, /*on=*/true) {
  if (offload.gradients || offload.weights || offload.delayed_update) {
    throw InvalidArgument(
        "ZeroAdamW with optimizer offload: gradient offload, weight offload and the delayed "
        "update are not built for ZeRO-1/2 yet; valid: offload optimizer (and activations)");
  }
  build(ctx, std::move(stages));
  // One stand-in per parameter: this rank's chunk of its device weight and its reduced
  // gradient; the OffloadOptimizer moves its masters and moments to pinned host memory.
  const int n = comm_.size(), r = comm_.rank();
  std::vector<Parameter*> stand_ins;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    auto c = std::make_unique<Parameter>();
    c->name = p.name;
    c->shape = Shape{chunk(p.numel(), n, r).count};
    c->weight = OwnedTensor::borrow(chunk_view(p.weight.view(), n, r));
    c->grad = OwnedTensor::borrow(grad_chunk(i));
    c->placed = true;
    stand_ins.push_back(c.get());
    chunks_.push_back(std::move(c));
  }
  OffloadOptions o = offload;
  o.stages.clear();
  o.units.clear();
  offload_ = std::make_unique<OffloadOptimizer>(stand_ins, std::move(o), ctx, host);
  // Model::init writes this rank's chunk of a fresh model straight into the host masters.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    params_[i]->shard_master = chunks_[i]->host_master;
    params_[i]->shard_offset = chunk(params_[i]->numel(), n, r).offset;
  }
}

void ZeroAdamW::build(LayerContext& ctx, std::vector<Model::BackwardStage> stages) {
  (void)adamw_constants(options_, 1, 1.0);  // InvalidArgument naming a bad option, first
  if (stage_ != 1 && stage_ != 2) {
    throw InvalidArgument("ZeroAdamW: stage " + std::to_string(stage_) +
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
    const bool grad_ok = stage_ == 1 ? p->grad_on_device() : !p->grad_on_device();
    if (w.device() != ctx.device() || p->master_on_device() || !grad_ok) {
      throw InvalidArgument("ZeroAdamW (stage " + std::to_string(stage_) + "): parameter '" +
                            p->name + "' was not built for it (weight on " +
                            device_name(w.device()) + ", device master " +
                            (p->master_on_device() ? "yes" : "no") + ", device gradient " +
                            (p->grad_on_device() ? "yes" : "no") +
                            "); valid: a model built with Trainer::placement(policy, stage)");
    }
    if (p->numel() < comm_.size()) {
      throw InvalidArgument("ZeroAdamW: parameter '" + p->name + "' has " +
                            std::to_string(p->numel()) + " elements, fewer than the " +
                            std::to_string(comm_.size()) +
                            " ranks; valid: at most as many "
                            "ranks as the smallest parameter has elements");
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
                              p->name +
                              "' as final; valid: each parameter final in exactly one "
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
  if (stage_ == 2) {
    const int n = comm_.size(), r = comm_.rank();
    grad_shard_.resize(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Parameter& p = *params_[i];
      grad_shard_[i] =
          OwnedTensor::empty(ctx.alloc, Shape{chunk(p.numel(), n, r).count}, DType::kF32,
                             ctx.device(), Category::kGradient, ctx.stream, "grad_shard/" + p.name);
    }
  }
}

ZeroAdamW::~ZeroAdamW() {
  if (!overlap_.idle()) overlap_.abandon(stream_);  // sums in flight read lent gradients
  release_lent();
  for (Parameter* p : params_) {
    p->shard_master = Tensor();
    p->shard_offset = 0;
  }
}

const char* ZeroAdamW::name() const {
  if (offload_) return stage_ == 1 ? "zero1-offload-adamw" : "zero2-offload-adamw";
  return stage_ == 1 ? "zero1-adamw" : "zero2-adamw";
}

void ZeroAdamW::grads_ready(LayerContext&, const std::vector<Parameter*>&) {
  // after_stage sends this rank's reduced chunks to the host once their sums are finished.
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
    p.grad = OwnedTensor::empty(ctx.alloc, p.shape, DType::kF32, ctx.device(), Category::kGradient,
                                ctx.stream, p.name);
    ctx.backend.fill(ctx.stream, p.grad.view(), 0.0f);
  }
}

void ZeroAdamW::after_stage(LayerContext& ctx, int stage, int micro_batch, int count) {
  stream_ = ctx.stream;
  const std::vector<std::size_t>& done = finals_.at(static_cast<std::size_t>(stage));
  const bool last_micro_batch = micro_batch + 1 == count;
  // Stage 1: whole gradients accumulate over the micro-batches; the last one's are reduced in
  // place. Stage 2: every micro-batch's are reduced into the shards (the first writes them, a
  // later one's sums arrive in a temporary and are added).
  if (stage_ == 1 && !last_micro_batch) return;
  if (!overlap_.on()) {  // one parameter at a time, each finished before the next
    for (const std::size_t i : done) {
      Parameter& p = *params_[i];
      if (stage_ == 1) {
        comm_.reduce_scatter_sum(ctx.stream, p.grad.view(), grad_chunk(i));
      } else if (micro_batch == 0) {
        comm_.reduce_scatter_sum(ctx.stream, p.grad.view(), grad_shard_[i].view());
      } else {
        OwnedTensor sum =
            OwnedTensor::empty(ctx.alloc, grad_shard_[i].view().shape(), DType::kF32, ctx.device(),
                               Category::kTemporary, ctx.stream, "grad_recv/" + p.name);
        comm_.reduce_scatter_sum(ctx.stream, p.grad.view(), sum.view());
        ctx.backend.axpy(ctx.stream, 1.0f, sum.view(), grad_shard_[i].view());
      }
      if (stage_ == 2) p.grad.reset();
    }
    if (last_micro_batch) send_chunks(ctx, done);
    return;
  }
  Communicator::Ticket t = 0;
  std::vector<std::shared_ptr<OwnedTensor>> sums;  // stage 2, micro-batch > 0: per `done`
  try {
    for (const std::size_t i : done) {
      Parameter& p = *params_[i];
      if (stage_ == 1) {
        t = comm_.start_reduce_scatter_sum(ctx.stream, p.grad.view(), grad_chunk(i));
      } else if (micro_batch == 0) {
        t = comm_.start_reduce_scatter_sum(ctx.stream, p.grad.view(), grad_shard_[i].view());
      } else {
        sums.push_back(std::make_shared<OwnedTensor>(
            OwnedTensor::empty(ctx.alloc, grad_shard_[i].view().shape(), DType::kF32, ctx.device(),
                               Category::kTemporary, ctx.stream, "grad_recv/" + p.name)));
        t = comm_.start_reduce_scatter_sum(ctx.stream, p.grad.view(), sums.back()->view());
      }
    }
  } catch (...) {
    // The sums started before the failure use `sums` until they finish.
    try {
      if (comm_.last_ticket() > 0) comm_.finish(ctx.stream, comm_.last_ticket());
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
  // Once the sums are finished: add the received ones, hand the lent gradients back, send the
  // final chunks to the host (offload).
  const auto then = [this, &ctx, &done, sums, last_micro_batch] {
    if (stage_ == 2) {
      for (std::size_t k = 0; k < done.size(); ++k) {
        const std::size_t i = done[k];
        if (!sums.empty()) {
          ctx.backend.axpy(ctx.stream, 1.0f, sums[k]->view(), grad_shard_[i].view());
        }
        params_[i]->grad.reset();
      }
    }
    if (last_micro_batch) send_chunks(ctx, done);
  };
  overlap_.stage_done(ctx.stream, t, then, static_cast<std::size_t>(stage) + 1 == finals_.size());
}

void ZeroAdamW::send_chunks(LayerContext& ctx, const std::vector<std::size_t>& done) {
  if (!offload_) return;
  std::vector<Parameter*> mine;
  mine.reserve(done.size());
  for (const std::size_t i : done) mine.push_back(chunks_[i].get());
  offload_->grads_ready(ctx, mine);
}

void ZeroAdamW::set_overlap(bool on) { overlap_.set_on(on); }

Tensor ZeroAdamW::grad_chunk(std::size_t i) const {
  if (stage_ == 2) return grad_shard_[i].view();
  return chunk_view(params_[i]->grad.view(), comm_.size(), comm_.rank());
}

void ZeroAdamW::gather_weights(LayerContext& ctx) {
  const int n = comm_.size(), r = comm_.rank();
  for (Parameter* p : params_) {
    comm_.all_gather(ctx.stream, chunk_view(p->weight.view(), n, r), p->weight.view());
  }
}

void ZeroAdamW::step(LayerContext& ctx, double grad_scale) {
  const ScopedRange range(RangeKind::kOptimizer, range_id());
  if (offload_) {
    offload_->step(ctx, grad_scale);  // the chunks' weights are back (the stream waits on them)
    gather_weights(ctx);
    return;
  }
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
  gather_weights(ctx);
  ++steps_;
}

void ZeroAdamW::skip(LayerContext& ctx) {
  release_lent();  // the shards are rewritten by the next step's first micro-batch
  if (offload_) offload_->skip(ctx);
}

void ZeroAdamW::flush(LayerContext& ctx) {
  if (offload_) offload_->flush(ctx);
}

void ZeroAdamW::abandon_step(LayerContext& ctx) {
  overlap_.abandon(ctx.stream);  // the sums in flight use the lent gradients until they finish
  release_lent();
  if (offload_) offload_->abandon_step(ctx);
}

CategoryBytes ZeroAdamW::host_by_category() const {
  return offload_ ? offload_->host_by_category() : CategoryBytes{};
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
  const std::vector<double> all =
      gather_values(comm_, mine.nonfinite ? std::numeric_limits<double>::infinity() : mine.sum_sq);
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
  if (offload_) {
    offload_->set_steps(steps);
  } else {
    steps_ = steps;
  }
}

std::vector<StateTensor> ZeroAdamW::state() {
  if (offload_) return offload_->state();
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
  if (offload_) {
    offload_->state_loaded(ctx);  // this rank's chunks of the working weights
    gather_weights(ctx);
    return;
  }
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
  AdamWOptions o = options_;
  o.lr = lr;
  (void)adamw_constants(o, 1);  // InvalidArgument for a bad lr; nothing changes then
  if (offload_) offload_->set_lr(lr);
  options_ = o;
}

}  // namespace memfit
