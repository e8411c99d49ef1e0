// CUDA GEMM throughput: CudaBackend::gemm (cuBLASLt) at 4096^3 for bf16, f16 and f32 operands
// (C in the operands' dtype), printed beside the device's dense peak for that dtype from its
// DeviceSpec preset (policies/device_spec.h: "h200", or the preset whose name matches the
// device's) as a ratio. The target: bf16 >= 70% of peak. f32 runs with TF32 off, so its
// anchor is the FP32 (no tensor core) peak.
//
//   ./build/bench/cuda_gemm_bench            # SKIP line and exit 0 without a GPU or CUDA build
//   ./build/bench/cuda_gemm_bench 8192       # another n
//
// Timing: 10 warm-up calls, then 5 rounds of 50 calls queued back to back on the default
// stream with one synchronize per round, host wall clock; the best round counts (GEMM rates
// only fall from clock and power effects, so the best round is the closest to the device's
// sustained rate). Operands are random in [-1, 1): zeros would flatter the power budget.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#if MEMFIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cctype>
#include <cmath>
#include <random>
#include <vector>

#include "core/cuda/cuda_backend.h"
#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_provider.h"
#include "policies/device_spec.h"
#endif

#if MEMFIT_HAVE_CUDA
namespace memfit {
namespace {

std::vector<std::string> tokens(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      cur += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    } else if (!cur.empty()) {
      out.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// The preset for this device: one whose base name ("h100" of "h100-80g") is a word of the
// device's name ("NVIDIA H100 80GB HBM3"); among several, the closest in memory size.
bool match_preset(const cudaDeviceProp& prop, DeviceSpec* out) {
  const std::vector<std::string> words = tokens(prop.name);
  bool found = false;
  double best = 0;
  for (const std::string& p : DeviceSpec::preset_names()) {
    const std::string base = p.substr(0, p.find('-'));
    if (std::find(words.begin(), words.end(), base) == words.end()) continue;
    DeviceSpec spec = DeviceSpec::preset(p);
    const double gap = std::fabs(static_cast<double>(spec.memory_bytes) -
                                 static_cast<double>(prop.totalGlobalMem));
    if (!found || gap < best) {
      *out = spec;
      best = gap;
      found = true;
    }
  }
  return found;
}

double run(CudaBackend& be, CachingAllocator& alloc, DType dt, std::int64_t n) {
  const std::size_t elems = static_cast<std::size_t>(n * n);
  const std::size_t bytes = elems * dtype_size(dt);
  Block a = alloc.allocate(bytes, Category::kActivation);
  Block b = alloc.allocate(bytes, Category::kActivation);
  Block c = alloc.allocate(bytes, Category::kActivation);
  const Tensor ta(a.data(), Shape{n, n}, dt, Device::kCuda);
  const Tensor tb(b.data(), Shape{n, n}, dt, Device::kCuda);
  const Tensor tc(c.data(), Shape{n, n}, dt, Device::kCuda);
  {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> host(elems);
    for (float& v : host) v = u(rng);
    Block stage = alloc.allocate(elems * 4, Category::kTemporary);
    const Tensor ts(stage.data(), Shape{n, n}, DType::kF32, Device::kCuda);
    be.copy(kDefaultStream, Tensor(host.data(), Shape{n, n}, DType::kF32, Device::kCpu), ts);
    be.cast(kDefaultStream, ts, ta);
    be.cast(kDefaultStream, ts, tb);
    be.synchronize(kDefaultStream);
  }
  GemmDesc d;
  d.m = d.n = d.k = n;
  for (int i = 0; i < 10; ++i) be.gemm(kDefaultStream, d, ta, tb, tc);
  be.synchronize(kDefaultStream);
  constexpr int kCalls = 50;
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) be.gemm(kDefaultStream, d, ta, tb, tc);
    be.synchronize(kDefaultStream);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(d.flops()) * kCalls / s);
  }
  return best;
}

int bench(std::int64_t n) {
  std::string why;
  if (CudaProvider::cuda_device_count(&why) == 0) {
    std::printf("SKIP cuda_gemm_bench: no CUDA device: %s\n", why.c_str());
    return 0;
  }
  CudaBackend be;
  CudaProvider gpu(0);
  CachingAllocator alloc(gpu, {}, &be.stream_sync());
  be.set_workspace_allocator(&alloc);
  cudaDeviceProp prop{};
  MEMFIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  DeviceSpec spec;
  const bool matched = match_preset(prop, &spec);
  if (!matched) spec = DeviceSpec::preset("h200");
  std::printf("device: %s (%d SMs); peaks from preset %s%s\n", prop.name, be.sm_count(),
              spec.name.c_str(), matched ? "" : " (no preset matched the name: h200's figures)");
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    const double rate = run(be, alloc, dt, n);
    const double peak = spec.flops(dt);
    const double ratio = peak > 0 ? rate / peak : 0;
    std::printf("cuda gemm %s %lld^3: %.1f TFLOP/s, peak %.1f TFLOP/s, ratio %.2f%s\n",
                dtype_name(dt), static_cast<long long>(n), rate / 1e12, peak / 1e12, ratio,
                dt == DType::kBF16 ? (ratio >= 0.70 ? " (target >= 0.70: met)"
                                                    : " (target >= 0.70: MISSED)")
                                   : "");
    std::printf("figure: cuda gemm %s %lld^3: %.1f TFLOP/s = %.0f%% of %s peak\n", dtype_name(dt),
                static_cast<long long>(n), rate / 1e12, 100 * ratio, spec.name.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace memfit
#endif

int main(int argc, char** argv) {
  const long long n = argc > 1 ? std::atoll(argv[1]) : 4096;
  if (n <= 0 || n > 65536) {
    std::fprintf(stderr, "usage: cuda_gemm_bench [n]   (1 <= n <= 65536; default 4096)\n");
    return 2;
  }
#if MEMFIT_HAVE_CUDA
  try {
    return memfit::bench(n);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_gemm_bench: %s\n", e.what());
    return 1;
  }
#else
  std::printf("SKIP cuda_gemm_bench: this build has no CUDA backend (configure with "
              "-DMEMFIT_CUDA=ON)\n");
  return 0;
#endif
}
