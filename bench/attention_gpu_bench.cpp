// Causal attention on one GPU, GPT-2 124M's shape (B=4, H=12, hs=64) in bf16 at T = 128, 512,
// 1024, 2048, 4096: forward and forward+backward time of flash attention
// (Backend::flash_attention_forward/backward, attention_kernels.cu) beside the anchor, the
// materialized path of the same backend (Backend::attention_forward/backward: T x T scores and
// probabilities stored, cuBLASLt GEMMs), as a ratio from the same run; and the bytes of the
// buffers each path needs beyond the qkv, dout and dqkv both share:
//   flash:        out (B,T,C) + lse and delta (B,H,T) f32
//   materialized: qkvr (3,B,H,T,hs) + att (B,H,T,T) + scratch (B,H,T,hs) + out (B,T,C)
//                 + datt (B,H,T,T) + dqkvr (3,B,H,T,hs)
//
//   build/bench/attention_gpu_bench          # table, figure lines, then one JSON line
//   build/bench/attention_gpu_bench 8        # another batch size
//
// Fixed work: per path and T, 2 warm-up calls, then 3 rounds of n calls queued back to back
// with one synchronize per round, n = 2^31 / (B*H*T*(T+1)/2) query-key pairs clamped to
// [3, 1000]; the best round's time per call counts (host wall clock). Inputs are random in
// [-1, 1). A path that runs out of device memory is reported as such, and the others go on.
// bench/torch_sdpa.py times PyTorch's scaled_dot_product_attention on the same shapes (tests/
// gpu/run.sh passes it this program's JSON line and prints the ratios).
// Without a CUDA device (or a CUDA build) it prints "SKIP: no CUDA device: <why>" and exits 0.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#if MEMFIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/cuda/cuda_backend.h"
#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_provider.h"
#include "memory/error.h"
#endif

#if !MEMFIT_HAVE_CUDA
int main() {
  std::printf(
      "SKIP: no CUDA device: this build has no CUDA backend (configure -DMEMFIT_CUDA=ON)\n");
  return 0;
}
#else

namespace memfit {
namespace {

using i64 = std::int64_t;

constexpr i64 kHeads = 12, kHs = 64;
constexpr DType kDt = DType::kBF16;

// Device tensors whose blocks live as long as the arena.
class Arena {
 public:
  explicit Arena(CachingAllocator& alloc) : alloc_(alloc) {}
  Tensor make(Shape s, DType dt) {
    const std::size_t bytes = static_cast<std::size_t>(s.numel()) * dtype_size(dt);
    blocks_.push_back(alloc_.allocate(bytes, Category::kActivation));
    bytes_ += bytes;
    return Tensor(blocks_.back().data(), s, dt, Device::kCuda);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  CachingAllocator& alloc_;
  std::vector<Block> blocks_;
  std::size_t bytes_ = 0;
};

// dst = uniform [-1, 1) values, through an f32 staging tensor and the backend's cast.
void randomize(CudaBackend& be, CachingAllocator& alloc, const Tensor& dst, std::uint32_t seed) {
  const i64 n = dst.numel();
  std::vector<float> host(static_cast<std::size_t>(n));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : host) v = u(rng);
  Block stage = alloc.allocate(static_cast<std::size_t>(n) * 4, Category::kTemporary);
  const Tensor ts(stage.data(), Shape{n}, DType::kF32, Device::kCuda);
  be.copy(kDefaultStream, Tensor(host.data(), Shape{n}, DType::kF32, Device::kCpu), ts);
  be.cast(kDefaultStream, ts, Tensor(dst.raw(), Shape{n}, dst.dtype(), Device::kCuda));
  be.synchronize(kDefaultStream);
}

// Best-of-3-rounds milliseconds per call of f, after 2 warm-up calls.
double time_ms(CudaBackend& be, int calls, const std::function<void()>& f) {
  for (int i = 0; i < 2; ++i) f();
  be.synchronize(kDefaultStream);
  double best = std::numeric_limits<double>::infinity();
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) f();
    be.synchronize(kDefaultStream);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s * 1e3 / calls);
  }
  return best;
}

struct PathResult {
  bool ok = false;
  std::string error;
  double fwd_ms = 0, step_ms = 0;  // forward; forward + backward
  std::size_t bytes = 0;           // the path's own buffers
};

std::string mib(std::size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return s;
}

std::string json_path(const PathResult& r) {
  char s[160];
  if (!r.ok) return "{\"error\":\"" + r.error + "\"}";
  std::snprintf(s, sizeof s, "{\"fwd_ms\":%.4f,\"fwd_bwd_ms\":%.4f,\"bytes\":%zu}", r.fwd_ms,
                r.step_ms, r.bytes);
  return s;
}

int bench(i64 b) {
  std::string why;
  if (CudaProvider::cuda_device_count(&why) == 0) {
    std::printf("SKIP: no CUDA device: %s\n", why.c_str());
    return 0;
  }
  CudaBackend be;
  CudaProvider gpu(0);
  CachingAllocator alloc(gpu, {}, &be.stream_sync());
  be.set_workspace_allocator(&alloc);
  cudaDeviceProp prop{};
  MEMFIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const i64 h = kHeads, hs = kHs, c = h * hs;
  std::printf("device: %s; causal attention %s, B=%lld H=%lld hs=%lld; flash vs materialized\n",
              prop.name, dtype_name(kDt), static_cast<long long>(b), static_cast<long long>(h),
              static_cast<long long>(hs));
  std::printf("%6s %12s %12s %12s %12s %8s %12s %14s %8s\n", "T", "flash fwd", "flash f+b",
              "mat. fwd", "mat. f+b", "f+b x", "flash bufs", "mat. bufs", "bytes x");
  std::string json = "{\"device\":\"" + std::string(prop.name) + "\",\"dtype\":\"" +
                     dtype_name(kDt) + "\",\"b\":" + std::to_string(b) +
                     ",\"heads\":" + std::to_string(h) + ",\"hs\":" + std::to_string(hs) +
                     ",\"results\":[";
  bool first = true;
  for (i64 t : {128, 512, 1024, 2048, 4096}) {
    const double pairs = static_cast<double>(b * h) * static_cast<double>(t) * (t + 1) / 2;
    const int calls = static_cast<int>(std::clamp(std::ceil(2147483648.0 / pairs), 3.0, 1000.0));
    Arena shared(alloc);
    const Tensor qkv = shared.make({b, t, 3 * c}, kDt), dout = shared.make({b, t, c}, kDt),
                 dqkv = shared.make({b, t, 3 * c}, kDt);
    randomize(be, alloc, qkv, 1);
    randomize(be, alloc, dout, 2);

    PathResult flash, mat;
    try {
      Arena a(alloc);
      const Tensor out = a.make({b, t, c}, kDt), lse = a.make({b, h, t}, DType::kF32),
                   delta = a.make({b, h, t}, DType::kF32);
      flash.bytes = a.bytes();
      flash.fwd_ms = time_ms(
          be, calls, [&] { be.flash_attention_forward(kDefaultStream, qkv, h, h, out, lse); });
      flash.step_ms = time_ms(be, calls, [&] {
        be.flash_attention_forward(kDefaultStream, qkv, h, h, out, lse);
        be.flash_attention_backward(kDefaultStream, dout, qkv, out, lse, h, h, delta, dqkv);
      });
      flash.ok = true;
    } catch (const OutOfMemory& e) {
      flash.error = "out of memory";
      std::printf("T=%lld flash: %s\n", static_cast<long long>(t), e.what());
    }
    try {
      Arena a(alloc);
      const Tensor qkvr = a.make({3, b, h, t, hs}, kDt), att = a.make({b, h, t, t}, kDt),
                   scratch = a.make({b, h, t, hs}, kDt), out = a.make({b, t, c}, kDt),
                   datt = a.make({b, h, t, t}, kDt), dqkvr = a.make({3, b, h, t, hs}, kDt);
      mat.bytes = a.bytes();
      mat.fwd_ms = time_ms(be, calls, [&] {
        be.attention_forward(kDefaultStream, qkv, h, qkvr, att, scratch, out);
      });
      mat.step_ms = time_ms(be, calls, [&] {
        be.attention_forward(kDefaultStream, qkv, h, qkvr, att, scratch, out);
        be.attention_backward(kDefaultStream, dout, qkvr, att, h, datt, dqkvr, dqkv);
      });
      mat.ok = true;
    } catch (const OutOfMemory& e) {
      mat.error = "out of memory";
      std::printf("T=%lld materialized: %s\n", static_cast<long long>(t), e.what());
    }
    alloc.empty_cache();  // the next T starts from an empty pool

    const double time_x = flash.ok && mat.ok ? flash.step_ms / mat.step_ms : 0;
    const double bytes_x = flash.ok && mat.ok ? static_cast<double>(flash.bytes) / mat.bytes : 0;
    auto ms = [](const PathResult& r, double v) {
      if (!r.ok) return std::string("OOM");
      char s[32];
      std::snprintf(s, sizeof s, "%.3f ms", v);
      return std::string(s);
    };
    std::printf("%6lld %12s %12s %12s %12s %8.2f %12s %14s %8.4f\n", static_cast<long long>(t),
                ms(flash, flash.fwd_ms).c_str(), ms(flash, flash.step_ms).c_str(),
                ms(mat, mat.fwd_ms).c_str(), ms(mat, mat.step_ms).c_str(), time_x,
                mib(flash.bytes).c_str(), mib(mat.bytes).c_str(), bytes_x);
    std::printf(
        "figure: attention %s B=%lld H=%lld hs=%lld T=%lld: flash fwd+bwd %s = %.2fx the "
        "materialized path's %s; buffers %s = %.4fx its %s\n",
        dtype_name(kDt), static_cast<long long>(b), static_cast<long long>(h),
        static_cast<long long>(hs), static_cast<long long>(t), ms(flash, flash.step_ms).c_str(),
        time_x, ms(mat, mat.step_ms).c_str(), mib(flash.bytes).c_str(), bytes_x,
        mib(mat.bytes).c_str());
    std::fflush(stdout);
    json += std::string(first ? "" : ",") + "{\"t\":" + std::to_string(t) +
            ",\"flash\":" + json_path(flash) + ",\"materialized\":" + json_path(mat) + "}";
    first = false;
  }
  std::printf("JSON %s]}\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  const long long b = argc > 1 ? std::atoll(argv[1]) : 4;
  if (b <= 0 || b > 1024) {
    std::fprintf(stderr, "usage: attention_gpu_bench [batch]   (1 <= batch <= 1024; default 4)\n");
    return 2;
  }
  try {
    return memfit::bench(b);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_gpu_bench: %s\n", e.what());
    return 1;
  }
}
#endif
