// CostModel, measured side: calibrate() runs the real blocks on the CPU backend at two
// micro-batches and fits per-sample bytes and times; cpu_adamw_rate() times the host AdamW.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/adamw.h"
#include "core/cpu/adamw.h"
#include "core/cpu/cpu_backend.h"
#include "core/model.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "policies/cost_model.h"
#include "policies/cost_model_util.h"

namespace memfit {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// What one stage did at one micro-batch: bytes as the allocator counts them (rounded).
struct Stage {
  std::int64_t saved = 0, output = 0, fwd_excess = 0, bwd_excess = 0;
  double fwd_s = 0, bwd_s = 0;
};

struct Pass {
  Stage embedding;
  std::vector<Stage> blocks;
  Stage head;
};

class Meter {
 public:
  explicit Meter(CachingAllocator& alloc) : alloc_(alloc) {}
  std::int64_t now() const { return alloc_.stats().allocated_bytes[kStatAll].current; }
  std::int64_t peak() const { return alloc_.stats().allocated_bytes[kStatAll].peak; }
  void reset_peak() { alloc_.reset_peak_stats(); }
  std::int64_t rounded(const Act& a) const {
    return static_cast<std::int64_t>(alloc_.round_size(a->view().nbytes()));
  }

 private:
  CachingAllocator& alloc_;
};

// Deterministic ids in [0, vocab) for tokens and targets.
Block index_block(CachingAllocator& alloc, std::int64_t n, std::int64_t vocab, std::uint32_t seed,
                  const char* tag) {
  Block blk = alloc.allocate(static_cast<std::size_t>(n) * sizeof(std::int32_t), Category::kInput,
                             kDefaultStream, tag);
  auto* p = blk.as<std::int32_t>();
  std::uint32_t x = seed;
  for (std::int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;  // Numerical Recipes' LCG: ids need no quality
    p[i] = static_cast<std::int32_t>((x >> 8) % static_cast<std::uint32_t>(vocab));
  }
  return blk;
}

// Embedding, each block, head: forward (blocks with save = true), then at once its backward
// with a constant dy, so each stage's saved bytes are what the allocator holds beyond its
// output between its forward and its backward.
Pass measure(Model& m, LayerContext& ctx, std::int64_t b, std::int64_t t) {
  Meter mt(ctx.alloc);
  Backend& be = ctx.backend;
  const std::int64_t vocab = m.spec().vocab;
  Block tok = index_block(ctx.alloc, b * t, vocab, 17, "calibrate.tokens");
  Block tgt = index_block(ctx.alloc, b * t, vocab, 29, "calibrate.targets");
  const IndexTensor tokens{tok.as<std::int32_t>(), Shape{b, t}, Device::kCpu};
  const IndexTensor targets{tgt.as<std::int32_t>(), Shape{b, t}, Device::kCpu};
  Pass pass;

  auto t0 = Clock::now();
  Act x = m.embedding().forward(ctx, tokens);
  be.synchronize(ctx.stream);
  pass.embedding.fwd_s = seconds_since(t0);
  pass.embedding.output = mt.rounded(x);

  for (int i = 0; i < m.num_blocks(); ++i) {
    Layer& blk = m.block(i);
    Stage s;
    const std::int64_t c0 = mt.now();
    mt.reset_peak();
    t0 = Clock::now();
    Act y = blk.forward(ctx, x, /*save=*/true);
    be.synchronize(ctx.stream);
    s.fwd_s = seconds_since(t0);
    const std::int64_t c1 = mt.now();
    s.output = mt.rounded(y);
    s.saved = c1 - c0 - s.output;
    s.fwd_excess = mt.peak() - c1;

    Act dy = ctx.make(y->view().shape(), ctx.dtype, Category::kTemporary, "calibrate.dy");
    be.fill(ctx.stream, dy->view(), 1e-3f);
    const std::int64_t c2 = mt.now();
    mt.reset_peak();
    t0 = Clock::now();
    Act dx = blk.backward(ctx, dy);
    be.synchronize(ctx.stream);
    s.bwd_s = seconds_since(t0);
    s.bwd_excess = mt.peak() - (c2 + mt.rounded(dx));
    pass.blocks.push_back(s);
    x = std::move(y);  // the next block's input; the old one goes
  }

  Stage& h = pass.head;
  const std::int64_t c0 = mt.now();
  mt.reset_peak();
  t0 = Clock::now();
  Act losses = m.head().forward(ctx, x, targets);
  be.synchronize(ctx.stream);
  h.fwd_s = seconds_since(t0);
  const std::int64_t c1 = mt.now();
  h.output = mt.rounded(losses);
  h.saved = c1 - c0 - h.output;
  h.fwd_excess = mt.peak() - c1;
  losses.reset();
  const std::int64_t c2 = mt.now();
  mt.reset_peak();
  t0 = Clock::now();
  Act dxn = m.head().backward(ctx, targets, 1.0f / static_cast<float>(b * t));
  be.synchronize(ctx.stream);
  h.bwd_s = seconds_since(t0);
  h.bwd_excess = mt.peak() - (c2 + mt.rounded(dxn));
  x.reset();

  t0 = Clock::now();
  m.embedding().backward(ctx, tokens, dxn);
  be.synchronize(ctx.stream);
  pass.embedding.bwd_s = seconds_since(t0);
  return pass;
}

std::int64_t slope_bytes(std::int64_t v1, std::int64_t v2, std::int64_t b1, std::int64_t b2) {
  const double s = static_cast<double>(v2 - v1) / static_cast<double>(b2 - b1);
  return std::max<std::int64_t>(0, std::llround(s));
}

// Seconds per sample; timing noise on a busy machine can make the difference negative, when
// the mean per sample at the larger batch stands in.
double slope_seconds(double t1, double t2, std::int64_t b1, std::int64_t b2) {
  const double s = (t2 - t1) / static_cast<double>(b2 - b1);
  return s > 0 ? s : t2 / static_cast<double>(b2);
}

// Fitted figures into `k` (saves_input stays the analytic one); seconds become flops at `rate`.
void fit(const Stage& s1, const Stage& s2, std::int64_t b1, std::int64_t b2, double rate,
         LayerCost& k, std::array<std::int64_t, 2>* excess) {
  k.saved_bytes = slope_bytes(s1.saved, s2.saved, b1, b2);
  k.output_bytes = slope_bytes(s1.output, s2.output, b1, b2);
  const std::int64_t fe = slope_bytes(s1.fwd_excess, s2.fwd_excess, b1, b2);
  const std::int64_t bw = slope_bytes(s1.bwd_excess, s2.bwd_excess, b1, b2);
  k.workspace_bytes = std::max(fe, bw);
  if (excess) *excess = {fe, bw};
  // A recomputation for the backward keeps the analytic share of the measured forward.
  const double for_backward_share =
      k.forward_flops > 0 ? double(k.flops_for_backward()) / double(k.forward_flops) : 1.0;
  k.forward_flops = std::llround(slope_seconds(s1.fwd_s, s2.fwd_s, b1, b2) * rate);
  k.backward_flops = std::llround(slope_seconds(s1.bwd_s, s2.bwd_s, b1, b2) * rate);
  if (k.for_backward_flops >= 0) {
    k.for_backward_flops = std::llround(double(k.forward_flops) * for_backward_share);
  }
}

}  // namespace

CostModel CostModel::calibrate(const ModelSpec& spec, std::int64_t seq_len, std::int64_t b1,
                               std::int64_t b2, LossMode loss) {
  costmodel::check_seq_len(spec, seq_len);
  if (b1 < 1 || b2 <= b1) {
    throw InvalidArgument("CostModel::calibrate: micro-batches b1 = " + std::to_string(b1) +
                          ", b2 = " + std::to_string(b2) + "; valid: 1 <= b1 < b2");
  }
  (void)costmodel::mul(costmodel::mul(b2, seq_len, "calibration tokens"), spec.hidden,
                       "calibration activations");
  // The analytic model gives the structure (parameter counts, saves_input); every per-sample
  // figure below is then replaced by a measured one.
  CostModel cm = analytic(spec, seq_len, loss);
  cm.measured_ = true;
  const DeviceSpec cpu = DeviceSpec::preset("cpu");

  CpuBackend be;
  HostProvider host;
  CachingAllocator alloc(host, {}, &be.stream_sync());
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::size_t d = static_cast<std::size_t>(dt);
    LayerContext ctx{be, alloc, kDefaultStream, dt};
    Model m(spec, ctx);
    m.init(/*seed=*/1337, ctx);
    m.head().set_loss(loss);
    (void)measure(m, ctx, 1, seq_len);  // warm-up: threads, scratch, caches
    const Pass p1 = measure(m, ctx, b1, seq_len);
    const Pass p2 = measure(m, ctx, b2, seq_len);
    const double rate = cpu.flops(dt);
    for (std::size_t i = 0; i < cm.blocks_.size(); ++i) {
      fit(p1.blocks[i], p2.blocks[i], b1, b2, rate, cm.blocks_[i][d], &cm.block_excess_[i][d]);
    }
    fit(p1.head, p2.head, b1, b2, rate, cm.head_[d], nullptr);
    fit(p1.embedding, p2.embedding, b1, b2, rate, cm.embedding_[d], nullptr);
  }
  return cm;
}

double CostModel::cpu_adamw_rate() {
  static const double rate = [] {
    // 4M parameters: the 30 bytes each moves (120 MB) exceed a server's last-level cache, as
    // a real model's do; 1M would run from cache and overstate the rate.
    constexpr std::size_t kN = std::size_t{1} << 22;
    std::vector<float> param(kN, 0.5f), m(kN, 0.0f), v(kN, 0.0f), grad(kN, 1e-3f);
    std::vector<std::uint16_t> out(kN);
    AdamWBuffers b;
    b.n = kN;
    b.param = param.data();
    b.exp_avg = m.data();
    b.exp_avg_sq = v.data();
    b.grad = grad.data();
    b.grad_dtype = DType::kF32;
    b.param_out = out.data();
    b.out_dtype = DType::kBF16;
    double best = std::numeric_limits<double>::infinity();
    for (int step = 1; step <= 6; ++step) {
      const AdamWConstants k = adamw_constants(AdamWOptions{}, step);
      const auto t0 = Clock::now();
      adamw_step(k, b);
      if (step > 1) best = std::min(best, seconds_since(t0));  // the first warms up
    }
    return static_cast<double>(kN) / std::max(best, 1e-9);
  }();
  return rate;
}

}  // namespace memfit
