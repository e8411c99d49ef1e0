// Offload overlap: the OffloadOptimizer's gradient copies on the CPU backend's worker copy
// stream run while the compute stream keeps working, so a backward pass that hands each
// layer's gradient to grads_ready() as soon as it is final costs about max(compute, copies)
// instead of compute + copies.
//
// The workload is a backward pass's weight-gradient GEMMs: per layer dW (out, in) += dY^T X
// with dY (rows, out) and X (rows, in), f32, then grads_ready({layer}). The same loop runs on
//   - CpuBackend({.worker_streams = true}): the copies queue on the optimizer's copy stream
//     (a worker thread) and overlap the next layers' GEMMs ("overlapped");
//   - CpuBackend(): every stream runs inline, so each copy runs inside grads_ready before the
//     next GEMM starts ("serialized", the anchor, in the same run).
// Time per pass = the loop plus the wait for the last copies inside step() (last_timing()
// .wait_grads_s); AdamW itself is excluded (the same work in both). Beside them: compute
// alone (no grads_ready) and the copies alone, hence the ideal overlap
// (compute + copies) / max(compute, copies). Medians over --reps after a warm-up.
//
// Threads: a GPU's copy engine is hardware of its own; here the copy worker needs a core. The
// bench re-executes itself with OPENBLAS_NUM_THREADS and OMP_NUM_THREADS set to cores - 1
// (at least 1) unless they are already set, so compute leaves the copy thread a core.
//
//   ./build/bench/offload_overlap_bench                         # 8 layers of 2048x1024, 32 rows
//   ./build/bench/offload_overlap_bench --layers 8 --in 2048 --out 4096 --rows 32 --reps 7
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/layer.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"
#include "memory/pinned_host_provider.h"
#include "policies/offload_optimizer.h"

namespace memfit {
namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int layers = 8;
  std::int64_t in = 1024, out = 2048, rows = 32;
  int reps = 7;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One backward's worth of layers on one backend: parameters, activations, optimizer.
class Rig {
 public:
  Rig(const Config& c, bool workers)
      : cfg_(c), be_({.worker_streams = workers}), alloc_(host_, {}, &be_.stream_sync()) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto fill = [&](const Tensor& t) {
      float* p = t.data<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = nd(rng) * 0.02f;
    };
    for (int l = 0; l < c.layers; ++l) {
      auto p = std::make_unique<Parameter>();
      p->name = "layer" + std::to_string(l) + ".weight";
      p->shape = Shape{c.out, c.in};
      p->weight = OwnedTensor::empty(alloc_, p->shape, DType::kF32, Device::kCpu,
                                     Category::kParameter, kDefaultStream, p->name);
      p->grad = OwnedTensor::empty(alloc_, p->shape, DType::kF32, Device::kCpu, Category::kGradient,
                                   kDefaultStream, p->name);
      fill(p->weight.view());
      fill(p->grad.view());
      params_.push_back(std::move(p));
    }
    dy_ = OwnedTensor::empty(alloc_, {c.rows, c.out}, DType::kF32, Device::kCpu,
                             Category::kActivation);
    x_ = OwnedTensor::empty(alloc_, {c.rows, c.in}, DType::kF32, Device::kCpu,
                            Category::kActivation);
    fill(dy_.view());
    fill(x_.view());
    std::vector<Parameter*> list;
    for (auto& p : params_) list.push_back(p.get());
    LayerContext ctx = context();
    OffloadOptions o;
    o.adamw.lr = 1e-6;
    opt_ = std::make_unique<OffloadOptimizer>(list, o, ctx, pinned_);
  }

  LayerContext context() { return LayerContext{be_, alloc_, kDefaultStream, DType::kF32}; }

  void grad_gemm(int l) {
    GemmDesc d;  // dW (out, in) += dY^T (out, rows) @ X (rows, in)
    d.m = cfg_.out;
    d.n = cfg_.in;
    d.k = cfg_.rows;
    d.trans_a = true;
    d.beta = 1.0f;
    be_.gemm(kDefaultStream, d, dy_.view(), x_.view(), params_[static_cast<std::size_t>(l)]->grad);
  }

  // Backward with grads_ready per layer (last layer first), then the wait inside step().
  double backward_with_copies() {
    LayerContext ctx = context();
    const auto t0 = Clock::now();
    for (int l = cfg_.layers - 1; l >= 0; --l) {
      grad_gemm(l);
      opt_->grads_ready(ctx, {params_[static_cast<std::size_t>(l)].get()});
    }
    const double loop = std::chrono::duration<double>(Clock::now() - t0).count();
    opt_->step(ctx, 1.0);
    be_.synchronize(kDefaultStream);
    last_loop_s = loop;
    last_wait_s = opt_->last_timing().wait_grads_s;
    return loop + last_wait_s;
  }
  double last_loop_s = 0, last_wait_s = 0;

  double compute_only() {
    const auto t0 = Clock::now();
    for (int l = cfg_.layers - 1; l >= 0; --l) grad_gemm(l);
    be_.synchronize(kDefaultStream);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // The copies alone: queueing them (inline: running them) plus the wait inside step().
  double copies_only() {
    LayerContext ctx = context();
    const auto t0 = Clock::now();
    opt_->grads_ready(ctx, list());
    const double queued = std::chrono::duration<double>(Clock::now() - t0).count();
    opt_->step(ctx, 1.0);
    return queued + opt_->last_timing().wait_grads_s;
  }

  std::vector<Parameter*> list() {
    std::vector<Parameter*> out;
    for (auto& p : params_) out.push_back(p.get());
    return out;
  }

 private:
  Config cfg_;
  CpuBackend be_;
  HostProvider host_;
  PinnedHostProvider pinned_;
  CachingAllocator alloc_;
  std::vector<std::unique_ptr<Parameter>> params_;
  OwnedTensor dy_, x_;
  std::unique_ptr<OffloadOptimizer> opt_;
};

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  using namespace memfit;
  // Leave the copy worker a core: set the compute thread counts and run again.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr && std::getenv("OMP_NUM_THREADS") == nullptr) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const std::string n = std::to_string(std::max(1u, cores - 1));
    setenv("OPENBLAS_NUM_THREADS", n.c_str(), 1);
    setenv("OMP_NUM_THREADS", n.c_str(), 1);
    execv("/proc/self/exe", argv);
    std::perror("offload_overlap_bench: re-exec failed; running with default threads");
  }
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> long long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--layers") {
      c.layers = static_cast<int>(std::max(1LL, next()));
    } else if (a == "--in") {
      c.in = std::max(1LL, next());
    } else if (a == "--out") {
      c.out = std::max(1LL, next());
    } else if (a == "--rows") {
      c.rows = std::max(1LL, next());
    } else if (a == "--reps") {
      c.reps = static_cast<int>(std::max(1LL, next()));
    } else {
      std::fprintf(stderr, "usage: %s [--layers L] [--in I] [--out O] [--rows R] [--reps N]\n",
                   argv[0]);
      return 2;
    }
  }
  const double grad_mb = 4.0 * c.in * c.out * c.layers / 1e6;
  std::printf(
      "offload overlap: %d layers, dW (%lld x %lld) f32 += dY^T X over %lld rows; %.1f MB of "
      "gradients per pass; compute threads OPENBLAS=%s OMP=%s, %u cores\n",
      c.layers, static_cast<long long>(c.out), static_cast<long long>(c.in),
      static_cast<long long>(c.rows), grad_mb, std::getenv("OPENBLAS_NUM_THREADS"),
      std::getenv("OMP_NUM_THREADS"), std::thread::hardware_concurrency());

  Rig overlapped(c, true), serialized(c, false);
  // Warm-up: page in the pinned slab and the scratch, start the threads.
  overlapped.backward_with_copies();
  serialized.backward_with_copies();
  std::vector<double> t_over, t_ser, t_comp, t_copy, over_loop, over_wait;
  for (int r = 0; r < c.reps; ++r) {  // interleaved, so drift hits both alike
    t_over.push_back(overlapped.backward_with_copies());
    over_loop.push_back(overlapped.last_loop_s);
    over_wait.push_back(overlapped.last_wait_s);
    t_ser.push_back(serialized.backward_with_copies());
    t_comp.push_back(serialized.compute_only());
    t_copy.push_back(serialized.copies_only());
  }
  const double over = median(t_over), ser = median(t_ser), comp = median(t_comp),
               copy = median(t_copy);
  const double ideal = (comp + copy) / std::max(comp, copy);
  std::printf("compute alone              %8.2f ms\n", comp * 1e3);
  std::printf("gradient copies alone      %8.2f ms  (%.2f GB/s)\n", copy * 1e3,
              grad_mb / 1e3 / copy);
  std::printf("serialized (inline copies) %8.2f ms  (anchor)\n", ser * 1e3);
  std::printf(
      "overlapped (worker stream) %8.2f ms  (backward loop %.2f ms + wait for the last "
      "copies %.2f ms, medians)\n",
      over * 1e3, median(over_loop) * 1e3, median(over_wait) * 1e3);
  std::printf(
      "speedup serialized/overlapped: %.2fx (ideal (compute + copies) / max = %.2fx); copy time "
      "hidden: %.0f%%\n",
      ser / over, ideal, 100.0 * std::clamp((ser - over) / copy, 0.0, 1.0));
  std::printf("target: overlapped < serialized (copies hidden behind compute): %s\n",
              over < ser ? "PASS" : "FAIL");
  return 0;
}
