// MEMFIT_CUDA_CHECK: turns a failing CUDA runtime call into a memfit::CudaError.
//
//   MEMFIT_CUDA_CHECK(cudaMemsetAsync(p, 0, n, stream));
//   // on failure throws CudaError:
//   //   "cudaMemsetAsync(p, 0, n, stream) failed: cudaErrorInvalidValue (invalid argument)
//   //    at memory/cuda/foo.cpp:42"
//
// The message names the call as written, the error's enum name and its description, and
// file:line, so a report from a GPU machine can be traced without a debugger.
//
// Sticky errors: the runtime keeps a per-thread "last error" that every failing call sets and
// that cudaGetLastError() returns and resets. The macro clears it (cudaGetLastError) before
// throwing, so a caller that catches the CudaError and carries on does not see the same error
// again from an unrelated later cudaGetLastError(). Errors that corrupt the context (an illegal
// address in a kernel, cudaErrorIllegalAddress and friends) cannot be cleared this way: every
// later call returns them again, and the process must exit to use the GPU again (CUDA runtime
// API, cudaError enum documentation).
//
// DeviceGuard (below) makes a device current for a scope.
//
// CUDA builds only (memory/cuda/ is compiled only when MEMFIT_HAVE_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "memory/error.h"

namespace memfit::cuda {

// The message MEMFIT_CUDA_CHECK throws with; separate so tests and other checkers (cuBLAS,
// CUPTI wrappers) format errors the same way.
inline std::string cuda_error_message(cudaError_t err, const char* call, const char* file,
                                      int line) {
  std::string msg = call;
  msg += " failed: ";
  msg += cudaGetErrorName(err);
  msg += " (";
  msg += cudaGetErrorString(err);
  msg += ") at ";
  msg += file;
  msg += ':';
  msg += std::to_string(line);
  return msg;
}

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file,
                                          int line) {
  (void)cudaGetLastError();  // reset the per-thread last error; see the header comment
  throw CudaError(cuda_error_message(err, call, file, line));
}

// Makes `device` current for a scope and restores the caller's device after, so code that
// works on one device (providers, event pools) is correct on any thread, whatever that
// thread's current device is. cudaSetDevice is cheap when the device is already current.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    const cudaError_t err = cudaGetDevice(&previous_);
    if (err != cudaSuccess) throw_cuda_error(err, "cudaGetDevice(&previous)", __FILE__, __LINE__);
    if (previous_ != device) {
      const cudaError_t set = cudaSetDevice(device);
      if (set != cudaSuccess) throw_cuda_error(set, "cudaSetDevice(device)", __FILE__, __LINE__);
    }
    changed_ = previous_ != device;
  }
  // Restoring can only fail if the context is already broken; the error that broke it has
  // been (or will be) reported by the call that hit it, so it is not thrown from here.
  ~DeviceGuard() {
    if (changed_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace memfit::cuda

#define MEMFIT_CUDA_CHECK(call)                                                      \
  do {                                                                               \
    const cudaError_t memfit_cuda_err_ = (call);                                     \
    if (__builtin_expect(memfit_cuda_err_ != cudaSuccess, 0)) {                      \
      ::memfit::cuda::throw_cuda_error(memfit_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)
