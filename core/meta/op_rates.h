// OpRates: how fast a device runs each backend primitive, so that a dry run on the meta backend
// (MetaBackend::set_rates) adds up the seconds of the ops a step really issues, at their real
// shapes: the step's predicted compute time.
//
//   OpRates r = ...;                               // policies/cpu_rates.h measures the CPU's
//   meta.set_rates(&r);
//   ... run the step on `meta` ...
//   double s = meta.stats().seconds;
//
// Work. Each primitive's work is what MetaBackend counts for it: its flops (matrix flops plus
// the MetaFlops-rate elementwise flops) when it has any, else the bytes it moves (fill, copy,
// cast, axpy, scale, the head split/merge, the embedding forward without positions). An op
// takes  per_call + work / rate  seconds for its kind and dtype; GEMM (MetaOp::kGemm) instead
// takes flops / gemm_rate(dtype, flops of the call), a rate read off a few measured call sizes
// (log-linear between them, the end rates beyond), since small GEMMs run far below peak.
// A kind or dtype never measured (rate 0) takes bytes / bandwidth. Two corrections, measured on
// real steps (policies/cpu_rates.h): those seconds are multiplied by `scale` (how much slower
// kernels run inside a step than alone: cold caches, other shapes), and every call, GEMM
// included, adds `per_op` (what the layer, executor and allocator code around a kernel and the
// thread team's fork and join cost per call; it shows where ops are small, as at micro-batch
// 1 with thousands of ops a step).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/meta/meta_backend.h"  // MetaOp

namespace memfit {

struct OpRates {
  struct GemmPoint {
    double flops = 0;  // per call
    double rate = 0;   // flops/s at that size
  };
  struct Rate {
    double per_call = 0;  // seconds each call takes whatever its size
    double rate = 0;      // work per second; 0: not measured
  };
  static constexpr std::size_t kDTypes = 3;  // f32, f16, bf16 (dtype_index)
  static std::size_t dtype_index(DType dt);

  std::array<std::vector<GemmPoint>, kDTypes> gemm;  // by increasing flops
  std::array<std::array<Rate, kDTypes>, static_cast<std::size_t>(MetaOp::kCount)> ops{};
  double bandwidth = 0;  // bytes/s for what was not measured
  double scale = 1;      // real-step seconds per kernel second (see above)
  double per_op = 0;     // seconds every call adds outside its kernel (see above)

  double gemm_rate(DType dt, double flops) const;  // 0 when no point was measured for dt
  // Seconds of one call: `matmul` and `other` flops as MetaBackend counts them, `bytes` read
  // plus written.
  double seconds(MetaOp op, DType dt, double matmul, double other, double bytes) const;
};

}  // namespace memfit
