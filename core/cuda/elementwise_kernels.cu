// The CUDA backend's elementwise kernels; see elementwise_kernels.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda_lib_check.h"
#include "core/cuda/elementwise_kernels.h"

namespace memfit::cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride kernels: enough blocks to fill an H200 (132 SMs x 2048 threads = 1056 blocks of
// 256) several times over; more only adds scheduling.
constexpr std::int64_t kMaxBlocks = 8192;

int blocks_for(std::int64_t n) {
  return static_cast<int>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// Storage types: f32 is float; the 16-bit types are their CUDA structs (same bits as memfit's
// uint16 storage).
template <typename T>
__device__ __forceinline__ float load(const T* p, std::int64_t i);
template <>
__device__ __forceinline__ float load<float>(const float* p, std::int64_t i) {
  return p[i];
}
template <>
__device__ __forceinline__ float load<__half>(const __half* p, std::int64_t i) {
  return __half2float(p[i]);
}
template <>
__device__ __forceinline__ float load<__nv_bfloat16>(const __nv_bfloat16* p, std::int64_t i) {
  return __bfloat162float(p[i]);
}

template <typename T>
__device__ __forceinline__ void store(T* p, std::int64_t i, float v);
template <>
__device__ __forceinline__ void store<float>(float* p, std::int64_t i, float v) {
  p[i] = v;
}
template <>
__device__ __forceinline__ void store<__half>(__half* p, std::int64_t i, float v) {
  p[i] = __float2half_rn(v);
}
template <>
__device__ __forceinline__ void store<__nv_bfloat16>(__nv_bfloat16* p, std::int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ std::int64_t first_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

template <typename T>
__global__ void fill_kernel(T* x, float value, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) store(x, i, value);
}

template <typename S, typename D>
__global__ void cast_kernel(const S* src, D* dst, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) store(dst, i, load(src, i));
}

template <typename X, typename Y>
__global__ void axpy_kernel(float a, const X* x, Y* y, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    // __fmul_rn/__fadd_rn keep nvcc from contracting into an FMA: the CPU rounds the product.
    store(y, i, __fadd_rn(load(y, i), __fmul_rn(a, load(x, i))));
  }
}

template <typename T>
__global__ void scale_kernel(float a, T* x, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    store(x, i, __fmul_rn(load(x, i), a));
  }
}

// Block-wide sums in shared memory by a fixed tree: the same order on every run.
template <typename V>
__device__ V block_sum(V v, V* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) shared[threadIdx.x] += shared[threadIdx.x + step];
    __syncthreads();
  }
  const V total = shared[0];
  __syncthreads();  // shared is reused by the next call
  return total;
}

template <typename T>
__global__ void sumsq_partials_kernel(const T* x, std::int64_t n, double* sums,
                                      long long* counts) {
  __shared__ double sh_sum[kThreads];
  __shared__ long long sh_cnt[kThreads];
  double s = 0.0;
  long long bad = 0;
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const float v = load(x, i);
    if (isfinite(v)) {
      const double d = v;
      s += d * d;
    } else {
      ++bad;
    }
  }
  s = block_sum(s, sh_sum);
  bad = block_sum(bad, sh_cnt);
  if (threadIdx.x == 0) {
    sums[blockIdx.x] = s;
    counts[blockIdx.x] = bad;
  }
}

// One block: thread t adds partials t, t + blockDim, ... in order, then the tree.
__global__ void sumsq_finish_kernel(const double* sums, const long long* counts, int parts,
                                    float* out) {
  __shared__ double sh_sum[kThreads];
  __shared__ long long sh_cnt[kThreads];
  double s = 0.0;
  long long bad = 0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) {
    s += sums[i];
    bad += counts[i];
  }
  s = block_sum(s, sh_sum);
  bad = block_sum(bad, sh_cnt);
  if (threadIdx.x == 0) {
    // As the CPU backend: the f32 slot widened, the double total added, rounded once.
    out[0] = static_cast<float>(static_cast<double>(out[0]) + s);
    out[1] = static_cast<float>(static_cast<double>(out[1]) + static_cast<double>(bad));
  }
}

// Calls f(T*) with the pointer typed after dt.
template <typename F>
void dispatch(DType dt, void* p, F&& f) {
  switch (dt) {
    case DType::kF32:
      f(static_cast<float*>(p));
      return;
    case DType::kF16:
      f(static_cast<__half*>(p));
      return;
    case DType::kBF16:
      f(static_cast<__nv_bfloat16*>(p));
      return;
  }
}
template <typename F>
void dispatch(DType dt, const void* p, F&& f) {
  switch (dt) {
    case DType::kF32:
      f(static_cast<const float*>(p));
      return;
    case DType::kF16:
      f(static_cast<const __half*>(p));
      return;
    case DType::kBF16:
      f(static_cast<const __nv_bfloat16*>(p));
      return;
  }
}

}  // namespace

void launch_fill(cudaStream_t s, void* x, DType dt, float value, std::int64_t n) {
  if (n <= 0) return;
  dispatch(dt, x, [&](auto* p) { fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, value, n); });
  MEMFIT_CUDA_LAUNCH_CHECK();
}

void launch_cast(cudaStream_t s, const void* src, DType st, void* dst, DType dt, std::int64_t n) {
  if (n <= 0) return;
  dispatch(st, src, [&](const auto* in) {
    dispatch(dt, dst, [&](auto* out) { cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(in, out, n); });
  });
  MEMFIT_CUDA_LAUNCH_CHECK();
}

void launch_axpy(cudaStream_t s, float a, const void* x, DType xt, void* y, DType yt,
                 std::int64_t n) {
  if (n <= 0) return;
  dispatch(xt, x, [&](const auto* xp) {
    dispatch(yt, y, [&](auto* yp) { axpy_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, xp, yp, n); });
  });
  MEMFIT_CUDA_LAUNCH_CHECK();
}

void launch_scale(cudaStream_t s, float a, void* x, DType dt, std::int64_t n) {
  if (n <= 0) return;
  dispatch(dt, x, [&](auto* p) { scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, p, n); });
  MEMFIT_CUDA_LAUNCH_CHECK();
}

// At most 1024 partials: one finishing block reads them all, and 1024 blocks of 256 threads
// keep an H200's SMs busy (memory bound, grid-stride).
std::int64_t sumsq_partial_count(std::int64_t n) {
  return std::max<std::int64_t>(1, std::min<std::int64_t>((n + kThreads - 1) / kThreads, 1024));
}

void launch_sumsq(cudaStream_t s, const void* x, DType dt, std::int64_t n, void* partials,
                  float* out) {
  if (n <= 0) return;  // adds 0 and 0: nothing to do
  const int parts = static_cast<int>(sumsq_partial_count(n));
  double* sums = static_cast<double*>(partials);
  long long* counts = reinterpret_cast<long long*>(sums + parts);
  dispatch(dt, x, [&](const auto* p) {
    sumsq_partials_kernel<<<parts, kThreads, 0, s>>>(p, n, sums, counts);
  });
  MEMFIT_CUDA_LAUNCH_CHECK();
  sumsq_finish_kernel<<<1, kThreads, 0, s>>>(sums, counts, parts, out);
  MEMFIT_CUDA_LAUNCH_CHECK();
}

}  // namespace memfit::cuda
