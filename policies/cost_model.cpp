// CostModel, analytic side: per-block costs read from the real layers built on the meta
// backend, static bytes per policy, the checkpoint chain and the step-time model.
// calibrate() and cpu_adamw_rate() are in cost_model_calibrate.cpp.
#include "policies/cost_model.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu/adamw.h"
#include "core/executor.h"  // checkpoint_reads, forwards_for_backward
#include "core/layers/transformer_block.h"
#include "core/meta/meta_backend.h"
#include "core/model.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/null_provider.h"
#include "policies/cost_model_util.h"
#include "policies/offload_grad_ring.h"
#include "policies/offload_weight_ring.h"

namespace memfit {

namespace costmodel {

std::int64_t mul(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw InvalidArgument(std::string("CostModel: ") + what + " overflows int64 (" +
                          std::to_string(a) + " x " + std::to_string(b) +
                          "); valid: a smaller micro-batch or model");
  }
  return r;
}

void check_seq_len(const ModelSpec& spec, std::int64_t seq_len) {
  spec.validate();
  if (seq_len < 1 || seq_len > spec.seq_len) {
    throw InvalidArgument("CostModel: seq_len " + std::to_string(seq_len) + " for model '" +
                          spec.name + "'; valid: 1 to " + std::to_string(spec.seq_len) +
                          " (the model's maximum sequence length)");
  }
}

void read_structure(Model& m, std::vector<std::int64_t>& block_params,
                    std::int64_t& embedding_params, std::int64_t& head_read_params,
                    std::int64_t& params) {
  params = m.parameter_count();
  embedding_params = 0;
  for (Parameter* p : m.embedding_parameters()) embedding_params += p->numel();
  block_params.assign(static_cast<std::size_t>(m.num_blocks()), 0);
  for (int i = 0; i < m.num_blocks(); ++i) {
    for (Parameter* p : m.block_parameters(i))
      block_params[static_cast<std::size_t>(i)] += p->numel();
  }
  head_read_params = 0;
  for (Parameter* p : m.head().parameters()) head_read_params += p->numel();  // tied wte too
}

std::array<std::int64_t, 2> excess_of(Layer& block, std::int64_t seq_len, DType dt) {
  if (auto* t = dynamic_cast<TransformerBlock*>(&block)) {
    const PeakExcess e = t->peaks(seq_len, dt);
    return {e.forward, e.backward};
  }
  if (auto* t = dynamic_cast<LlamaBlock*>(&block)) {
    const PeakExcess e = t->peaks(seq_len, dt);
    return {e.forward, e.backward};
  }
  if (auto* t = dynamic_cast<MLPBlock*>(&block)) {
    const PeakExcess e = t->peaks(seq_len, dt);
    return {e.forward, e.backward};
  }
  const std::int64_t w = block.cost(seq_len, dt).workspace_bytes;  // a user's block: one figure
  return {w, w};
}

}  // namespace costmodel

namespace {

using costmodel::mul;

std::size_t dt_index(DType dt) { return static_cast<std::size_t>(dt); }

constexpr DType kDTypes[3] = {DType::kF32, DType::kF16, DType::kBF16};

std::int64_t align64(std::int64_t n) { return (n + 63) / 64 * 64; }

void check_rates(const DeviceSpec& d, DType dt) {
  const auto bad = [&](const char* what, double v) {
    throw InvalidArgument("CostModel: device '" + d.name + "' has " + what + " = " +
                          std::to_string(v) + "; valid: > 0 (DeviceSpec::load a preset or file)");
  };
  if (!(d.flops(dt) > 0))
    bad(dt == DType::kF32   ? "flops_f32"
        : dt == DType::kF16 ? "flops_f16"
                            : "flops_bf16",
        d.flops(dt));
  if (!(d.mem_bandwidth > 0)) bad("mem_bandwidth", d.mem_bandwidth);
  if (!(d.host_link > 0)) bad("host_link", d.host_link);
}

// One op's seconds: whichever of compute and memory traffic takes longer.
double op_seconds(double flops, double bytes, DType dt, const DeviceSpec& d) {
  return std::max(flops / d.flops(dt), bytes / d.mem_bandwidth);
}

}  // namespace

std::int64_t StaticBytes::device_total() const {
  std::int64_t t = 0;
  for (std::int64_t b : device) t += b;
  return t;
}

CostModel CostModel::analytic(const ModelSpec& spec, std::int64_t seq_len, LossMode loss) {
  costmodel::check_seq_len(spec, seq_len);
  CostModel cm;
  cm.spec_ = spec;
  cm.seq_len_ = seq_len;
  // The real model on the meta backend: parameters get NullProvider addresses, nothing is
  // touched. Layer::cost() takes the dtype, so one model (built in f32) answers for all three.
  MetaBackend meta;
  NullProvider null;
  CachingAllocator alloc(null, {}, &meta.stream_sync());
  LayerContext ctx{meta, alloc, kDefaultStream, DType::kF32};
  Model m(spec, ctx);
  m.head().set_loss(loss);
  costmodel::read_structure(m, cm.block_params_, cm.embedding_params_, cm.head_read_params_,
                            cm.params_);
  const GradRing::Sizes ring = GradRing::sizes(m.backward_stages());
  cm.grad_bucket_bytes_ = static_cast<std::int64_t>(ring.bucket_bytes);
  cm.grad_own_bytes_ = static_cast<std::int64_t>(ring.own_bytes);
  for (DType dt : kDTypes) {
    cm.weight_buffer_bytes_[dt_index(dt)] =
        static_cast<std::int64_t>(WeightRing::buffer_bytes(m.weight_units(), dt));
  }
  const std::size_t n = static_cast<std::size_t>(m.num_blocks());
  cm.blocks_.resize(n);
  cm.block_excess_.resize(n);
  for (DType dt : kDTypes) {
    const std::size_t d = dt_index(dt);
    cm.embedding_[d] = m.embedding_cost(seq_len, dt);
    cm.head_[d] = m.head_cost(seq_len, dt);
    for (std::size_t i = 0; i < n; ++i) {
      cm.blocks_[i][d] = m.block_cost(static_cast<int>(i), seq_len, dt);
      cm.block_excess_[i][d] = costmodel::excess_of(m.block(static_cast<int>(i)), seq_len, dt);
    }
  }
  return cm;
}

std::int64_t CostModel::parameter_count() const { return params_; }
int CostModel::num_blocks() const { return static_cast<int>(blocks_.size()); }
LayerCost CostModel::embedding(DType dt) const { return embedding_[dt_index(dt)]; }
LayerCost CostModel::head(DType dt) const { return head_[dt_index(dt)]; }

LayerCost CostModel::block(int i, DType dt) const {
  if (i < 0 || i >= num_blocks()) {
    throw InvalidArgument("CostModel::block(" + std::to_string(i) + "): valid: 0 to " +
                          std::to_string(num_blocks() - 1));
  }
  return blocks_[static_cast<std::size_t>(i)][dt_index(dt)];
}

StaticBytes CostModel::static_bytes(DType dt, const OffloadSwitches& off) const {
  const bool offload = off.optimizer;
  // As allocate_parameter, DeviceAdamW and OffloadOptimizer allocate them (element bytes; the
  // allocator's rounding is the dry run's business).
  const std::int64_t n = params_;
  const bool mixed = dt != DType::kF32;
  StaticBytes s;
  // Weight offload: WeightRing's buffers (TrainerOptions::weight_buffers' default, 2).
  s.device[static_cast<std::size_t>(Category::kParameter)] =
      off.weights ? mul(kDefaultWeightBuffers, weight_buffer_bytes_[dt_index(dt)], "buffers")
                  : mul(n, static_cast<std::int64_t>(dtype_size(dt)), "weight bytes");
  // Gradient offload: GradRing's buckets (TrainerOptions::grad_buckets' default, 2) and the
  // buffers of parameters written by two stages (a tied wte), not the model's gradients.
  s.device[static_cast<std::size_t>(Category::kGradient)] =
      off.gradients ? grad_own_bytes_ + mul(kDefaultGradBuckets, grad_bucket_bytes_, "buckets")
                    : mul(n, 4, "gradient bytes");
  if (!offload) {
    // DeviceAdamW's two moments, plus the FP32 masters when the weights are not f32.
    s.device[static_cast<std::size_t>(Category::kOptimizerState)] =
        mul(n, mixed ? 12 : 8, "optimizer state bytes");
  } else {
    // OffloadOptimizer's pinned slab: master, exp_avg, exp_avg_sq, gradient staging (f32,
    // each region 64-byte aligned), then weight staging in the compute dtype when not f32.
    s.host_pinned = mul(align64(mul(n, 4, "host bytes")), 4, "host bytes");
    if (mixed)
      s.host_pinned += align64(mul(n, static_cast<std::int64_t>(dtype_size(dt)), "host bytes"));
  }
  return s;
}

Chain CostModel::chain(std::int64_t micro_batch, DType dt, const DeviceSpec& device) const {
  if (micro_batch < 1) {
    throw InvalidArgument("CostModel::chain: micro_batch " + std::to_string(micro_batch) +
                          "; valid: >= 1");
  }
  check_rates(device, dt);
  const std::size_t d = dt_index(dt);
  const std::int64_t b = micro_batch;
  const double wbytes = static_cast<double>(dtype_size(dt));
  Chain c;
  std::int64_t in = embedding_[d].output_bytes;
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const LayerCost& k = blocks_[i][d];
    ChainBlock cb;
    cb.input_bytes = mul(b, in, "block input bytes");
    cb.saved_bytes = mul(b, k.saved_bytes, "saved bytes");
    cb.saves_input = k.saves_input;
    cb.fwd_workspace = mul(b, std::max<std::int64_t>(block_excess_[i][d][0], 0), "workspace");
    cb.bwd_workspace = mul(b, std::max<std::int64_t>(block_excess_[i][d][1], 0), "workspace");
    const double act =
        static_cast<double>(b) * static_cast<double>(in + k.saved_bytes + k.output_bytes);
    const double p = static_cast<double>(block_params_[i]);
    cb.fwd_time = op_seconds(static_cast<double>(b) * static_cast<double>(k.forward_flops),
                             act + p * wbytes, dt, device);
    // Recomputed for its backward (Layer::forward_for_backward): its flops; a layer that
    // overrides it writes no output, the default runs the forward (the weights it reads
    // counted whole: an upper bound).
    const double unwritten =
        k.for_backward_flops >= 0 ? static_cast<double>(b) * static_cast<double>(k.output_bytes)
                                  : 0.0;
    cb.fwd_for_backward_time =
        op_seconds(static_cast<double>(b) * static_cast<double>(k.flops_for_backward()),
                   act - unwritten + p * wbytes, dt, device);
    cb.bwd_time = op_seconds(static_cast<double>(b) * static_cast<double>(k.backward_flops),
                             2 * act + p * (wbytes + 8), dt, device);
    c.blocks.push_back(cb);
    in = k.output_bytes;
  }
  c.output_bytes = mul(b, in, "output bytes");
  const LayerCost& h = head_[d];
  c.head_bytes = mul(b, h.saved_bytes + h.output_bytes + h.workspace_bytes, "head bytes");
  const double hact =
      static_cast<double>(b) * static_cast<double>(in + h.saved_bytes + h.output_bytes);
  const double hp = static_cast<double>(head_read_params_);
  c.head_time = op_seconds(static_cast<double>(b) * static_cast<double>(h.forward_flops),
                           hact + hp * wbytes, dt, device) +
                op_seconds(static_cast<double>(b) * static_cast<double>(h.backward_flops),
                           2 * hact + hp * (wbytes + 8), dt, device);
  return c;
}

namespace {

// What activation offload (ActivationStash) makes the compute wait for in one micro-batch, in
// the executor's order (checkpoint_reads()): after a Keep::kInput forward of block i, x[i] goes
// out over host_link on a copy stream of its own, starting when that forward ends; the next
// checkpoint's put makes the compute wait for the previous one's copy out. A read of the
// latest (still on the device) waits for its copy out; of one fetched ahead, for the fetch;
// otherwise it is fetched now. After a read, the next read's checkpoint is fetched (host ->
// device, a stream of its own direction) from then. Every op takes the chain's time.
double stash_wait(const Schedule& schedule, const Chain& c, const DeviceSpec& device) {
  const std::size_t n = c.blocks.size();
  enum State : std::uint8_t { kNone, kOut, kHost, kFetched };
  std::vector<State> state(n + 1, kNone);
  std::vector<double> done(n + 1, 0);  // kOut: the copy out's end; kFetched: the fetch's
  std::vector<char> kept(n + 1, 0);
  const std::vector<int> reads = checkpoint_reads(schedule, static_cast<int>(n));
  const std::vector<char> for_backward = forwards_for_backward(schedule, static_cast<int>(n));
  std::size_t at = 0;
  int latest = -1;
  double clock = 0, out = 0, in = 0, waited = 0;
  const auto wait_for = [&](double t) {
    if (t > clock) {
      waited += t - clock;
      clock = t;
    }
  };
  const auto fetch = [&](std::size_t i) {
    in = std::max(in, clock) + static_cast<double>(c.blocks[i].input_bytes) / device.host_link;
    done[i] = in;
    state[i] = kFetched;
  };
  bool head_done = false;
  const auto& ops = schedule.ops();
  for (std::size_t j = 0; j < ops.size(); ++j) {
    const ScheduleOp& op = ops[j];
    const auto i = static_cast<std::size_t>(op.block);
    if (op.kind == ScheduleOp::Kind::kBackward) {
      clock += c.blocks[i].bwd_time;
      continue;
    }
    if (kept[i]) {
      ++at;
      if (state[i] == kHost) fetch(i);
      wait_for(done[i]);
      if (latest == op.block) latest = -1;
      state[i] = kNone;
      if (at < reads.size()) {
        const auto next = static_cast<std::size_t>(reads[at]);
        if (state[next] == kHost) fetch(next);
      }
    }
    kept[i] = op.keep == Keep::kInput;
    clock += for_backward[j] ? c.blocks[i].for_backward_time() : c.blocks[i].fwd_time;
    if (op.keep == Keep::kInput) {
      if (latest >= 0) {
        wait_for(done[static_cast<std::size_t>(latest)]);
        state[static_cast<std::size_t>(latest)] = kHost;
      }
      out = std::max(out, clock) + static_cast<double>(c.blocks[i].input_bytes) / device.host_link;
      done[i] = out;
      state[i] = kOut;
      latest = op.block;
    }
    if (!head_done && i + 1 == n) {
      clock += c.head_time;
      head_done = true;
    }
  }
  return waited;
}

}  // namespace

double CostModel::step_seconds(const MemoryPolicy& p, const Schedule& schedule,
                               std::int64_t micro_batch, std::int64_t accum,
                               const DeviceSpec& device) const {
  if (accum < 1) {
    throw InvalidArgument("CostModel::step_seconds: accum " + std::to_string(accum) +
                          "; valid: >= 1");
  }
  schedule.validate(num_blocks());
  const DType dt = p.dtype;
  const Chain c = chain(micro_batch, dt, device);  // checks micro_batch and the rates
  const std::size_t d = dt_index(dt);
  const double b = static_cast<double>(micro_batch);
  const double wbytes = static_cast<double>(dtype_size(dt));

  // Embedding: a gather (forward); backward reads dx and adds into the FP32 gradient rows of
  // the tokens seen (at most B*T of wte's) and wpe's first T rows. No GEMMs.
  const double emb_out = b * static_cast<double>(embedding_[d].output_bytes);
  const double rows =
      std::min(static_cast<double>(spec_.vocab), b * static_cast<double>(seq_len_)) +
      static_cast<double>(seq_len_);
  const double emb_fwd = op_seconds(0, emb_out, dt, device);
  const double emb_bwd =
      op_seconds(0, emb_out + 8.0 * rows * static_cast<double>(spec_.hidden), dt, device);

  // One micro-batch in the executor's order, noting when each stage's gradients are final:
  // the head's own after its backward, block i's after Backward(i), the embedding's (a tied
  // wte included) after the embedding's backward, the last of all.
  const double n = static_cast<double>(params_);
  const double head_own = static_cast<double>(params_ - embedding_params_ - [&] {
    std::int64_t s = 0;
    for (std::int64_t x : block_params_) s += x;
    return s;
  }());
  std::vector<std::pair<double, double>> ready;  // (time, parameters) in the last micro-batch
  // The weight units' uses (Executor's weight_uses): (unit, compute seconds), repeats merged.
  std::vector<std::pair<int, double>> uses;
  const auto use = [&](int unit, double seconds) {
    if (!uses.empty() && uses.back().first == unit) {
      uses.back().second += seconds;
    } else {
      uses.emplace_back(unit, seconds);
    }
  };
  double t = emb_fwd;
  use(0, emb_fwd);
  bool head_done = false;
  const std::vector<char> for_backward = forwards_for_backward(schedule, num_blocks());
  const auto& ops = schedule.ops();
  for (std::size_t j = 0; j < ops.size(); ++j) {
    const ScheduleOp& op = ops[j];
    const ChainBlock& cb = c.blocks[static_cast<std::size_t>(op.block)];
    if (op.kind == ScheduleOp::Kind::kForward) {
      const double ft = for_backward[j] ? cb.for_backward_time() : cb.fwd_time;
      t += ft;
      use(1 + op.block, ft);
      if (!head_done && op.block == num_blocks() - 1) {
        t += c.head_time;  // forward and backward: the head runs as soon as x[n] is held
        use(num_blocks() + 1, c.head_time);
        head_done = true;
        ready.emplace_back(t, head_own);
      }
    } else {
      t += cb.bwd_time;
      use(1 + op.block, cb.bwd_time);
      ready.emplace_back(t, static_cast<double>(block_params_[static_cast<std::size_t>(op.block)]));
    }
  }
  t += emb_bwd;
  use(0, emb_bwd);
  ready.emplace_back(t, static_cast<double>(embedding_params_));
  const double micro = t;
  double total = static_cast<double>(accum) * micro;
  if (p.offload.weights) {
    // WeightRing with two buffers, least recently used first: the fetch of the next use's unit
    // starts when this use starts and its buffer's last reader is done; a use starts when its
    // compute predecessor and its fetch are done. The delay past `micro` is exposed. Each
    // micro-batch is simulated from empty buffers: an upper bound by one or two fetches (the
    // ring still holds what the previous micro-batch used last). The use order is the
    // executor's weight_uses(), walked here beside the ops for their times.
    const auto unit_params = [&](int u) {
      if (u == 0) return static_cast<double>(embedding_params_);
      if (u == num_blocks() + 1) return static_cast<double>(head_read_params_);
      return static_cast<double>(block_params_[static_cast<std::size_t>(u - 1)]);
    };
    struct Buf {
      int unit = -1;
      double ready = 0, free = 0, used = -1;
    };
    std::array<Buf, 2> bufs{};
    double copy = 0, clock = 0;
    const auto fetch = [&](int u, double issue, int except) {
      int b = except == 0 ? 1 : 0;
      if (except < 0 && bufs[1].used < bufs[0].used) b = 1;
      Buf& f = bufs[static_cast<std::size_t>(b)];
      copy = std::max({copy, issue, f.free}) + unit_params(u) * wbytes / device.host_link;
      f.unit = u;
      f.ready = copy;
      return b;
    };
    const auto holding = [&](int u) {
      for (int b = 0; b < 2; ++b) {
        if (bufs[static_cast<std::size_t>(b)].unit == u) return b;
      }
      return -1;
    };
    for (std::size_t k = 0; k < uses.size(); ++k) {
      const int u = uses[k].first;
      int b = holding(u);
      if (b < 0) b = fetch(u, clock, -1);
      Buf& cur = bufs[static_cast<std::size_t>(b)];
      const double start = std::max(clock, cur.ready);
      cur.used = static_cast<double>(k);
      if (k + 1 < uses.size() && holding(uses[k + 1].first) < 0) fetch(uses[k + 1].first, start, b);
      clock = start + uses[k].second;
      cur.free = clock;
    }
    total += static_cast<double>(accum) * std::max(0.0, clock - micro);
  }

  if (p.offload.activations) total += static_cast<double>(accum) * stash_wait(schedule, c, device);

  if (!p.offload.optimizer) {
    const double per_param =
        static_cast<double>(adamw_bytes_per_element(DType::kF32, dt != DType::kF32, dt));
    total += n * per_param / device.mem_bandwidth;
  } else {
    // D2H copies of 4 B/param on one copy stream, FIFO, each starting when its gradients are
    // final; what runs past the end of the backward is exposed.
    // Gradient offload sends every micro-batch's gradients this way, and each micro-batch after
    // the first also refills the buckets with the host's sums (another 4 B/param on the same
    // FIFO copy stream, ahead of each stage): 8 B/param then.
    const auto exposed_at = [&](double bytes_per_param) {
      double copy_end = 0;
      for (const auto& [when, params] : ready) {
        copy_end = std::max(copy_end, when) + bytes_per_param * params / device.host_link;
      }
      return std::max(0.0, copy_end - micro);
    };
    double exposed = exposed_at(4.0);
    if (p.offload.gradients) exposed += static_cast<double>(accum - 1) * exposed_at(8.0);
    const double rate = device.cpu_adamw > 0 ? device.cpu_adamw : cpu_adamw_rate();
    // The updated weights go back to the device, unless they live on the host (each use
    // fetches them, counted above).
    const double h2d = p.offload.weights ? 0.0 : n * wbytes / device.host_link;
    total += exposed + n / rate + h2d;
  }
  return total;
}

}  // namespace memfit
