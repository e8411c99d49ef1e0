// Which library runs a CPU GEMM, and how much scratch it takes: the one decision that the CPU
// backend (to run it) and the meta backend (to predict its memory) both call.
//
//   GemmPlan p = plan_gemm(d, a.dtype(), b.dtype(), c.dtype(), gemm_engine_from_env());
//   std::vector<float> scratch(p.scratch_floats);
//   run_gemm_plan(p, d, a, b, c, scratch.data());
//
// Two paths:
//   kDnnl  oneDNN matmul on the operands as stored (gemm_dnnl.h): A and B of one dtype, FP32
//          accumulation, C written in its dtype. Scratch: oneDNN's scratchpad.
//   kBlas  f16/bf16 operands widened (exactly) to f32 scratch, OpenBLAS cblas_sgemm, C rounded
//          once to its dtype. Scratch: one A, one B and one C matrix of f32 for the operands
//          that are not f32 (none when all are). Every shape and dtype mix; k == 0 always.
// MEMFIT_CPU_GEMM picks the engine: auto (default, or unset), blas, dnnl.
//   auto: oneDNN for a dtype where this CPU has the instructions that make it faster than
//         widening, as measured by bench/gemm_bench on the model's shapes: f32 with AVX-512,
//         bf16 with AVX512-BF16 or AMX; never f16 (oneDNN 2.6 has no CPU f16 matmul without
//         AVX512-FP16). A shape that oneDNN would run with its reference loops goes to BLAS.
//         Decided from the CPU's ISA, so a process's choice is the same on every run.
//   blas: the widening path for everything.
//   dnnl: oneDNN wherever it has any implementation, reference loops included (for tests);
//         BLAS for the rest (mixed A/B dtypes, f16 without AVX512-FP16, k == 0).
// The variable is read at every GEMM, so change it only while no GEMM is queued on a worker.
// Thread safety: every function here may be called from any thread.
#pragma once

#include <cstddef>
#include <memory>

#include "core/backend.h"
#include "core/cpu/gemm_dnnl.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace memfit {
namespace cpu {

enum class GemmEngine { kAuto, kBlas, kDnnl };

inline constexpr const char* kGemmEngineEnv = "MEMFIT_CPU_GEMM";

// "auto", "blas", "dnnl"; nullptr or "" is auto. Anything else: ConfigError naming
// MEMFIT_CPU_GEMM and the valid values.
GemmEngine parse_gemm_engine(const char* value);
GemmEngine gemm_engine_from_env();  // parse_gemm_engine(getenv(MEMFIT_CPU_GEMM))
const char* gemm_engine_name(GemmEngine e);

// Under auto, whether A and B of dtype `in` go to oneDNN on this CPU (dnnl_isa()).
bool dnnl_chosen_by_auto(DType in);

enum class GemmPath { kNone, kBlas, kDnnl };  // kNone: m, n or batch is 0, nothing to do
const char* gemm_path_name(GemmPath p);

struct GemmPlan {
  GemmPath path = GemmPath::kNone;
  std::size_t scratch_floats = 0;         // scratch the call needs, in floats (4-byte units)
  std::shared_ptr<const DnnlMatmul> dnnl;  // kDnnl: the cached matmul
};

// `d` has its strides resolved (no kPacked), as Backend::gemm hands them to a backend.
GemmPlan plan_gemm(const GemmDesc& d, DType a, DType b, DType c, GemmEngine engine);

// Runs `p` (from plan_gemm with the same d and dtypes); scratch holds p.scratch_floats.
void run_gemm_plan(const GemmPlan& p, const GemmDesc& d, const Tensor& a, const Tensor& b,
                   const Tensor& c, float* scratch);

// OpenBLAS's threading as loaded at run time: "OpenMP", "pthreads" or "sequential". With
// pthreads its pool and the OpenMP team of the other kernels contend for the cores.
const char* blas_threading();

}  // namespace cpu
}  // namespace memfit
