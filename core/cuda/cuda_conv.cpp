// CudaBackend's conv2d through cuDNN's legacy convolution API (cudnnConvolutionForward,
// cudnnConvolutionBackwardData, cudnnConvolutionBackwardFilter; still shipped by cuDNN 9,
// which marks it deprecated in favour of the graph API). memfit's channels-last layouts map
// onto cuDNN's NHWC format directly:
//   inp (N,H,W,C)  -> tensor  n=N c=C h=H w=W, CUDNN_TENSOR_NHWC
//   weight (K,R,S,C) -> filter k=K c=C h=R w=S, CUDNN_TENSOR_NHWC (KRSC)
//   out (N,P,Q,K)  -> tensor  n=N c=K h=P w=Q, CUDNN_TENSOR_NHWC
// Mode CUDNN_CROSS_CORRELATION (no kernel flip: torch.nn.functional.conv2d's arithmetic),
// compute type FLOAT for every data type (f32: FLOAT_CONFIG; f16: PSEUDO_HALF_CONFIG; bf16:
// PSEUDO_BFLOAT16_CONFIG in cuDNN's table of supported configurations).
// Algorithms come from the cudnnGet*Algorithm_v7 heuristics (no benchmarking Find*: it would
// allocate and run outside the allocator), the first one that is supported, deterministic
// (Backend's contract: no float atomics in reductions, which rules out backward-filter
// algorithms 0 and 3 and backward-data algorithm 0) and, for f32 without allow_tf32, not a
// tensor-op (TF32) one. Its math type is then set on the descriptor, as the heuristics
// reported it (f32 without TF32 stays at FMA). Workspace: CudaScratch, "cuda.conv.workspace".
#include <array>
#include <cstddef>
#include <string>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_backend_impl.h"
#include "memory/error.h"

#if MEMFIT_HAVE_CUDNN
#include <cudnn.h>

#include "core/cuda/cuda_lib_check.h"
#include "memory/check.h"
#include "memory/cuda/cuda_check.h"
#endif

namespace memfit {

#if MEMFIT_HAVE_CUDNN
namespace {

cudnnDataType_t cudnn_type(DType dt) {
  switch (dt) {
    case DType::kF32:
      return CUDNN_DATA_FLOAT;
    case DType::kF16:
      return CUDNN_DATA_HALF;
    case DType::kBF16:
      return CUDNN_DATA_BFLOAT16;
  }
  MEMFIT_CHECK(false) << "conv2d: unknown dtype";
  return CUDNN_DATA_FLOAT;
}

// The four descriptors of one convolution, destroyed together. Sizes fit int: Backend's
// checks hold every size and element count to int32.
class ConvDescs {
 public:
  ConvDescs(const Conv2dDesc& d, DType dt, bool allow_tf32)
      : tf32_(allow_tf32 && dt == DType::kF32), f32_(dt == DType::kF32) {
    try {
      init(d, cudnn_type(dt));
    } catch (...) {
      destroy();  // a constructor that throws gets no destructor call
      throw;
    }
  }
  ~ConvDescs() { destroy(); }
  ConvDescs(const ConvDescs&) = delete;
  ConvDescs& operator=(const ConvDescs&) = delete;

  void set_math(cudnnMathType_t m) { MEMFIT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, m)); }

  // Whether a heuristic result may run: supported, deterministic when asked, and no TF32 for
  // f32 unless allowed.
  template <typename Perf>
  bool usable(const Perf& p, bool need_deterministic) const {
    if (p.status != CUDNN_STATUS_SUCCESS) return false;
    if (need_deterministic && p.determinism != CUDNN_DETERMINISTIC) return false;
    if (f32_ && !tf32_ && p.mathType != CUDNN_FMA_MATH && p.mathType != CUDNN_DEFAULT_MATH) {
      return false;
    }
    return true;
  }

  // Sets the math type the chosen algorithm was rated with, as PyTorch does after the
  // heuristics; f32 without TF32 stays at FMA whatever the rating (DEFAULT_MATH would let
  // cuDNN pick TF32 kernels on Ampere and later).
  template <typename Perf>
  void apply(const Perf& p) {
    set_math(f32_ && !tf32_ ? CUDNN_FMA_MATH : p.mathType);
  }

  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;

 private:
  void init(const Conv2dDesc& d, cudnnDataType_t type) {
    MEMFIT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
    MEMFIT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
    MEMFIT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
    MEMFIT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_));
    MEMFIT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NHWC, type, i32(d.n), i32(d.c),
                                                  i32(d.h), i32(d.w)));
    MEMFIT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, type, CUDNN_TENSOR_NHWC, i32(d.k), i32(d.c),
                                                  i32(d.r), i32(d.s)));
    MEMFIT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_, i32(d.pad_h), i32(d.pad_w),
                                                       i32(d.stride_h), i32(d.stride_w), 1, 1,
                                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    // The math type the heuristics are asked for: FMA only for f32 without TF32 (cuDNN's
    // DEFAULT_MATH permits TF32 on Ampere and later); tensor ops for f16/bf16.
    set_math(f32_ ? (tf32_ ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH) : CUDNN_TENSOR_OP_MATH);
    int n = 0, c = 0, h = 0, w = 0;
    MEMFIT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv_, x_, w_, &n, &c, &h, &w));
    MEMFIT_CHECK(n == d.n && c == d.k && h == d.p() && w == d.q())
        << "cuDNN's output dims (" << n << "," << c << "," << h << "," << w << ") differ from "
        << d.str();
    MEMFIT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_, CUDNN_TENSOR_NHWC, type, n, c, h, w));
  }
  void destroy() noexcept {
    // Destroy statuses are ignored: nothing useful can be done with them here.
    if (conv_ != nullptr) cudnnDestroyConvolutionDescriptor(conv_);
    if (w_ != nullptr) cudnnDestroyFilterDescriptor(w_);
    if (y_ != nullptr) cudnnDestroyTensorDescriptor(y_);
    if (x_ != nullptr) cudnnDestroyTensorDescriptor(x_);
    conv_ = nullptr;
    w_ = nullptr;
    y_ = nullptr;
    x_ = nullptr;
  }
  static int i32(std::int64_t v) { return static_cast<int>(v); }
  bool tf32_ = false;
  bool f32_ = false;
};

// cuDNN's algorithm counts (CUDNN_CONVOLUTION_*_ALGO_COUNT); the heuristics fill at most this.
constexpr int kMaxAlgos = 16;

template <typename Perf>
const Perf& choose(const ConvDescs& cd, const std::array<Perf, kMaxAlgos>& perfs, int returned,
                   bool need_deterministic, const char* op, const Conv2dDesc& d, DType dt) {
  for (int i = 0; i < returned; ++i) {
    if (cd.usable(perfs[i], need_deterministic)) return perfs[i];
  }
  throw CudaError(std::string("Backend::") + op + " (cuda): cuDNN offers no supported" +
                  (need_deterministic ? " deterministic" : "") + " algorithm for " + d.str() +
                  " in " + dtype_name(dt) + " (NHWC, FP32 compute)");
}

}  // namespace

void CudaBackend::do_conv2d_forward(StreamId stream, const Conv2dDesc& d, const Tensor& inp,
                                    const Tensor& weight, const Tensor& out) {
  if (d.n == 0) return;  // cuDNN rejects empty tensors; nothing to compute
  cuda::DeviceGuard guard(options_.device);  // cuDNN works on the current device
  cudaStream_t cs = impl().stream(stream);
  cudnnHandle_t h = impl().cudnn(cs);
  ConvDescs cd(d, inp.dtype(), options_.allow_tf32);

  std::array<cudnnConvolutionFwdAlgoPerf_t, kMaxAlgos> perfs{};
  int returned = 0;
  MEMFIT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, cd.x_, cd.w_, cd.conv_, cd.y_,
                                                            kMaxAlgos, &returned, perfs.data()));
  // Deterministic too: a checkpointed block's recomputed forward must give the same bits.
  const auto& perf = choose(cd, perfs, returned, true, "conv2d_forward", d, inp.dtype());
  cd.apply(perf);
  std::size_t ws_bytes = 0;
  MEMFIT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, cd.x_, cd.w_, cd.conv_, cd.y_,
                                                             perf.algo, &ws_bytes));
  CudaScratch ws(*this, stream, ws_bytes, "cuda.conv.workspace");
  const float alpha = 1.0f, beta = 0.0f;  // FP32 compute: float scaling factors
  MEMFIT_CUDNN_CHECK(cudnnConvolutionForward(h, &alpha, cd.x_, inp.raw(), cd.w_, weight.raw(),
                                             cd.conv_, perf.algo, ws.data(), ws.size(), &beta,
                                             cd.y_, out.raw()));
}

void CudaBackend::do_conv2d_backward(StreamId stream, const Conv2dDesc& d, const Tensor& dout,
                                     const Tensor& inp, const Tensor& weight, const Tensor* dinp,
                                     const Tensor& dweight) {
  if (d.n == 0) return;  // dweight += 0
  cuda::DeviceGuard guard(options_.device);  // cuDNN works on the current device
  cudaStream_t cs = impl().stream(stream);
  cudnnHandle_t h = impl().cudnn(cs);
  const DType dt = inp.dtype();
  const float one = 1.0f, zero = 0.0f;

  if (dinp != nullptr) {
    ConvDescs cd(d, dt, options_.allow_tf32);
    std::array<cudnnConvolutionBwdDataAlgoPerf_t, kMaxAlgos> perfs{};
    int returned = 0;
    MEMFIT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, cd.w_, cd.y_, cd.conv_, cd.x_, kMaxAlgos, &returned, perfs.data()));
    const auto& perf = choose(cd, perfs, returned, true, "conv2d_backward", d, dt);
    cd.apply(perf);
    std::size_t ws_bytes = 0;
    MEMFIT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, cd.w_, cd.y_, cd.conv_,
                                                                    cd.x_, perf.algo, &ws_bytes));
    CudaScratch ws(*this, stream, ws_bytes, "cuda.conv.workspace");
    // beta = 0: dinp is written, whatever it held.
    MEMFIT_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, cd.w_, weight.raw(), cd.y_, dout.raw(),
                                                    cd.conv_, perf.algo, ws.data(), ws.size(),
                                                    &zero, cd.x_, dinp->raw()));
  }

  ConvDescs cd(d, dt, options_.allow_tf32);
  std::array<cudnnConvolutionBwdFilterAlgoPerf_t, kMaxAlgos> perfs{};
  int returned = 0;
  MEMFIT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
      h, cd.x_, cd.y_, cd.conv_, cd.w_, kMaxAlgos, &returned, perfs.data()));
  const auto& perf = choose(cd, perfs, returned, true, "conv2d_backward", d, dt);
  cd.apply(perf);
  std::size_t ws_bytes = 0;
  MEMFIT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, cd.x_, cd.y_, cd.conv_,
                                                                    cd.w_, perf.algo, &ws_bytes));
  CudaScratch ws(*this, stream, ws_bytes, "cuda.conv.workspace");
  if (dt == DType::kF32) {
    // The filter gradient's descriptor is the weight's (f32): accumulate in place, beta = 1.
    MEMFIT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, cd.x_, inp.raw(), cd.y_, dout.raw(),
                                                      cd.conv_, perf.algo, ws.data(), ws.size(),
                                                      &one, cd.w_, dweight.raw()));
    return;
  }
  // f16/bf16: cuDNN writes the filter gradient in the data type, so it goes through a
  // temporary of the weight's dtype and is added to the FP32 gradient (rounded once, to dt,
  // on the way: the price of one data type per convolution).
  CudaScratch tmp(*this, stream, weight.nbytes(), "cuda.conv.dweight");
  const Tensor dw_tmp(tmp.data(), weight.shape(), dt, Device::kCuda);
  MEMFIT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, cd.x_, inp.raw(), cd.y_, dout.raw(),
                                                    cd.conv_, perf.algo, ws.data(), ws.size(),
                                                    &zero, cd.w_, dw_tmp.raw()));
  do_axpy(stream, 1.0f, dw_tmp, dweight);
}

#else  // !MEMFIT_HAVE_CUDNN

void CudaBackend::do_conv2d_forward(StreamId, const Conv2dDesc&, const Tensor&, const Tensor&,
                                    const Tensor&) {
  throw InvalidArgument(
      "Backend::conv2d_forward (cuda): conv2d needs cuDNN, and this build found none; valid: "
      "rebuild with cuDNN installed (libcudnn beside the CUDA toolkit)");
}

void CudaBackend::do_conv2d_backward(StreamId, const Conv2dDesc&, const Tensor&, const Tensor&,
                                     const Tensor&, const Tensor*, const Tensor&) {
  throw InvalidArgument(
      "Backend::conv2d_backward (cuda): conv2d needs cuDNN, and this build found none; valid: "
      "rebuild with cuDNN installed (libcudnn beside the CUDA toolkit)");
}

#endif  // MEMFIT_HAVE_CUDNN

}  // namespace memfit
