// The throwing halves of core/cuda/cuda_lib_check.h's macros.
#include "core/cuda/cuda_lib_check.h"

#include <string>

namespace memfit::cuda {

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw CudaError(lib_error_message(call, cublasGetStatusName(status),
                                    cublasGetStatusString(status), file, line));
}

#if MEMFIT_HAVE_CUDNN
void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line) {
  const std::string name = "cudnnStatus " + std::to_string(static_cast<int>(status));
  throw CudaError(lib_error_message(call, name.c_str(), cudnnGetErrorString(status), file, line));
}
#endif

}  // namespace memfit::cuda
