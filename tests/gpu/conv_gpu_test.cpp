// conv2d through cuDNN against the CPU backend (the numerical reference) in every dtype, on
// fresh random inputs with NaN-poisoned outputs: forward, backward data and backward filter
// (accumulating onto a random FP32 gradient), strides, padding and odd sizes; determinism;
// workspace blocks tagged and returned; and one throughput figure for run.sh's summary.
//
// Every test starts with MEMFIT_REQUIRE_GPU(): without a device it skips, printing
// "no CUDA device: <the runtime's reason>".
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cuda/cuda_backend.h"
#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_provider.h"
#include "tests/core/conv_testutil.h"
#include "tests/core/nn_testutil.h"
#include "tests/gpu/gpu_testutil.h"

namespace memfit {
namespace {

using namespace testing;  // NOLINT

// One device tensor from the allocator, filled from and read back into host tensors (HT).
class Dev {
 public:
  Dev(CachingAllocator& alloc, Shape s, DType dt)
      : block_(alloc.allocate(static_cast<std::size_t>(s.numel()) * dtype_size(dt),
                              Category::kActivation, kDefaultStream, "conv_gpu_test")),
        t_(block_.data(), s, dt, Device::kCuda) {}
  const Tensor& t() const { return t_; }
  void upload(Backend& be, const HT& h) { be.copy(kDefaultStream, h.t(), t_); }
  void download(Backend& be, const HT& h) {
    be.copy(kDefaultStream, t_, h.t());
    be.synchronize(kDefaultStream);
  }

 private:
  Block block_;
  Tensor t_;
};

struct Gpu {
  Gpu() : alloc(gpu, {}, &be.stream_sync()) { be.set_workspace_allocator(&alloc); }
  ~Gpu() { be.set_workspace_allocator(nullptr); }
  CudaBackend be;
  CudaProvider gpu{0};
  CachingAllocator alloc;
};

const Conv2dDesc kCases[] = {
    conv(2, 5, 7, 3, 4, 3, 3, 1, 1, 1, 1),
    conv(3, 9, 6, 5, 7, 3, 2, 2, 3, 1, 0),
    conv(1, 8, 8, 17, 9, 1, 1),
    conv(2, 11, 10, 4, 6, 4, 3, 3, 2, 2, 1),
    conv(8, 16, 16, 32, 64, 3, 3, 1, 1, 1, 1),  // tensor-core friendly channel counts
    conv(4, 12, 12, 16, 32, 3, 3, 2, 2, 1, 1),  // examples/train_cnn's second layer
};

TEST(ConvGpu, MatchesCpuInEveryDtype) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  CpuBackend cpu;
  std::mt19937 rng(17);
  for (DType dt : kAllDTypes) {
    for (const Conv2dDesc& d : kCases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + d.str());
      const Shape si{d.n * d.h * d.w * d.c}, sw{d.k * d.r * d.s * d.c};
      const Shape so{d.n * d.p() * d.q() * d.k};
      HT inp(si, dt), w(sw, dt), dout(so, dt), dw0(sw, DType::kF32);
      inp.rand(rng);
      w.rand(rng);
      dout.rand(rng);
      dw0.rand(rng);
      // CPU reference.
      HT out_ref(so, dt), dinp_ref(si, dt), dw_ref(sw, DType::kF32);
      dw_ref.assign(dw0.vals());
      cpu.conv2d_forward(kDefaultStream, d, inp, w, out_ref);
      const Tensor dinp_ref_t = dinp_ref;
      cpu.conv2d_backward(kDefaultStream, d, dout, inp, w, &dinp_ref_t, dw_ref);
      // GPU, outputs poisoned.
      Dev di(g.alloc, si, dt), dwt(g.alloc, sw, dt), ddo(g.alloc, so, dt),
          dout_dev(g.alloc, so, dt);
      Dev ddi(g.alloc, si, dt), ddw(g.alloc, sw, DType::kF32);
      di.upload(g.be, inp);
      dwt.upload(g.be, w);
      ddo.upload(g.be, dout);
      ddw.upload(g.be, dw0);
      g.be.fill(kDefaultStream, dout_dev.t(), kNaNf);
      g.be.fill(kDefaultStream, ddi.t(), kNaNf);
      g.be.conv2d_forward(kDefaultStream, d, di.t(), dwt.t(), dout_dev.t());
      g.be.conv2d_backward(kDefaultStream, d, ddo.t(), di.t(), dwt.t(), &ddi.t(), ddw.t());
      HT out(so, dt), dinp(si, dt), dw(sw, DType::kF32);
      dout_dev.download(g.be, out);
      ddi.download(g.be, dinp);
      ddw.download(g.be, dw);
      // Both sides accumulate in FP32 in different orders and round once to dt; f32 runs
      // without TF32 (the backend's default). The absolute slack grows with the term count.
      expect_close(out, out_ref.vals(), dt, "out", 1 + static_cast<double>(d.r * d.s * d.c) / 8);
      expect_close(dinp, dinp_ref.vals(), dt, "dinp", 1 + static_cast<double>(d.r * d.s * d.k) / 8);
      // f16/bf16 filter gradients pass through a dt temporary on the GPU (cuda_backend.h), so
      // they carry dt's rounding; f32 ones accumulate in place.
      expect_close(dw, dw_ref.vals(), dt, "dweight",
                   1 + static_cast<double>(d.n * d.p() * d.q()) / 4, 4);
    }
  }
}

TEST(ConvGpu, DeterministicAndWorkspaceReturned) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  std::mt19937 rng(23);
  const Conv2dDesc d = conv(8, 16, 16, 32, 64, 3, 3, 1, 1, 1, 1);
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Shape si{d.n * d.h * d.w * d.c}, sw{d.k * d.r * d.s * d.c};
    const Shape so{d.n * d.p() * d.q() * d.k};
    HT inp(si, dt), w(sw, dt), dout(so, dt);
    inp.rand(rng);
    w.rand(rng);
    dout.rand(rng);
    Dev di(g.alloc, si, dt), dwt(g.alloc, sw, dt), ddo(g.alloc, so, dt);
    di.upload(g.be, inp);
    dwt.upload(g.be, w);
    ddo.upload(g.be, dout);
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      Dev out(g.alloc, so, dt), ddi(g.alloc, si, dt), ddw(g.alloc, sw, DType::kF32);
      g.be.fill(kDefaultStream, ddw.t(), 0.0f);
      const std::int64_t live = g.alloc.stats().allocated_bytes[kStatAll].current;
      g.alloc.reset_peak_stats();
      g.be.conv2d_forward(kDefaultStream, d, di.t(), dwt.t(), out.t());
      g.be.conv2d_backward(kDefaultStream, d, ddo.t(), di.t(), dwt.t(), &ddi.t(), ddw.t());
      g.be.synchronize(kDefaultStream);
      // Workspace and the dweight temporary are stream-ordered scratch: gone once queued.
      EXPECT_EQ(g.alloc.stats().allocated_bytes[kStatAll].current, live);
      HT h_out(so, dt), h_dinp(si, dt), h_dw(sw, DType::kF32);
      out.download(g.be, h_out);
      ddi.download(g.be, h_dinp);
      ddw.download(g.be, h_dw);
      std::vector<float> all;
      for (const HT* h : {&h_out, &h_dinp, &h_dw}) {
        for (std::int64_t i = 0; i < h->n(); ++i) all.push_back(h->get(i));
      }
      runs.push_back(std::move(all));
    }
    ASSERT_EQ(runs[0].size(), runs[1].size());
    EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)), 0)
        << "two identical conv2d passes differ";
  }
}

// Throughput at a ResNet-like layer, bf16 (figure only: no target in the issue).
TEST(ConvGpu, Figure) {
  MEMFIT_REQUIRE_GPU();
  Gpu g;
  const Conv2dDesc d = conv(32, 56, 56, 64, 64, 3, 3, 1, 1, 1, 1);
  const DType dt = DType::kBF16;
  Dev di(g.alloc, Shape{d.n * d.h * d.w * d.c}, dt), dw(g.alloc, Shape{d.k * d.r * d.s * d.c}, dt);
  Dev out(g.alloc, Shape{d.n * d.p() * d.q() * d.k}, dt);
  g.be.fill(kDefaultStream, di.t(), 0.5f);
  g.be.fill(kDefaultStream, dw.t(), 0.25f);
  g.be.conv2d_forward(kDefaultStream, d, di.t(), dw.t(), out.t());  // warm-up
  g.be.synchronize(kDefaultStream);
  constexpr int kIters = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kIters; ++i) g.be.conv2d_forward(kDefaultStream, d, di.t(), dw.t(), out.t());
  g.be.synchronize(kDefaultStream);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double tflops = static_cast<double>(d.flops()) * kIters / s / 1e12;
  print_figure("conv2d bf16 forward 32x56x56x64 3x3 TFLOP/s", std::to_string(tflops));
  EXPECT_GT(tflops, 0.0);
}

}  // namespace
}  // namespace memfit
