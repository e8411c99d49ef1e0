// Causal attention on the CPU backend: the tiled flash attention (Backend::flash_attention_*,
// the layers' default) against the anchor, the materialized attention (Backend::attention_*,
// llm.c's decomposition over OpenBLAS GEMMs, the (T, T) probabilities stored), on GPT-2's
// attention shape (H = 12 heads of hs = 64, C = 768), bf16 storage, B = 1, for
// T = 128, 256, ..., 4096. Per T: forward and forward + backward time of each (median of the
// repetitions, the two paths alternating), the time ratio flash / materialized, and the bytes
// each path's buffers take beyond q, k, v (qkv) and the incoming gradient:
//   flash         out (T*C) + lse (H*T f32) saved; backward delta (H*T f32) + dqkv (3*T*C)
//   materialized  qkvr (3*T*C) + att (H*T*T) + out (T*C) saved, scratch (T*C) in the forward;
//                 backward datt (H*T*T) + dqkvr (3*T*C) + dqkv (3*T*C)
// i.e. the peak of one attention forward + backward from the first allocation to the last,
// measured by a CachingAllocator over a HostProvider that holds every buffer (its peak
// allocated bytes, so the figure is what a budget sees). Not in it, on either side: the CPU
// kernels' own host scratch (flash: per thread of min(B*H, threads), 5 * T * 64 floats in
// the backward, 5 MiB at T = 4096; materialized: OpenBLAS's buffers), which a GPU run does
// not have. Each cell times one call (no fixed work target): T = 128 is noisy; repeat it.
//
//   ./build/bench/attention_bench                 # T = 128 ... 4096, 3 repetitions
//   ./build/bench/attention_bench --reps 5 --max-t 2048 --dtype f32 --batch 2
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/flash_attention.h"
#include "core/dtype.h"
#include "core/layer.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"

namespace memfit {
namespace {

using Clock = std::chrono::steady_clock;
using i64 = std::int64_t;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Times {
  double fwd = 0, both = 0;  // seconds
  std::int64_t peak = 0;     // bytes
};

// One forward and one backward of either path, every buffer from `alloc`.
Times run_once(CpuBackend& be, CachingAllocator& alloc, bool flash, const Tensor& qkv,
               const Tensor& dout, i64 b, i64 t, i64 h, i64 hs, DType dt) {
  LayerContext ctx{be, alloc, kDefaultStream, dt};
  const i64 c = h * hs;
  alloc.reset_peak_stats();
  const std::int64_t base = alloc.stats().allocated_bytes[kStatAll].current;
  Times r;
  const auto t0 = Clock::now();
  if (flash) {
    Act out = ctx.make(Shape{b, t, c}, dt, Category::kActivation, "out");
    Act lse = ctx.make(Shape{b, h, t}, DType::kF32, Category::kActivation, "lse");
    be.flash_attention_forward(kDefaultStream, qkv, h, h, out->view(), lse->view());
    r.fwd = seconds_since(t0);
    Act delta = ctx.make(Shape{b, h, t}, DType::kF32, Category::kTemporary, "delta");
    Act dqkv = ctx.make(Shape{b, t, 3 * c}, dt, Category::kTemporary, "dqkv");
    be.flash_attention_backward(kDefaultStream, dout, qkv, out->view(), lse->view(), h, h,
                                delta->view(), dqkv->view());
  } else {
    Act qkvr = ctx.make(Shape{3, b, h, t, hs}, dt, Category::kActivation, "qkvr");
    Act att = ctx.make(Shape{b, h, t, t}, dt, Category::kActivation, "att");
    Act out = ctx.make(Shape{b, t, c}, dt, Category::kActivation, "out");
    {
      Act scratch = ctx.make(Shape{b, h, t, hs}, dt, Category::kTemporary, "scratch");
      be.attention_forward(kDefaultStream, qkv, h, qkvr->view(), att->view(), scratch->view(),
                           out->view());
    }
    r.fwd = seconds_since(t0);
    Act datt = ctx.make(Shape{b, h, t, t}, dt, Category::kTemporary, "datt");
    Act dqkvr = ctx.make(Shape{3, b, h, t, hs}, dt, Category::kTemporary, "dqkvr");
    Act dqkv = ctx.make(Shape{b, t, 3 * c}, dt, Category::kTemporary, "dqkv");
    be.attention_backward(kDefaultStream, dout, qkvr->view(), att->view(), h, datt->view(),
                          dqkvr->view(), dqkv->view());
  }
  be.synchronize(kDefaultStream);
  r.both = seconds_since(t0);
  r.peak = alloc.stats().allocated_bytes[kStatAll].peak - base;
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int bench_main(int argc, char** argv) {
  int reps = 3;
  i64 max_t = 4096, b = 1;
  DType dt = DType::kBF16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--reps" && has) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--max-t" && has) {
      max_t = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--batch" && has) {
      b = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--dtype" && has) {
      const std::string d = argv[++i];
      if (d == "f32") {
        dt = DType::kF32;
      } else if (d == "bf16") {
        dt = DType::kBF16;
      } else if (d == "f16") {
        dt = DType::kF16;
      } else {
        std::fprintf(stderr, "attention_bench: --dtype %s; valid: f32, bf16, f16\n", d.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "attention_bench: unknown argument '%s'; valid: --reps N --max-t T "
                   "--batch B --dtype f32|bf16|f16\n",
                   a.c_str());
      return 2;
    }
  }
  const i64 h = 12, hs = 64, c = h * hs;
  std::printf(
      "attention_bench: B=%lld H=%lld hs=%lld %s, CPU flash build %s, %d repetitions "
      "(median), the paths alternating\n",
      static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(hs),
      dtype_name(dt), cpu::vec_isa_name(cpu::vec_isa_best()), reps);
  std::printf("%6s | %10s %10s | %10s %10s | %6s %6s | %12s %12s %8s\n", "T", "flash fwd",
              "flash f+b", "mat fwd", "mat f+b", "fwd x", "f+b x", "flash bytes", "mat bytes",
              "bytes x");
  HostProvider host;
  CachingAllocator alloc(host, {});
  CpuBackend be;
  for (i64 t = 128; t <= max_t; t *= 2) {
    std::mt19937 rng(static_cast<std::uint32_t>(t));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    LayerContext ctx{be, alloc, kDefaultStream, dt};
    Act qkv = ctx.make(Shape{b, t, 3 * c}, dt, Category::kActivation, "qkv");
    Act dout = ctx.make(Shape{b, t, c}, dt, Category::kActivation, "dout");
    for (Act* a : {&qkv, &dout}) {
      std::vector<float> v(static_cast<std::size_t>((*a)->view().numel()));
      for (float& x : v) x = u(rng);
      convert(v.data(), DType::kF32, (*a)->view().raw(), dt, v.size());
    }
    std::vector<double> ff, fb, mf, mb;
    Times fl, ma;
    for (int r = 0; r < reps + 1; ++r) {  // the first round warms up and is dropped
      const bool flash_first = r % 2 == 0;
      for (int k = 0; k < 2; ++k) {
        const bool flash = (k == 0) == flash_first;
        const Times x = run_once(be, alloc, flash, qkv->view(), dout->view(), b, t, h, hs, dt);
        if (r == 0) continue;
        (flash ? ff : mf).push_back(x.fwd);
        (flash ? fb : mb).push_back(x.both);
        (flash ? fl : ma).peak = x.peak;
      }
    }
    const double a = median(ff), bb = median(fb), m1 = median(mf), m2 = median(mb);
    std::printf("%6lld | %9.2fms %9.2fms | %9.2fms %9.2fms | %6.2f %6.2f | %12lld %12lld %8.3f\n",
                static_cast<long long>(t), a * 1e3, bb * 1e3, m1 * 1e3, m2 * 1e3, a / m1, bb / m2,
                static_cast<long long>(fl.peak), static_cast<long long>(ma.peak),
                static_cast<double>(fl.peak) / static_cast<double>(ma.peak));
    std::fflush(stdout);
  }
  std::printf("ratios: flash / materialized (the anchor), same run; < 1 is flash ahead\n");
  return 0;
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) { return memfit::bench_main(argc, argv); }
