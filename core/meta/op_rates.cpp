// OpRates: seconds of one primitive from its work (op_rates.h).
#include "core/meta/op_rates.h"

#include <algorithm>
#include <cmath>

namespace memfit {

std::size_t OpRates::dtype_index(DType dt) {
  switch (dt) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

double OpRates::gemm_rate(DType dt, double flops) const {
  const std::vector<GemmPoint>& pts = gemm[dtype_index(dt)];
  if (pts.empty()) return 0;
  if (flops <= pts.front().flops) return pts.front().rate;
  if (flops >= pts.back().flops) return pts.back().rate;
  for (std::size_t i = 1; i < pts.size(); ++i) {
    if (flops <= pts[i].flops) {
      const GemmPoint& a = pts[i - 1];
      const GemmPoint& b = pts[i];
      const double f = std::log(flops / a.flops) / std::log(b.flops / a.flops);
      return std::exp(std::log(a.rate) + f * (std::log(b.rate) - std::log(a.rate)));
    }
  }
  return pts.back().rate;
}

double OpRates::seconds(MetaOp op, DType dt, double matmul, double other, double bytes) const {
  if (op == MetaOp::kGemm) {
    const double r = gemm_rate(dt, matmul);
    if (r > 0) return per_op + scale * (matmul / r);
  } else {
    const Rate& r = ops[static_cast<std::size_t>(op)][dtype_index(dt)];
    if (r.rate > 0) {
      const double work = matmul + other > 0 ? matmul + other : bytes;
      return per_op + scale * (r.per_call + work / r.rate);
    }
  }
  return per_op + (bandwidth > 0 ? scale * (bytes / bandwidth) : 0);
}

}  // namespace memfit
