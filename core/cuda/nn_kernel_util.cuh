// Device helpers shared by the CUDA backend's neural-network kernel files (nn_kernels.cu: row
// and elementwise ops; loss_kernels.cu: embeddings, cross-entropy, AdamW). See nn_kernels.cu's
// header for the layout of the work and the type scheme (one element type T, or Dyn).
// Everything here sits in an anonymous namespace: private to each .cu file that includes it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "core/cuda/nn_kernels.h"

namespace memfit::cuda {
namespace {

using i64 = std::int64_t;

constexpr int kThreads = 256;  // threads per block for elementwise and row-per-warp kernels
constexpr int kWarp = 32;
constexpr i64 kMaxGrid = i64{1} << 20;  // grid-stride beyond this many blocks
constexpr unsigned kFull = 0xffffffffu;

// GPT-2's GELU constants, as the CPU reference (core/cpu/nn_ops.cpp).
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

// ---- element access ------------------------------------------------------------------------

struct Dyn {};  // "each operand's dtype is in its code"

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T narrow(float v);
template <>
__device__ __forceinline__ float narrow<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half narrow<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float load_code(const void* p, int dt, i64 i) {
  if (dt == kCodeF32) return static_cast<const float*>(p)[i];
  if (dt == kCodeF16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ void store_code(void* p, int dt, i64 i, float v) {
  if (dt == kCodeF32) {
    static_cast<float*>(p)[i] = v;
  } else if (dt == kCodeF16) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
}

// In<T>: a read-only operand, In<T>(i) is element i widened to float. Out<T>: a written one.
template <typename T>
struct In {
  const T* p;
  __device__ __forceinline__ float operator()(i64 i) const { return widen(p[i]); }
  static In make(const void* q, int) { return {static_cast<const T*>(q)}; }
};
template <>
struct In<Dyn> {
  const void* p;
  int dt;
  __device__ __forceinline__ float operator()(i64 i) const { return load_code(p, dt, i); }
  static In make(const void* q, int code) { return {q, code}; }
};

template <typename T>
struct Out {
  T* p;
  __device__ __forceinline__ float get(i64 i) const { return widen(p[i]); }
  __device__ __forceinline__ void operator()(i64 i, float v) const { p[i] = narrow<T>(v); }
  static Out make(void* q, int) { return {static_cast<T*>(q)}; }
};
template <>
struct Out<Dyn> {
  void* p;
  int dt;
  __device__ __forceinline__ float get(i64 i) const { return load_code(p, dt, i); }
  __device__ __forceinline__ void operator()(i64 i, float v) const { store_code(p, dt, i, v); }
  static Out make(void* q, int code) { return {q, code}; }
};

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with T the element type every code in `codes` names, or Dyn when they
// differ. f returns cudaError_t.
template <typename F>
cudaError_t dispatch(std::initializer_list<int> codes, F&& f) {
  const int first = *codes.begin();
  for (int c : codes) {
    if (c != first) return f(Tag<Dyn>{});
  }
  if (first == kCodeF32) return f(Tag<float>{});
  if (first == kCodeF16) return f(Tag<__half>{});
  return f(Tag<__nv_bfloat16>{});
}

unsigned grid_for(i64 work, i64 per_block) {
  const i64 blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

__device__ __forceinline__ i64 global_index() {
  return static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ i64 global_stride() { return static_cast<i64>(gridDim.x) * blockDim.x; }

// Butterfly sums: every lane ends with the same bits (a + b == b + a exactly in IEEE).
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(kFull, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

// The warp-per-row loop: r runs over [0, rows), the same r in every lane of a warp.
#define MEMFIT_FOR_WARP_ROWS(r, rows)                                                     \
  for (i64 r = static_cast<i64>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; \
       r < (rows); r += static_cast<i64>(gridDim.x) * (blockDim.x / kWarp))

#define MEMFIT_RETURN_IF_LAUNCH_FAILED()       \
  do {                                         \
    const cudaError_t e_ = cudaGetLastError(); \
    if (e_ != cudaSuccess) return e_;          \
  } while (0)

constexpr std::size_t kScratchAlign = 256;
std::size_t align_up(std::size_t b) {
  return (b + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

}  // namespace
}  // namespace memfit::cuda
