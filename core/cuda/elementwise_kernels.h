// Launchers for the CUDA backend's elementwise kernels (elementwise_kernels.cu): plain
// functions so C++20 callers (cuda_elementwise.cpp, cuda_gemm.cpp) never include CUDA device
// code and the .cu file (C++17 under nvcc) never includes backend.h.
//
//   launch_cast(stream, src, DType::kF32, dst, DType::kBF16, n);   // queued; checked launch
//
// Arithmetic is FP32 as on the CPU backend: 16-bit inputs widen exactly, results round to the
// output dtype to nearest even (__float2half_rn / __float2bfloat16_rn). Every launcher checks
// its launch (CudaError) and does nothing for n == 0. Pointers are device memory aligned to
// their element size; n is any size (64-bit indexing).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace memfit::cuda {

// x[i] = value rounded to dt.
void launch_fill(cudaStream_t s, void* x, DType dt, float value, std::int64_t n);
// dst[i] = round(src[i]) (any dtypes; src and dst do not overlap).
void launch_cast(cudaStream_t s, const void* src, DType st, void* dst, DType dt, std::int64_t n);
// y[i] = round(y[i] + a * x[i]), the product rounded to f32 first (no FMA), as the CPU does.
void launch_axpy(cudaStream_t s, float a, const void* x, DType xt, void* y, DType yt,
                 std::int64_t n);
// x[i] = round(x[i] * a).
void launch_scale(cudaStream_t s, float a, void* x, DType dt, std::int64_t n);

// sumsq in two launches: sumsq_partials() blocks each reduce a fixed slice of x into one
// (double sum of finite squares, non-finite count) pair; sumsq_finish() adds the pairs in
// block order and does out[0] += sum, out[1] += count in f32. The grid depends on n only, so
// the result is the same bits on every run.
std::int64_t sumsq_partial_count(std::int64_t n);  // pairs sumsq_partials() writes
// partials: sumsq_partial_count(n) doubles followed by as many int64 counts (16 B per pair).
void launch_sumsq(cudaStream_t s, const void* x, DType dt, std::int64_t n, void* partials,
                  float* out);

}  // namespace memfit::cuda
