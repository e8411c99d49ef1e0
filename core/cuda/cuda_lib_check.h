// MEMFIT_CUBLAS_CHECK, MEMFIT_CUDNN_CHECK, MEMFIT_CUDA_LAUNCH_CHECK: library statuses and
// kernel launches turned into memfit::CudaError, formatted as memory/cuda/cuda_check.h does.
//
//   MEMFIT_CUBLAS_CHECK(cublasLtMatmul(lt, desc, ...));
//   //  -> "cublasLtMatmul(lt, desc, ...) failed: CUBLAS_STATUS_NOT_SUPPORTED
//   //      (the functionality requested is not supported) at core/cuda/cuda_gemm.cpp:210"
//   MEMFIT_CUDNN_CHECK(cudnnSoftmaxForward(h, ...));
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   MEMFIT_CUDA_LAUNCH_CHECK();   // cudaGetLastError: a bad launch configuration, ...
//
// A launch check catches errors of the launch itself (invalid configuration, too many
// resources, no kernel image for this device); a fault while the kernel runs surfaces later,
// from the next synchronizing call, as CudaError too. cudaGetLastError also resets the
// per-thread error, so the check does not report an error some earlier call left behind
// twice. C++ (.cpp and .cu) files; cuDNN parts only when MEMFIT_HAVE_CUDNN.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <string>

#if MEMFIT_HAVE_CUDNN
#include <cudnn.h>
#endif

#include "memory/cuda/cuda_check.h"
#include "memory/error.h"

namespace memfit::cuda {

inline std::string lib_error_message(const char* call, const char* name, const char* text,
                                     const char* file, int line) {
  std::string msg = call;
  msg += " failed: ";
  msg += name;
  msg += " (";
  msg += text;
  msg += ") at ";
  msg += file;
  msg += ':';
  msg += std::to_string(line);
  return msg;
}

// Defined in cuda_lib_check.cpp (inside libmemfit, which links cuBLAS and cuDNN), so code
// using the macros needs no direct link to those libraries.
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);
#if MEMFIT_HAVE_CUDNN
// cuDNN has no enum-name function; the status number stands in for the name.
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file,
                                    int line);
#endif

[[noreturn]] inline void throw_launch_error(cudaError_t err, const char* func, const char* file,
                                            int line) {
  const std::string call = std::string("kernel launch in ") + func + "()";
  throw_cuda_error(err, call.c_str(), file, line);
}

}  // namespace memfit::cuda

#define MEMFIT_CUBLAS_CHECK(call)                                                      \
  do {                                                                                 \
    const cublasStatus_t memfit_cublas_st_ = (call);                                   \
    if (__builtin_expect(memfit_cublas_st_ != CUBLAS_STATUS_SUCCESS, 0)) {             \
      ::memfit::cuda::throw_cublas_error(memfit_cublas_st_, #call, __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)

#if MEMFIT_HAVE_CUDNN
#define MEMFIT_CUDNN_CHECK(call)                                                     \
  do {                                                                               \
    const cudnnStatus_t memfit_cudnn_st_ = (call);                                   \
    if (__builtin_expect(memfit_cudnn_st_ != CUDNN_STATUS_SUCCESS, 0)) {             \
      ::memfit::cuda::throw_cudnn_error(memfit_cudnn_st_, #call, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)
#endif

// After every kernel launch (<<<...>>>): the launch's own error, if any, naming the function
// that launched it.
#define MEMFIT_CUDA_LAUNCH_CHECK()                                                      \
  do {                                                                                  \
    const cudaError_t memfit_launch_err_ = cudaGetLastError();                          \
    if (__builtin_expect(memfit_launch_err_ != cudaSuccess, 0)) {                       \
      ::memfit::cuda::throw_launch_error(memfit_launch_err_, __func__, __FILE__, __LINE__); \
    }                                                                                   \
  } while (0)
