// CPU GEMM: the dispatch between oneDNN and BLAS (gemm_engine.h chooses), and the BLAS path:
// f16/bf16 widened to f32 scratch, OpenBLAS sgemm with FP32 accumulation, the result rounded
// once to C's dtype. Shapes as in backend.h: A[b] (m,k) or (k,m) when trans_a, B[b] (k,n) or
// (n,k) when trans_b, C[b] (m,n), all row-major and dense.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/gemm_dnnl.h"
#include "core/cpu/gemm_engine.h"
#include "memory/block.h"
#include "memory/caching_allocator.h"
#include "memory/size.h"

namespace memfit {
namespace cpu {
namespace {

const char* element(const Tensor& t, std::int64_t offset) {
  return static_cast<const char*>(t.raw()) +
         static_cast<std::size_t>(offset) * dtype_size(t.dtype());
}

// f32 view of `count` elements of t from `offset`: t's own memory when it is f32, else the
// elements widened into `scratch`.
const float* as_f32(const Tensor& t, std::int64_t offset, std::int64_t count, float* scratch) {
  if (t.dtype() == DType::kF32) return reinterpret_cast<const float*>(element(t, offset));
  convert(element(t, offset), t.dtype(), scratch, DType::kF32, static_cast<std::size_t>(count));
  return scratch;
}

std::size_t floats_if_narrow(const Tensor& t, std::int64_t x, std::int64_t y) {
  return t.dtype() == DType::kF32 ? 0 : static_cast<std::size_t>(x * y);
}

}  // namespace

void blas_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                const float* b, float beta, float* c) {
  const int lda = trans_a ? m : k;
  const int ldb = trans_b ? k : n;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, std::max(lda, 1), b,
              std::max(ldb, 1), beta, c, std::max(n, 1));
}

std::size_t gemm_scratch_floats(const GemmDesc& d, const Tensor& a, const Tensor& b,
                                const Tensor& c) {
  return plan_gemm(d, a.dtype(), b.dtype(), c.dtype(), gemm_engine_from_env()).scratch_floats;
}

void gemm(const GemmDesc& d, const Tensor& a, const Tensor& b, const Tensor& c, float* scratch) {
  run_gemm_plan(plan_gemm(d, a.dtype(), b.dtype(), c.dtype(), gemm_engine_from_env()), d, a, b, c,
                scratch);
}

const char* blas_threading() {
  switch (openblas_get_parallel()) {
    case 0:
      return "sequential";
    case 1:
      return "pthreads";
    case 2:
      return "OpenMP";
  }
  return "unknown";
}

namespace {

// The BLAS path: scratch holds blas-path floats (gemm_engine.cpp's blas_scratch_floats).
void widening_gemm(const GemmDesc& d, const Tensor& a, const Tensor& b, const Tensor& c,
                   float* scratch) {
  const std::int64_t size_a = d.m * d.k;
  const std::int64_t size_b = d.k * d.n;
  const std::int64_t size_c = d.m * d.n;
  float* sa = scratch;
  float* sb = sa + floats_if_narrow(a, d.m, d.k);
  float* sc = sb + floats_if_narrow(b, d.k, d.n);
  const float* fa = nullptr;
  const float* fb = nullptr;
  for (std::int64_t i = 0; i < d.batch; ++i) {
    // A broadcast operand (stride 0) is widened once for the whole batch.
    if (d.k > 0) {
      if (i == 0 || d.stride_a != 0) fa = as_f32(a, i * d.stride_a, size_a, sa);
      if (i == 0 || d.stride_b != 0) fb = as_f32(b, i * d.stride_b, size_b, sb);
    }
    float* fc;
    char* c_elem = const_cast<char*>(element(c, i * d.stride_c));
    if (c.dtype() == DType::kF32) {
      fc = reinterpret_cast<float*>(c_elem);
    } else {
      fc = sc;
      // beta == 0: the old C must not be read (it may be NaN), so it is not even widened.
      if (d.beta != 0.0f) {
        convert(c_elem, c.dtype(), fc, DType::kF32, static_cast<std::size_t>(size_c));
      }
    }
    if (d.k == 0) {
      // BLAS rejects lda = 0, and there is nothing to multiply: C = beta * C.
      if (d.beta == 0.0f) {
        std::fill_n(fc, size_c, 0.0f);
      } else {
        for (std::int64_t j = 0; j < size_c; ++j) fc[j] *= d.beta;
      }
    } else {
      blas_sgemm(d.trans_a, d.trans_b, static_cast<int>(d.m), static_cast<int>(d.n),
                 static_cast<int>(d.k), d.alpha, fa, fb, d.beta, fc);
    }
    if (c.dtype() != DType::kF32) {
      convert(fc, DType::kF32, c_elem, c.dtype(), static_cast<std::size_t>(size_c));
    }
  }
}

}  // namespace

void run_gemm_plan(const GemmPlan& p, const GemmDesc& d, const Tensor& a, const Tensor& b,
                   const Tensor& c, float* scratch) {
  switch (p.path) {
    case GemmPath::kNone:
      return;
    case GemmPath::kDnnl:
      p.dnnl->run(a.raw(), b.raw(), c.raw(), scratch);
      return;
    case GemmPath::kBlas:
      widening_gemm(d, a, b, c, scratch);
      return;
  }
}

}  // namespace cpu

std::int64_t CpuBackend::max_gemm_dim() const { return INT_MAX; }

void CpuBackend::run_gemm(StreamId stream, const GemmDesc& d, const Tensor& a, const Tensor& b,
                          const Tensor& c) {
  // One plan for the scratch and the call: the engine variable is read once.
  const cpu::GemmPlan plan =
      cpu::plan_gemm(d, a.dtype(), b.dtype(), c.dtype(), cpu::gemm_engine_from_env());
  const std::size_t floats = plan.scratch_floats;
  if (floats == 0) {
    cpu::run_gemm_plan(plan, d, a, b, c, nullptr);
  } else if (workspace_ != nullptr) {
    // Freed on return: the GEMM is done by then, on whichever thread runs the stream.
    Block ws = workspace_->allocate(checked_mul(floats, sizeof(float), "CPU GEMM scratch"),
                                    Category::kWorkspace, stream, "cpu.gemm.scratch");
    cpu::run_gemm_plan(plan, d, a, b, c, ws.as<float>());
  } else {
    cpu::ScratchPool::Lease ws = scratch_.take(floats);
    cpu::run_gemm_plan(plan, d, a, b, c, ws.data());
  }
}

}  // namespace memfit
