// CudaBackend::do_gemm: backend.h's batched row-major GEMM through cuBLASLt.
//
// Row-major to column-major: a row-major (r, c) matrix is, byte for byte, the column-major
// (c, r) matrix, its transpose. So C = op(A) op(B) (row-major) is computed as the
// column-major C^T = op(B)^T op(A)^T: cuBLASLt's "A" is memfit's B, its "B" is memfit's A,
// and its (M, N, K) is (n, m, k). Each layout describes the stored matrix (rows, cols, ld of
// the column-major view); the transposes are matmul descriptor attributes.
//
// Types (cuBLASLt, cublasLtMatmul "supported data types" with CUBLAS_COMPUTE_32F and an FP32
// scale type): A and B of one type (f32, f16 or bf16); C either that type or f32. Other
// combinations go through scratch: A and B of different types are both cast to f32 (the wider
// type), and a C of another 16-bit type (or a 16-bit C under f32 inputs) is computed in an f32
// temporary (holding C widened when beta != 0) and rounded into C after, which is the CPU
// backend's order of rounding.
//
// k == 0: C = beta * C with a fill or scale kernel (no cuBLASLt call: a K of 0 is not a
// matmul cuBLASLt documents).
//
// Plans (matmul descriptor, three layouts, the heuristic's algorithm) are cached per shape,
// dtypes, strides, alignments and workspace cap: a training step repeats a few dozen shapes, so
// the heuristic runs once per shape. Alignment matters because cuBLASLt's heuristic assumes
// 256-byte aligned buffers unless told otherwise (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES,
// default 256), and an algorithm picked for 256 may fault on a view at an odd offset.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_backend_impl.h"
#include "core/cuda/cuda_lib_check.h"
#include "core/cuda/elementwise_kernels.h"
#include "memory/caching_allocator.h"
#include "memory/check.h"
#include "memory/cuda/cuda_check.h"
#include "memory/error.h"

namespace memfit {
namespace cuda {

struct GemmKey {
  std::int64_t m, n, k, batch, stride_a, stride_b, stride_c;
  bool trans_a, trans_b;
  DType a, b, c;
  cublasComputeType_t compute;
  std::uint32_t align_a, align_b, align_c;
  std::size_t workspace_cap;

  bool operator==(const GemmKey& o) const {
    return m == o.m && n == o.n && k == o.k && batch == o.batch && stride_a == o.stride_a &&
           stride_b == o.stride_b && stride_c == o.stride_c && trans_a == o.trans_a &&
           trans_b == o.trans_b && a == o.a && b == o.b && c == o.c && compute == o.compute &&
           align_a == o.align_a && align_b == o.align_b && align_c == o.align_c &&
           workspace_cap == o.workspace_cap;
  }
};

struct GemmKeyHash {
  std::size_t operator()(const GemmKey& k) const {
    std::size_t h = 1469598103934665603ull;
    auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<std::uint64_t>(k.m));
    mix(static_cast<std::uint64_t>(k.n));
    mix(static_cast<std::uint64_t>(k.k));
    mix(static_cast<std::uint64_t>(k.batch));
    mix(static_cast<std::uint64_t>(k.stride_a));
    mix(static_cast<std::uint64_t>(k.stride_b));
    mix(static_cast<std::uint64_t>(k.stride_c));
    mix((k.trans_a ? 1u : 0u) | (k.trans_b ? 2u : 0u) | (static_cast<unsigned>(k.a) << 2) |
        (static_cast<unsigned>(k.b) << 4) | (static_cast<unsigned>(k.c) << 6));
    mix(static_cast<std::uint64_t>(k.compute));
    mix((static_cast<std::uint64_t>(k.align_a) << 40) | (static_cast<std::uint64_t>(k.align_b) << 20) |
        k.align_c);
    mix(k.workspace_cap);
    return h;
  }
};

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr;  // cuBLASLt's A = memfit's B
  cublasLtMatrixLayout_t lb = nullptr;  // cuBLASLt's B = memfit's A
  cublasLtMatrixLayout_t lc = nullptr;  // C and D
  cublasLtMatmulHeuristicResult_t heuristic{};

  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    if (lc) (void)cublasLtMatrixLayoutDestroy(lc);
    if (lb) (void)cublasLtMatrixLayoutDestroy(lb);
    if (la) (void)cublasLtMatrixLayoutDestroy(la);
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
  }
};

struct GemmPlanCache {
  std::mutex mu;
  std::unordered_map<GemmKey, std::unique_ptr<GemmPlan>, GemmKeyHash> plans;
};

void destroy_gemm_plan_cache(GemmPlanCache* cache) { delete cache; }

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
  }
  MEMFIT_CHECK(false) << "unknown dtype";
  return CUDA_R_32F;
}

// Largest power of two dividing `v`, capped at 256 (cuBLASLt's default assumption).
std::uint32_t pow2_align(std::uint64_t v) {
  if (v == 0) return 256;
  const std::uint64_t low = v & (~v + 1);
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(low, 256));
}

// The alignment every matrix of a batch has: base address, leading dimension and batch step.
std::uint32_t operand_align(const void* p, std::int64_t ld, std::int64_t stride,
                            std::int64_t batch, DType t) {
  const std::uint64_t es = dtype_size(t);
  std::uint32_t al = pow2_align(reinterpret_cast<std::uintptr_t>(p));
  al = std::min(al, pow2_align(static_cast<std::uint64_t>(ld) * es));
  if (batch > 1 && stride > 0) al = std::min(al, pow2_align(static_cast<std::uint64_t>(stride) * es));
  return al;
}

void set_layout_batch(cublasLtMatrixLayout_t l, std::int64_t batch, std::int64_t stride) {
  if (batch <= 1) return;
  const std::int32_t count = static_cast<std::int32_t>(batch);
  MEMFIT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof(count)));
  const std::int64_t off = stride;
  MEMFIT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off, sizeof(off)));
}

std::string shape_text(const GemmKey& k) {
  return "m=" + std::to_string(k.m) + " n=" + std::to_string(k.n) + " k=" + std::to_string(k.k) +
         " batch=" + std::to_string(k.batch) + " trans_a=" + std::to_string(k.trans_a) +
         " trans_b=" + std::to_string(k.trans_b) + " A " + dtype_name(k.a) + " B " +
         dtype_name(k.b) + " C " + dtype_name(k.c) + " align " + std::to_string(k.align_a) + "/" +
         std::to_string(k.align_b) + "/" + std::to_string(k.align_c);
}

std::unique_ptr<GemmPlan> make_plan(cublasLtHandle_t lt, const GemmKey& key) {
  auto plan = std::make_unique<GemmPlan>();
  MEMFIT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, key.compute, CUDA_R_32F));
  // cuBLASLt's A is memfit's B (op = trans_b), its B is memfit's A (op = trans_a).
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  MEMFIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                     &op_a, sizeof(op_a)));
  MEMFIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                     &op_b, sizeof(op_b)));
  // Stored column-major shapes (rows, cols, ld):
  //   memfit B (k,n) row-major = (n,k) col-major, ld n; trans_b: (n,k) row = (k,n) col, ld k.
  //   memfit A (m,k) row-major = (k,m) col-major, ld k; trans_a: (k,m) row = (m,k) col, ld m.
  //   memfit C (m,n) row-major = (n,m) col-major, ld n.
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  if (key.trans_b) {
    MEMFIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->la, cuda_type(key.b), u(key.k), u(key.n), key.k));
  } else {
    MEMFIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->la, cuda_type(key.b), u(key.n), u(key.k), key.n));
  }
  if (key.trans_a) {
    MEMFIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lb, cuda_type(key.a), u(key.m), u(key.k), key.m));
  } else {
    MEMFIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lb, cuda_type(key.a), u(key.k), u(key.m), key.k));
  }
  MEMFIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lc, cuda_type(key.c), u(key.n), u(key.m), key.n));
  set_layout_batch(plan->la, key.batch, key.stride_b);
  set_layout_batch(plan->lb, key.batch, key.stride_a);
  set_layout_batch(plan->lc, key.batch, key.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  MEMFIT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_guard(pref, &cublasLtMatmulPreferenceDestroy);
  const std::size_t ws = key.workspace_cap;
  MEMFIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // A/B here are cuBLASLt's: memfit's B and A.
  const std::uint32_t al_a = key.align_b;
  const std::uint32_t al_b = key.align_a;
  const std::uint32_t al_c = key.align_c;
  MEMFIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  MEMFIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  MEMFIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  MEMFIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  // Split-K only with partials kept in the compute type (f32): the default mask also allows
  // CUBLASLT_REDUCTION_SCHEME_INPLACE and _OUTPUT_TYPE, which sum the partials in C's type, so a
  // f16/bf16 C would be rounded once per K slice, not once at the end as backend.h and the CPU
  // backend do (cublasLt.h, cublasLtReductionScheme_t).
  const std::uint32_t reductions =
      CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  MEMFIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions, sizeof(reductions)));

  int returned = 0;
  MEMFIT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, plan->desc, plan->la, plan->lb,
                                                     plan->lc, plan->lc, pref, 1,
                                                     &plan->heuristic, &returned));
  if (returned == 0) {
    throw CudaError("cublasLtMatmulAlgoGetHeuristic found no algorithm for " + shape_text(key) +
                    " (CUBLAS_STATUS_NOT_SUPPORTED)");
  }
  return plan;
}

// Elements from a batch's first matrix to the end of its last.
std::int64_t extent(std::int64_t batch, std::int64_t stride, std::int64_t size) {
  return (batch - 1) * stride + size;
}

}  // namespace
}  // namespace cuda

void CudaBackend::do_gemm(StreamId stream, const GemmDesc& d, const Tensor& a, const Tensor& b,
                          const Tensor& c) {
  if (d.m == 0 || d.n == 0 || d.batch == 0) return;
  cuda::DeviceGuard guard(impl_->device);
  const cudaStream_t s = impl_->stream(stream);
  const std::int64_t mn = d.m * d.n;

  // Applies f(offset of matrix b in C, elements) to C's matrices, not to the gaps between them.
  auto each_c = [&](const std::function<void(std::int64_t, std::int64_t)>& f) {
    if (d.batch == 1 || d.stride_c == mn) {
      f(0, d.batch * mn);
    } else {
      for (std::int64_t i = 0; i < d.batch; ++i) f(i * d.stride_c, mn);
    }
  };
  auto c_at = [&](std::int64_t off) {
    return static_cast<char*>(c.raw()) + off * static_cast<std::int64_t>(dtype_size(c.dtype()));
  };

  if (d.k == 0) {  // C = beta * C
    if (d.beta == 1.0f) return;
    each_c([&](std::int64_t off, std::int64_t len) {
      if (d.beta == 0.0f) {
        cuda::launch_fill(s, c_at(off), c.dtype(), 0.0f, len);
      } else {
        cuda::launch_scale(s, d.beta, c_at(off), c.dtype(), len);
      }
    });
    return;
  }

  // A and B of one type for cuBLASLt: mixed types both go to f32 in scratch.
  const void* pa = a.raw();
  const void* pb = b.raw();
  DType ta = a.dtype();
  DType tb = b.dtype();
  const std::int64_t size_a = d.m * d.k;
  const std::int64_t size_b = d.k * d.n;
  std::unique_ptr<CudaScratch> cast_a;
  std::unique_ptr<CudaScratch> cast_b;
  if (ta != tb) {
    if (ta != DType::kF32) {
      const std::int64_t n = cuda::extent(d.batch, d.stride_a, size_a);
      cast_a = std::make_unique<CudaScratch>(*this, stream, static_cast<std::size_t>(n) * 4,
                                             "cuda.gemm.cast");
      cuda::launch_cast(s, pa, ta, cast_a->data(), DType::kF32, n);
      pa = cast_a->data();
      ta = DType::kF32;
    }
    if (tb != DType::kF32) {
      const std::int64_t n = cuda::extent(d.batch, d.stride_b, size_b);
      cast_b = std::make_unique<CudaScratch>(*this, stream, static_cast<std::size_t>(n) * 4,
                                             "cuda.gemm.cast");
      cuda::launch_cast(s, pb, tb, cast_b->data(), DType::kF32, n);
      pb = cast_b->data();
      tb = DType::kF32;
    }
  }

  // C: its own type when cuBLASLt takes it (the inputs' type or f32), else a packed f32
  // temporary rounded into C afterwards.
  void* pc = c.raw();
  DType tc = c.dtype();
  std::int64_t stride_c = d.stride_c;
  std::unique_ptr<CudaScratch> temp_c;
  if (tc != ta && tc != DType::kF32) {
    temp_c = std::make_unique<CudaScratch>(*this, stream,
                                           static_cast<std::size_t>(d.batch * mn) * 4,
                                           "cuda.gemm.cast");
    char* t = static_cast<char*>(temp_c->data());
    if (d.beta != 0.0f) {
      std::int64_t i = 0;
      each_c([&](std::int64_t off, std::int64_t len) {
        cuda::launch_cast(s, c_at(off), tc, t + i * mn * 4, DType::kF32, len);
        i += len / mn;
      });
    }
    pc = temp_c->data();
    tc = DType::kF32;
    stride_c = mn;
  }

  cuda::GemmKey key{};
  key.m = d.m;
  key.n = d.n;
  key.k = d.k;
  key.batch = d.batch;
  key.stride_a = d.stride_a;
  key.stride_b = d.stride_b;
  key.stride_c = stride_c;
  key.trans_a = d.trans_a;
  key.trans_b = d.trans_b;
  key.a = ta;
  key.b = tb;
  key.c = tc;
  key.compute = (ta == DType::kF32 && options_.allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                            : CUBLAS_COMPUTE_32F;
  key.align_a = cuda::operand_align(pa, d.trans_a ? d.m : d.k, d.stride_a, d.batch, ta);
  key.align_b = cuda::operand_align(pb, d.trans_b ? d.k : d.n, d.stride_b, d.batch, tb);
  key.align_c = cuda::operand_align(pc, d.n, stride_c, d.batch, tc);
  key.workspace_cap = workspace_ != nullptr ? options_.gemm_workspace_bytes : 0;

  cuda::GemmPlan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->gemm_cache == nullptr) impl_->gemm_cache = new cuda::GemmPlanCache();
  }
  cuda::GemmPlanCache& cache = *impl_->gemm_cache;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.plans.find(key);
    if (it != cache.plans.end()) plan = it->second.get();
  }
  if (plan == nullptr) {
    std::unique_ptr<cuda::GemmPlan> fresh = cuda::make_plan(impl_->lt, key);
    std::lock_guard<std::mutex> lock(cache.mu);
    auto [it, inserted] = cache.plans.emplace(key, std::move(fresh));
    plan = it->second.get();  // another thread's equal plan if it won the race
  }

  // Only what the chosen algorithm needs, from the allocator (budgeted as kWorkspace). It is
  // allocated on this stream, so freeing it right after queueing is safe: the allocator hands
  // it to later work on this stream only, which runs after the matmul.
  Block ws;
  const std::size_t ws_bytes = plan->heuristic.workspaceSize;
  if (ws_bytes > 0) {
    MEMFIT_CHECK(workspace_ != nullptr) << "cuBLASLt asked for workspace with a cap of 0";
    ws = workspace_->allocate(ws_bytes, Category::kWorkspace, stream, "cuda.gemm.workspace");
  }
  const float alpha = d.alpha;
  const float beta = d.beta;
  // cuBLASLt's A is memfit's B and vice versa; C and D are the same buffer.
  MEMFIT_CUBLAS_CHECK(cublasLtMatmul(impl_->lt, plan->desc, &alpha, pb, plan->la, pa, plan->lb,
                                     &beta, pc, plan->lc, pc, plan->lc, &plan->heuristic.algo,
                                     ws.data(), ws_bytes, s));

  if (temp_c) {
    const char* t = static_cast<const char*>(temp_c->data());
    std::int64_t i = 0;
    each_c([&](std::int64_t off, std::int64_t len) {
      cuda::launch_cast(s, t + i * mn * 4, DType::kF32, c_at(off), c.dtype(), len);
      i += len / mn;
    });
  }
}

}  // namespace memfit
