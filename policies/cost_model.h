// CostModel: what a model costs per block, per sample, in bytes and flops, and the static
// bytes each policy keeps on the device: the planner's arithmetic.
//
//   CostModel cm = CostModel::analytic(ModelSpec::preset("gpt2"), /*seq_len=*/1024);
//   LayerCost b = cm.block(3, DType::kBF16);               // per sample
//   StaticBytes s = cm.static_bytes(DType::kBF16, OffloadSwitches{});
//   Chain c = cm.chain(/*micro_batch=*/8, DType::kBF16, device);  // for checkpoint_solver.h
//   double t = cm.step_seconds(policy, Schedule::all(cm.num_blocks()), 8, /*accum=*/4, device);
//   (policy: policies/policy.h; its dtype and offload switches count, the schedule is given)
//
// Analytic: from Layer::cost() of the real layers (built once on the meta backend, so the
// figures are those of the code that runs) plus the static bytes of each policy, per
// parameter:
//                         weights  grads  masters  moments  device total  (+ host, pinned)
//   f32                      4       4       -        8          16
//   f16/bf16                 2       4       4        8          18
//   f16/bf16 + offload       2       4     (host)   (host)        6       (+ 12 + 4 grad staging
//                                                                          + 2 weight staging)
//   f32 + offload            4       4     (host)   (host)        8       (+ 12 + 4 grad staging)
//   + gradient offload     2 or 4  (ring)  (host)   (host)      2 or 4    (the same slab: its
//                                                                          grad region holds them)
//     (ring: 2 buckets of the largest stage's gradients + a tied wte's, GradRing::sizes)
//   + weight offload       (ring)  ...                                    (the same slab: weight
//                                                                          staging, or masters)
//     (ring: 2 buffers of the largest unit's weights, WeightRing::buffer_bytes; a unit is the
//      embedding, a block or the head, a tied wte in both the embedding and the head)
// (masters and moments are Category::kOptimizerState; an f32 weight is its own master. Host
// bytes are OffloadOptimizer's slab, 64-byte-aligned regions; static_bytes() gives it exactly.)
// Beside DeepSpeed (ZeRO paper, Rajbhandari et al. 2019, section 3.1: 2 + 2 + 12 = 16 bytes
// for mixed-precision Adam with 16-bit gradients; the 16-20 usually quoted for DeepSpeed runs
// up to 20 with an FP32 gradient copy beside the 16-bit one) and Megatron-LM (Megatron Core's
// distributed-optimizer guide: 20 for 16-bit params with 16-bit grads plus an FP32 main-grad copy,
// 18 with FP32 grads, 16 all FP32): memfit accumulates gradients in FP32 (4, not 2) and keeps no
// low-precision gradient copy, so its mixed-precision figure is Megatron's 18 and its f32 figure
// everybody's 16. With ZeRO-1 over d ranks, Megatron's 18 becomes 6 + 12/d; ZeRO-2 also divides the
// 4 B of gradients (planner.h does that arithmetic). Offload is ZeRO-Offload's split: the device
// keeps 2 + 4, the host the 12 of the optimizer state plus staging. Activations, per block of a
// GPT, beside Megatron-LM's per-layer sbh(34 + 5as/h) bytes (Korthikanti et al. 2022, "Reducing
// Activation Recomputation in Large Transformer Models", section 4.1; 16-bit, one layer, no
// parallelism; s tokens, b samples, h hidden, a heads):
//   Megatron term                         bytes     memfit (what the layers save)       bytes
//   LayerNorm 1 input                     2sbh      block input x (ln1 holds it)        2sbh
//   QKV projection input                  2sbh      ln1 output (qkv holds it)           2sbh
//   Q, K for QK^T                         4sbh      qkvr: q, k, v split into heads      6sbh
//   V for attention over values           2sbh        (one tensor, counted here)
//   softmax output                        2as^2b    att (materialized attention only)   2as^2b
//                                                   lse, f32 (flash attention)          4asb
//   softmax dropout mask                  as^2b     - (no dropout)                      0
//   dropout output (attention over V)     2as^2b    - (att itself is used)              0
//   output projection input               2sbh      merged heads (proj holds it)        2sbh
//   attention dropout mask                sbh       - (no dropout)                      0
//   LayerNorm 2 input                     2sbh      x1, the middle residual stream      2sbh
//   MLP first linear input                2sbh      ln2 output (fc holds it)            2sbh
//   GeLU input                            8sbh      fc output                           8sbh
//   second linear input                   8sbh      GELU output                         8sbh
//   MLP dropout mask                      sbh       - (no dropout)                      0
//   -                                               LayerNorm mean + rstd, f32, x2      16sb
//   total                  34sbh + 5as^2b           32sbh + 16sb + 4asb (flash, the default)
//                                                   32sbh + 16sb + 2as^2b (materialized)
// With `attention: materialized`, memfit = Megatron - 2sbh (the two sbh dropout masks)
// - 3as^2b (the attention dropout's mask and output) + 16sb (LayerNorm statistics, which
// Megatron leaves out as small); with flash attention no s^2 term remains at all. In f32 every
// sbh and as^2b term doubles; the statistics stay f32. tests/policies/cost_model_test.cpp
// checks this term by term against the layers' cost() and the calibrated measurement.
// Measured (calibrate()): runs each block's forward (save = true) and backward individually
// on the CPU backend at micro-batches b1 < b2 in every dtype, reads the allocator's
// activation bytes between blocks and the peaks within them, times them, and fits
// bytes = a + b * B per block; the per-sample figures (saved, output, workspace) are the
// slopes b. Times are fitted the same way and stored as flops at the `cpu` device preset's
// rate for that dtype (forward_flops = seconds per sample x DeviceSpec::preset("cpu").flops),
// so a device's time is the CPU's scaled by the flops ratio.
// Thread-safe after construction (const methods only).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/layer.h"
#include "core/model_spec.h"
#include "memory/category.h"
#include "policies/checkpoint_solver.h"
#include "policies/device_spec.h"
#include "policies/policy.h"

namespace memfit {

// Bytes a policy keeps on the device whatever the batch (by category), and on the host.
struct StaticBytes {
  std::array<std::int64_t, kCategoryCount> device{};  // kParameter, kGradient, kOptimizerState
  std::int64_t host_pinned = 0;
  std::int64_t device_total() const;
};

class CostModel {
 public:
  // InvalidArgument unless 1 <= seq_len <= spec.seq_len; ConfigError for an invalid spec.
  // `loss`: the head's bytes and flops as that loss mode runs it (MemoryPolicy::loss; the
  // chunked loss saves no logits and recomputes them).
  static CostModel analytic(const ModelSpec& spec, std::int64_t seq_len,
                            LossMode loss = LossMode::kChunked);
  // Fits per-sample bytes and seconds from real blocks on the CPU backend at micro-batches
  // 1 <= b1 < b2 (see above); seconds scale to a device by flops ratio. Takes about
  // 3 x (1 + b1 + b2) samples' forward and backward (one warm-up sample per dtype)
  // on this machine's CPU.
  static CostModel calibrate(const ModelSpec& spec, std::int64_t seq_len, std::int64_t b1,
                             std::int64_t b2, LossMode loss = LossMode::kChunked);

  const ModelSpec& spec() const { return spec_; }
  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t parameter_count() const;
  bool measured() const { return measured_; }

  LayerCost embedding(DType dt) const;  // per sample
  LayerCost block(int i, DType dt) const;
  LayerCost head(DType dt) const;
  int num_blocks() const;

  StaticBytes static_bytes(DType dt, const OffloadSwitches& offload) const;
  // The chain for checkpoint_solver.h at this micro-batch; times from flops over the device's
  // rate for dt.
  Chain chain(std::int64_t micro_batch, DType dt, const DeviceSpec& device) const;
  // Predicted seconds per global batch = accum micro-batches of forward + recomputation +
  // backward (flops / rate, bytes / bandwidth, whichever is larger per op class; a block
  // recomputed right before its backward at LayerCost::flops_for_backward, without its output
  // where its layer overrides forward_for_backward, as the executor runs it:
  // forwards_for_backward(), core/executor.h) + optimizer
  // (device AdamW: 28 B/param over bandwidth; offload: gradient and weight transfers over
  // host_link, overlapped with backward as far as it goes, CPU AdamW at device.cpu_adamw).
  // Per op (embedding, each schedule op, head): max(B x flops / device.flops(dt),
  // bytes / mem_bandwidth) with bytes = B x (input + saved + output) + the weights it reads
  // (backward: twice the activations, plus 8 B/param of FP32 gradient read-modify-write).
  // Offload: the D2H gradient copies (4 B/param) overlap the last micro-batch's backward
  // except those of block 0 and the embedding, which finish last; CPU AdamW (no overlap:
  // delayed_update off) at device.cpu_adamw or, when 0, cpu_adamw_rate(); the H2D weight
  // copies (dt bytes/param) before the next forward. Weight offload instead fetches each use's
  // unit (dt bytes/param) over host_link into two buffers, one use ahead (a unit still in a
  // buffer is not fetched again); what a fetch does not hide behind the use before it delays
  // the compute. Activation offload: each checkpoint goes out after the forward that keeps it
  // and comes back one read ahead (ActivationStash's order); what the compute waits for is
  // added. H2D and D2H are taken as independent (a full-duplex link: PCIe, NVLink-C2C).
  // InvalidArgument for micro_batch or
  // accum < 1, a schedule invalid for num_blocks(), or a device rate <= 0.
  double step_seconds(const MemoryPolicy& p, const Schedule& schedule, std::int64_t micro_batch,
                      std::int64_t accum, const DeviceSpec& device) const;

  // Parameters per second of this host's CPU AdamW (core/cpu/adamw.h, all cores, f32
  // gradients, a bf16 copy-out), timed on 4M parameters (120 MB of traffic: beyond the
  // caches, as a real model) once per process; best of 5 after a warm-up. Thread-safe.
  static double cpu_adamw_rate();

 private:
  ModelSpec spec_;
  std::int64_t seq_len_ = 0;
  bool measured_ = false;
  std::vector<std::array<LayerCost, 3>> blocks_;  // [block][dtype index f32, f16, bf16]
  std::array<LayerCost, 3> embedding_{}, head_{};
  std::int64_t params_ = 0;
  std::int64_t embedding_params_ = 0;
  // Per block and dtype, the transient peaks beyond what stays (core/layers/layer_util.h's
  // PeakExcess: {forward, backward}, per sample), for the chain's fwd/bwd workspaces.
  std::vector<std::array<std::array<std::int64_t, 2>, 3>> block_excess_;
  std::vector<std::int64_t> block_params_;  // parameters of each block
  std::int64_t head_read_params_ = 0;       // parameters the head reads (a tied wte included)
  std::int64_t grad_bucket_bytes_ = 0;      // gradient offload: one bucket (GradRing::sizes)
  std::int64_t grad_own_bytes_ = 0;         // and the multi-stage parameters' buffers
  std::array<std::int64_t, 3> weight_buffer_bytes_{};  // weight offload: one buffer, per dtype
};

}  // namespace memfit
