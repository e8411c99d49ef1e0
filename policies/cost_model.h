// CostModel: what a model costs per block, per sample, in bytes and flops, and the static
// bytes each policy keeps on the device: the planner's arithmetic.
//
//   CostModel cm = CostModel::analytic(ModelSpec::preset("gpt2"), /*seq_len=*/1024);
//   LayerCost b = cm.block(3, DType::kBF16);               // per sample
//   StaticBytes s = cm.static_bytes(DType::kBF16, /*offload=*/false);
//   Chain c = cm.chain(/*micro_batch=*/8, DType::kBF16, device);  // for checkpoint_solver.h
//   double t = cm.step_seconds(policy, micro_batch, accum, device);
//
// Analytic: from Layer::cost() of the real layers (built once on the meta backend, so the
// figures are those of the code that runs) plus the static bytes of each policy, per
// parameter:
//                         weights  grads  masters  moments  device total  (+ host)
//   f32                      4       4       -        8          16
//   f16/bf16                 2       4       4        8          18
//   f16/bf16 + offload       2       4     (host)   (host)        6       (+ 12 pinned + staging)
//   f32 + offload            4       4     (host)   (host)        8       (+ 12 pinned)
// Beside DeepSpeed (ZeRO paper: 2 + 2 + 12 = 16 bytes for mixed-precision Adam, 16-20 with
// FP32 gradient buffers) and Megatron-LM (18: FP32 gradient accumulation buffers): memfit
// accumulates gradients in FP32 (4, not 2) and keeps no low-precision gradient copy, so its
// mixed-precision figure is Megatron's 18. (Per-rank ZeRO-1/2 division: planner.h.)
// Measured (calibrate()): runs one step per block on a backend at two batch sizes, reads the
// allocator's per-block peaks and times, and fits per-sample terms (bytes = a + b * B), which
// then replace the analytic ones.
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

namespace memfit {

// Bytes a policy keeps on the device whatever the batch (by category), and on the host.
struct StaticBytes {
  std::array<std::int64_t, kCategoryCount> device{};  // kParameter, kGradient, kOptimizerState
  std::int64_t host_pinned = 0;
  std::int64_t device_total() const;
};

// The policy a cost or a dry run is asked about.
struct Policy {
  DType dtype = DType::kF32;
  std::string checkpoint = "none";  // a solver name (checkpoint_solver.h) or Schedule::parse
  bool offload = false;
};

class CostModel {
 public:
  static CostModel analytic(const ModelSpec& spec, std::int64_t seq_len);
  // Fits per-sample bytes and seconds from real steps on `backend` (the CPU backend on this
  // machine) at micro-batches b1 < b2; seconds scale to `device` by flops ratio.
  static CostModel calibrate(const ModelSpec& spec, std::int64_t seq_len, std::int64_t b1,
                             std::int64_t b2);

  const ModelSpec& spec() const { return spec_; }
  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t parameter_count() const;
  bool measured() const { return measured_; }

  LayerCost embedding(DType dt) const;  // per sample
  LayerCost block(int i, DType dt) const;
  LayerCost head(DType dt) const;
  int num_blocks() const;

  StaticBytes static_bytes(DType dt, bool offload) const;
  // The chain for checkpoint_solver.h at this micro-batch; times from flops over the device's
  // rate for dt.
  Chain chain(std::int64_t micro_batch, DType dt, const DeviceSpec& device) const;
  // Predicted seconds per global batch = accum micro-batches of forward + recomputation +
  // backward (flops / rate, bytes / bandwidth, whichever is larger per op class) + optimizer
  // (device AdamW: 28 B/param over bandwidth; offload: gradient and weight transfers over
  // host_link, overlapped with backward as far as it goes, CPU AdamW at device.cpu_adamw).
  double step_seconds(const Policy& p, const Schedule& schedule, std::int64_t micro_batch,
                      std::int64_t accum, const DeviceSpec& device) const;

 private:
  ModelSpec spec_;
  std::int64_t seq_len_ = 0;
  bool measured_ = false;
  std::vector<std::array<LayerCost, 3>> blocks_;  // [block][dtype index f32, f16, bf16]
  std::array<LayerCost, 3> embedding_{}, head_{};
  std::int64_t params_ = 0;
  std::int64_t embedding_params_ = 0;
};

}  // namespace memfit
