// oneDNN matmul for the CPU GEMM of backend.h: bf16/f16/f32 operands read as they are (no
// widening), FP32 accumulation, the result written once in C's dtype. One DnnlMatmul per
// GEMM shape (m, n, k, batch, strides, transposes, alpha, beta, dtypes), created on first
// use and cached for the process, as the CUDA backend caches its cuBLASLt plans.
//
//   std::shared_ptr<const DnnlMatmul> mm = find_dnnl_matmul(d, DType::kBF16, DType::kBF16, DType::kF32);
//   if (mm) {                                        // nullptr: oneDNN cannot run this GEMM
//     std::vector<std::byte> scratch(mm->scratch_bytes());
//     mm->run(a.raw(), b.raw(), c.raw(), scratch.data());
//   }
//
// Layout: op(A) is described to oneDNN as (batch, m, k) with strides (stride_a, k, 1), or
// (stride_a, 1, m) when trans_a; a broadcast operand (stride 0) has batch dimension 1, which
// matmul broadcasts. alpha is an output scale, beta a sum post-op (none when beta == 0, so C
// is then never read). oneDNN runs in user-scratchpad mode: the caller hands it
// scratch_bytes() of memory per call (the CPU backend takes it from its budgeted workspace
// allocator and the meta backend mirrors it), so two threads can run one DnnlMatmul at once.
// The scratch size and the kernel depend on the OpenMP thread count when the entry was
// created; the cache keeps the first, so a dry run and the run it predicts see one size.
// Thread safety: find_dnnl_matmul and run are safe from any thread (the cache has a lock, the
// primitive is created once under std::call_once; oneDNN primitives are reentrant). Call run
// outside an OpenMP parallel region (oneDNN then runs its kernels on one thread of a team).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/backend.h"
#include "core/dtype.h"

namespace memfit {
namespace cpu {

class DnnlMatmul {
 public:
  struct State;  // gemm_dnnl.cpp: oneDNN's primitive descriptor and primitive
  explicit DnnlMatmul(std::unique_ptr<State> state);
  ~DnnlMatmul();
  DnnlMatmul(const DnnlMatmul&) = delete;
  DnnlMatmul& operator=(const DnnlMatmul&) = delete;

  std::size_t scratch_bytes() const { return scratch_bytes_; }
  // oneDNN's name for the kernel it chose, e.g. "brg:avx512_core_bf16"; "ref:any" is its
  // reference loop nest (correct, orders of magnitude slower than a BLAS).
  const std::string& impl() const { return impl_; }
  bool reference() const { return impl_.rfind("ref", 0) == 0; }

  // C = alpha * op(A) @ op(B) + beta * C over the batch; a, b and c point at the first
  // element of the first matrix; scratch holds scratch_bytes() (any alignment).
  void run(const void* a, const void* b, void* c, void* scratch) const;

 private:
  std::unique_ptr<State> state_;
  std::size_t scratch_bytes_ = 0;
  std::string impl_;
};

// The cached matmul for `d` (strides resolved, m, n, k and batch > 0), or nullptr when oneDNN
// has no implementation for these dtypes (f16 on CPUs without AVX512-FP16 in oneDNN 2.6, mixed
// A/B dtypes, ...). The cache holds at most a few thousand shapes; past that it starts over.
std::shared_ptr<const DnnlMatmul> find_dnnl_matmul(const GemmDesc& d, DType a, DType b, DType c);

// What oneDNN dispatches to on this CPU: its effective ISA, as instruction-set names.
struct DnnlIsa {
  bool avx512_core = false;  // AVX-512 F/BW/VL/DQ: oneDNN's f32 brgemm kernels
  bool bf16 = false;         // AVX512-BF16 (or AMX): native bf16 dot products
  bool amx = false;          // AMX tiles
  const char* name = "";     // e.g. "avx512_core_bf16"
};
const DnnlIsa& dnnl_isa();

}  // namespace cpu
}  // namespace memfit
