// The CPU GEMM engine choice (gemm_engine.h). The paths themselves: gemm.cpp (BLAS, dispatch)
// and gemm_dnnl.cpp (oneDNN).
#include "core/cpu/gemm_engine.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "memory/error.h"
#include "memory/size.h"

namespace memfit {
namespace cpu {
namespace {

std::size_t floats_if_narrow(DType t, std::int64_t x, std::int64_t y) {
  return t == DType::kF32 ? 0 : static_cast<std::size_t>(x * y);
}

std::size_t blas_scratch_floats(const GemmDesc& d, DType a, DType b, DType c) {
  return checked_add(checked_add(floats_if_narrow(a, d.m, d.k), floats_if_narrow(b, d.k, d.n),
                                 "CPU GEMM scratch"),
                     floats_if_narrow(c, d.m, d.n), "CPU GEMM scratch");
}

}  // namespace

GemmEngine parse_gemm_engine(const char* value) {
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) {
    return GemmEngine::kAuto;
  }
  if (std::strcmp(value, "blas") == 0) return GemmEngine::kBlas;
  if (std::strcmp(value, "dnnl") == 0) return GemmEngine::kDnnl;
  throw ConfigError(std::string(kGemmEngineEnv) + "='" + value +
                    "': valid values are auto (oneDNN where this CPU runs it faster, else "
                    "OpenBLAS), blas (OpenBLAS, 16-bit operands widened to f32), dnnl (oneDNN "
                    "wherever it has a kernel)");
}

GemmEngine gemm_engine_from_env() { return parse_gemm_engine(std::getenv(kGemmEngineEnv)); }

const char* gemm_engine_name(GemmEngine e) {
  switch (e) {
    case GemmEngine::kAuto:
      return "auto";
    case GemmEngine::kBlas:
      return "blas";
    case GemmEngine::kDnnl:
      return "dnnl";
  }
  return "?";
}

const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::kNone:
      return "none";
    case GemmPath::kBlas:
      return "blas";
    case GemmPath::kDnnl:
      return "dnnl";
  }
  return "?";
}

bool dnnl_chosen_by_auto(DType in) {
  // From bench/gemm_bench on the GPT shapes (2-core AMD EPYC, AVX512-BF16, quiet machine):
  // oneDNN bf16 runs 2.0-2.2x the f32 OpenBLAS anchor on the Linear shapes (10x on attention's
  // batched q@k^T) where widening reaches 0.89-0.97x; oneDNN f32 runs 1.05-1.14x (2x on the
  // batched attention shapes). Without these instruction sets the widening path is kept.
  const DnnlIsa& isa = dnnl_isa();
  switch (in) {
    case DType::kF32:
      return isa.avx512_core;
    case DType::kBF16:
      return isa.bf16;
    case DType::kF16:
      return false;
  }
  return false;
}

GemmPlan plan_gemm(const GemmDesc& d, DType a, DType b, DType c, GemmEngine engine) {
  GemmPlan p;
  if (d.m == 0 || d.n == 0 || d.batch == 0) return p;
  const bool try_dnnl = d.k > 0 && a == b &&
                        (engine == GemmEngine::kDnnl ||
                         (engine == GemmEngine::kAuto && dnnl_chosen_by_auto(a)));
  if (try_dnnl) {
    std::shared_ptr<const DnnlMatmul> mm = find_dnnl_matmul(d, a, b, c);
    if (mm != nullptr && (engine == GemmEngine::kDnnl || !mm->reference())) {
      p.path = GemmPath::kDnnl;
      p.scratch_floats = mm->scratch_bytes() / sizeof(float) +
                         (mm->scratch_bytes() % sizeof(float) != 0 ? 1 : 0);
      p.dnnl = std::move(mm);
      return p;
    }
  }
  p.path = GemmPath::kBlas;
  p.scratch_floats = blas_scratch_floats(d, a, b, c);
  return p;
}

}  // namespace cpu
}  // namespace memfit
