// What the GPU tests that compare CudaBackend with the CPU reference share: the two backends
// side by side, a tensor mirrored on host and device, and an elementwise comparison that
// records how close each output came to its tolerance (the "figure:" lines).
//
//   testing::GpuRig g;                         // CudaBackend on device 0 + a CpuBackend
//   testing::Mirror x(g, Shape{4, 8}, DType::kBF16, "my_test");
//   x.rand(rng, -1, 1).upload();               // host values -> device
//   g.be.gelu_forward(s0, x.gpu(), y.gpu());  g.cpu.gelu_forward(s0, x.cpu(), y.cpu());
//   testing::expect_close(y.download(), y.host(), "gelu", 1e-6, worst);
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cuda/cuda_backend.h"
#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_provider.h"
#include "tests/core/backend_testutil.h"
#include "tests/gpu/gpu_testutil.h"

namespace memfit::testing {

// The GPU under test and the CPU reference. With workspace = false the backend has no
// workspace allocator, so its reductions take scratch from cudaMallocAsync instead.
struct GpuRig {
  explicit GpuRig(bool workspace = true) : alloc(provider, AllocatorConfig{}, &be.stream_sync()) {
    if (workspace) be.set_workspace_allocator(&alloc);
  }
  CudaBackend be;
  CudaProvider provider{0};
  CachingAllocator alloc;
  CpuBackend cpu;
  void sync() { be.synchronize(kDefaultStream); }
};

// A tensor on both sides: host values (the CPU reference computes on them in place) and a
// device copy.
class Mirror {
 public:
  Mirror(GpuRig& g, Shape s, DType dt, const char* tag = "gpu test")
      : shape_(s),
        host_(dt, s.numel()),
        block_(g.alloc.allocate(std::max<std::size_t>(bytes(), 4), Category::kActivation,
                                kDefaultStream, tag)) {}
  std::size_t bytes() const { return static_cast<std::size_t>(shape_.numel()) * dtype_size(dt()); }
  DType dt() const { return host_.dtype(); }
  Tensor cpu() const { return host_.t(shape_); }
  Tensor gpu() const { return Tensor(block_.data(), shape_, dt(), Device::kCuda); }
  HostBuf& host() { return host_; }
  const HostBuf& host() const { return host_; }
  Mirror& rand(std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    host_.randomize(rng, lo, hi);
    return *this;
  }
  Mirror& fill(float v) {
    host_.fill(v);
    return *this;
  }
  // Host values -> device; the device is idle afterwards (pageable cudaMemcpy may return before
  // its DMA ends), so the backend's non-blocking stream sees them.
  void upload() const {
    MEMFIT_CUDA_CHECK(cudaMemcpy(block_.data(), host_.t().raw(), bytes(), cudaMemcpyHostToDevice));
    MEMFIT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  HostBuf download() const {
    HostBuf h(dt(), shape_.numel());
    MEMFIT_CUDA_CHECK(cudaMemcpy(h.t().raw(), block_.data(), bytes(), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  Shape shape_;
  HostBuf host_;
  Block block_;
};

// Every K-tuple of the three dtypes (3^K), for ops whose operands' dtypes may each differ.
template <int K>
std::vector<std::array<DType, K>> combos() {
  constexpr DType kAll[] = {DType::kF32, DType::kF16, DType::kBF16};
  std::vector<std::array<DType, K>> out;
  int total = 1;
  for (int i = 0; i < K; ++i) total *= 3;
  for (int code = 0; code < total; ++code) {
    std::array<DType, K> d{};
    int c = code;
    for (int i = 0; i < K; ++i, c /= 3) d[static_cast<std::size_t>(i)] = kAll[c % 3];
    out.push_back(d);
  }
  return out;
}

template <std::size_t K>
std::string names(const std::array<DType, K>& d) {  // "f32,bf16,f16"
  std::string s;
  for (DType t : d) s += std::string(s.empty() ? "" : ",") + dtype_name(t);
  return s;
}

inline double unit_roundoff(DType t) {
  return t == DType::kF32   ? std::ldexp(1.0, -24)
         : t == DType::kF16 ? std::ldexp(1.0, -11)
                            : std::ldexp(1.0, -8);
}

// The absolute term per unit of (1 + max |ref|) for sums of `terms` FP32 values: FP32
// summation error grows like sqrt(terms), with room for libm-vs-CUDA transcendentals.
inline double fp32_tol(std::int64_t terms) {
  return 1e-6 * (4 + std::sqrt(static_cast<double>(terms)));
}

// Largest |gpu - cpu| / tolerance per output and dtype over a test's cases: its figure line,
// which shows how much room the tolerances leave.
using Worst = std::map<std::string, double>;

// |got - ref| <= 2u|ref| + a_unit * (1 + max|ref|) elementwise (u: ref's dtype's unit
// roundoff; two FP32 results a few ulp apart can round to neighbouring 16-bit values, 2u
// apart); NaN never passes.
inline void expect_close(const HostBuf& got, const HostBuf& ref, const std::string& what,
                         double a_unit, Worst& worst) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double m = 0;
  for (std::int64_t i = 0; i < ref.size(); ++i) m = std::max(m, std::fabs(double{ref.get(i)}));
  const double u = unit_roundoff(ref.dtype()), a = a_unit * (1 + m);
  double ratio = 0;
  int bad = 0;
  for (std::int64_t i = 0; i < ref.size(); ++i) {
    const double g = got.get(i), r = ref.get(i), err = std::fabs(g - r);
    const double tol = 2 * u * std::fabs(r) + a;
    if (std::isfinite(g)) ratio = std::max(ratio, err / tol);
    if (!std::isfinite(g) || !(err <= tol)) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << " (" << dtype_name(ref.dtype()) << ") [" << i << "]: gpu " << g
                      << ", cpu " << r << ", tolerance " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " elements off";
  double& w = worst[what + " " + dtype_name(ref.dtype())];
  w = std::max(w, ratio);
}

inline void expect_bits(const HostBuf& a, const HostBuf& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const std::size_t n = static_cast<std::size_t>(a.size()) * dtype_size(a.dtype());
  EXPECT_EQ(std::memcmp(a.t().raw(), b.t().raw(), n), 0) << what << ": bits differ";
}

// "name: out bf16 0.31, lse f32 0.02, ..." as one figure line.
inline void print_worst(const std::string& name, const Worst& worst) {
  std::string s;
  for (const auto& [k, v] : worst) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %.2f", s.empty() ? "" : ", ", k.c_str(), v);
    s += buf;
  }
  print_figure(name, s);
}

}  // namespace memfit::testing
