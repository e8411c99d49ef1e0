// CPU GEMM on the shapes of the README's GPT {vocab 256, seq 128, hidden 256, 8 heads, mlp 4x}
// at batch 16 (B*T = 2048): each Linear's forward (NT), input gradient (NN) and weight gradient
// (TN, beta 1), and attention's two batched products (B*H = 128). Per dtype and engine path:
//   f32  blas   OpenBLAS sgemm through memfit (what MEMFIT_CPU_GEMM=blas runs)
//   f32  dnnl   oneDNN f32 matmul
//   bf16 blas   bf16 widened to f32 scratch, sgemm, rounded back (the fallback)
//   bf16 dnnl   oneDNN bf16 matmul (AVX512-BF16 kernels where the CPU has them)
//   f16  blas   widened (oneDNN 2.6 has no CPU f16 matmul without AVX512-FP16)
// C has the inputs' dtype. Anchor: one direct cblas_sgemm per batch entry on f32 operands of
// the same shape (cpu::blas_sgemm, OpenBLAS itself), timed in the same iterations, alternating
// which goes first. Figures come from the fastest call of each in a repetition (a contended
// 2-thread team stalls for a time slice now and then). Prints GFLOP/s and ratio = figure /
// anchor per shape (the repetition with the median ratio, and the ratio's spread over the
// repetitions), then per path the whole set weighted as one training step runs it (total flops
// / total time of one call each), and which path MEMFIT_CPU_GEMM=auto takes per dtype.
//
//   ./build/bench/gemm_bench                               # ~2 minutes on 2 cores
//   ./build/bench/gemm_bench --benchmark_filter='bf16'     # one dtype
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/gemm_dnnl.h"
#include "core/cpu/gemm_engine.h"
#include "core/dtype.h"

namespace memfit {
namespace {

using cpu::GemmEngine;
using cpu::GemmPath;

struct GemmShape {
  const char* name;
  std::int64_t m, n, k, batch;
  bool ta, tb;
  float beta;
};

// GPT {256, 128, 6, 256, 8} at batch 16: B*T = 2048, C = 256, 4C = 1024, 3C = 768, V = 256,
// B*H = 128 heads of T = 128 by hs = 32.
const GemmShape kShapes[] = {
    {"fwd qkv", 2048, 768, 256, 1, false, true, 0.0f},
    {"fwd proj/lm_head", 2048, 256, 256, 1, false, true, 0.0f},
    {"fwd fc", 2048, 1024, 256, 1, false, true, 0.0f},
    {"fwd fc_proj", 2048, 256, 1024, 1, false, true, 0.0f},
    {"dinp qkv", 2048, 256, 768, 1, false, false, 0.0f},
    {"dinp proj", 2048, 256, 256, 1, false, false, 0.0f},
    {"dinp fc", 2048, 256, 1024, 1, false, false, 0.0f},
    {"dinp fc_proj", 2048, 1024, 256, 1, false, false, 0.0f},
    {"dW qkv", 768, 256, 2048, 1, true, false, 1.0f},
    {"dW proj", 256, 256, 2048, 1, true, false, 1.0f},
    {"dW fc", 1024, 256, 2048, 1, true, false, 1.0f},
    {"dW fc_proj", 256, 1024, 2048, 1, true, false, 1.0f},
    {"att q@k^T", 128, 128, 32, 128, false, true, 0.0f},
    {"att att@v", 128, 32, 128, 128, false, false, 0.0f},
};

struct PathCase {
  const char* name;
  DType dtype;
  GemmEngine engine;
};
const PathCase kPaths[] = {{"f32 blas", DType::kF32, GemmEngine::kBlas},
                           {"f32 dnnl", DType::kF32, GemmEngine::kDnnl},
                           {"bf16 blas", DType::kBF16, GemmEngine::kBlas},
                           {"bf16 dnnl", DType::kBF16, GemmEngine::kDnnl},
                           {"f16 blas", DType::kF16, GemmEngine::kBlas}};

double flops(const GemmShape& s) { return 2.0 * static_cast<double>(s.m) * s.n * s.k * s.batch; }

// Random f32 operands of one shape, and the same values in each 16-bit dtype; built once.
struct Operands {
  std::vector<float> a, b, c;
  std::vector<std::uint16_t> a_bf16, b_bf16, c_bf16, a_f16, b_f16, c_f16;
};

Operands& operands(const GemmShape& s) {
  static std::map<std::string, Operands> cache;
  auto it = cache.find(s.name);
  if (it != cache.end()) return it->second;
  Operands o;
  const auto na = static_cast<std::size_t>(s.batch * s.m * s.k);
  const auto nb = static_cast<std::size_t>(s.batch * s.k * s.n);
  const auto nc = static_cast<std::size_t>(s.batch * s.m * s.n);
  std::mt19937 rng(static_cast<std::uint32_t>(s.m * 131 + s.n * 7 + s.k));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  o.a.resize(na);
  o.b.resize(nb);
  o.c.resize(nc);
  for (float& v : o.a) v = u(rng);
  for (float& v : o.b) v = u(rng);
  for (float& v : o.c) v = u(rng);
  for (auto [src, bf, hf] : {std::tuple{&o.a, &o.a_bf16, &o.a_f16}, std::tuple{&o.b, &o.b_bf16, &o.b_f16},
                             std::tuple{&o.c, &o.c_bf16, &o.c_f16}}) {
    bf->resize(src->size());
    hf->resize(src->size());
    convert(src->data(), DType::kF32, bf->data(), DType::kBF16, src->size());
    convert(src->data(), DType::kF32, hf->data(), DType::kF16, src->size());
  }
  return cache.emplace(s.name, std::move(o)).first->second;
}

void* storage(std::vector<float>& f, std::vector<std::uint16_t>& bf, std::vector<std::uint16_t>& hf,
              DType t) {
  return t == DType::kF32 ? static_cast<void*>(f.data())
                          : t == DType::kBF16 ? static_cast<void*>(bf.data()) : hf.data();
}

// Each iteration times the anchor and the path back to back, alternating which goes first, so
// both see the same machine load and cache state; the time reported is the path's alone.
void run(benchmark::State& state, const GemmShape& s, const PathCase& p) {
  using Clock = std::chrono::steady_clock;
  Operands& o = operands(s);
  std::vector<float> c_anchor(o.c.size());
  const Tensor a(storage(o.a, o.a_bf16, o.a_f16, p.dtype), Shape{s.batch * s.m * s.k}, p.dtype,
                 Device::kCpu);
  const Tensor b(storage(o.b, o.b_bf16, o.b_f16, p.dtype), Shape{s.batch * s.k * s.n}, p.dtype,
                 Device::kCpu);
  const Tensor c(storage(o.c, o.c_bf16, o.c_f16, p.dtype), Shape{s.batch * s.m * s.n}, p.dtype,
                 Device::kCpu);
  GemmDesc d;
  d.m = s.m;
  d.n = s.n;
  d.k = s.k;
  d.trans_a = s.ta;
  d.trans_b = s.tb;
  d.beta = s.beta;
  d.batch = s.batch;
  d.stride_a = s.m * s.k;
  d.stride_b = s.k * s.n;
  d.stride_c = s.m * s.n;
  const cpu::GemmPlan plan = cpu::plan_gemm(d, p.dtype, p.dtype, p.dtype, p.engine);
  if (plan.path != (p.engine == GemmEngine::kDnnl ? GemmPath::kDnnl : GemmPath::kBlas)) {
    state.SkipWithError("no oneDNN implementation for this dtype on this CPU");
    return;
  }
  std::vector<float> scratch(plan.scratch_floats);
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  auto anchor = [&] {
    for (std::int64_t i = 0; i < s.batch; ++i) {
      cpu::blas_sgemm(s.ta, s.tb, m, n, k, 1.0f, o.a.data() + i * s.m * s.k,
                      o.b.data() + i * s.k * s.n, s.beta, c_anchor.data() + i * s.m * s.n);
    }
  };
  auto path = [&] { cpu::run_gemm_plan(plan, d, a, b, c, scratch.data()); };
  double anchor_best = 1e30, path_best = 1e30;
  std::int64_t i = 0;
  for (auto _ : state) {
    double tp, ta;
    if (i++ % 2 == 0) {
      auto t0 = Clock::now();
      anchor();
      auto t1 = Clock::now();
      path();
      auto t2 = Clock::now();
      ta = std::chrono::duration<double>(t1 - t0).count();
      tp = std::chrono::duration<double>(t2 - t1).count();
    } else {
      auto t0 = Clock::now();
      path();
      auto t1 = Clock::now();
      anchor();
      auto t2 = Clock::now();
      tp = std::chrono::duration<double>(t1 - t0).count();
      ta = std::chrono::duration<double>(t2 - t1).count();
    }
    benchmark::ClobberMemory();
    state.SetIterationTime(tp);
    anchor_best = std::min(anchor_best, ta);
    path_best = std::min(path_best, tp);
  }
  // The fastest call of each: on a shared 2-core machine another process's time slice stalls
  // a 2-thread OpenMP team for milliseconds at a barrier, which a mean would count.
  state.counters["GFLOP/s"] = flops(s) / path_best * 1e-9;
  state.counters["anchor_GFLOP/s"] = flops(s) / anchor_best * 1e-9;
  state.counters["ratio"] = anchor_best / path_best;
  state.SetLabel(plan.path == GemmPath::kDnnl ? plan.dnnl->impl() : "widen+sgemm");
}

struct Figures {
  double gflops, anchor, ratio;
};

// Prints as usual and keeps each repetition's figures per benchmark name for the summary.
class CollectingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred || r.iterations == 0) continue;
      figures_[r.run_name.function_name].push_back({r.counters.at("GFLOP/s").value,
                                                   r.counters.at("anchor_GFLOP/s").value,
                                                   r.counters.at("ratio").value});
    }
  }
  // The repetition with the median ratio; nullopt when filtered out or skipped.
  std::optional<Figures> median(const std::string& name) {
    std::vector<Figures>& v = figures_[name];
    if (v.empty()) return std::nullopt;
    std::sort(v.begin(), v.end(),
              [](const Figures& x, const Figures& y) { return x.ratio < y.ratio; });
    return v[v.size() / 2];
  }
  // Smallest and largest ratio over the repetitions: the spread.
  std::pair<double, double> spread(const std::string& name) {
    std::vector<Figures>& v = figures_[name];
    if (v.empty()) return {0, 0};
    auto [lo, hi] = std::minmax_element(
        v.begin(), v.end(), [](const Figures& x, const Figures& y) { return x.ratio < y.ratio; });
    return {lo->ratio, hi->ratio};
  }

 private:
  std::map<std::string, std::vector<Figures>> figures_;
};

std::string bench_name(const GemmShape& s, const PathCase& p) {
  return std::string(p.name) + "/" + s.name;
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  using namespace memfit;
  for (const PathCase& p : kPaths) {
    for (const GemmShape& s : kShapes) {
      benchmark::RegisterBenchmark(bench_name(s, p).c_str(),
                                   [&s, &p](benchmark::State& st) { run(st, s, p); })
          ->UseManualTime()
          ->MinWarmUpTime(0.05)
          ->MinTime(0.1)
          ->Repetitions(5)
          ->ReportAggregatesOnly(false)
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  CollectingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  std::printf(
      "\nCPU GEMM, GPT {256,128,6,256,8} batch 16 shapes; repetition with the median ratio "
      "(hardware threads %u, OpenBLAS threading %s, oneDNN ISA %s)\n"
      "anchor = direct cblas_sgemm on f32 operands of the same shape, timed in the same "
      "iterations; fastest call of each; ratio = GFLOP/s / anchor GFLOP/s [min-max over "
      "repetitions]\n",
      std::thread::hardware_concurrency(), cpu::blas_threading(), cpu::dnnl_isa().name);
  std::printf("  %-18s %8s", "shape (m n k xB)", "anchor");
  for (const PathCase& p : kPaths) std::printf("  %22s", p.name);
  std::printf("\n");
  std::map<std::string, double> path_seconds, anchor_seconds, path_flops;
  for (const GemmShape& s : kShapes) {
    std::optional<Figures> first;
    for (const PathCase& p : kPaths) {
      if (auto f = reporter.median(bench_name(s, p)); f && !first) first = f;
    }
    if (!first) continue;
    std::printf("  %-18s %8.1f", s.name, first->anchor);
    for (const PathCase& p : kPaths) {
      const std::string name = bench_name(s, p);
      std::optional<Figures> f = reporter.median(name);
      if (!f) {
        std::printf("  %22s", "n/a");
        continue;
      }
      auto [lo, hi] = reporter.spread(name);
      std::printf("  %6.1f %5.2fx [%.2f-%.2f]", f->gflops, f->ratio, lo, hi);
      path_seconds[p.name] += flops(s) / (f->gflops * 1e9);
      anchor_seconds[p.name] += flops(s) / (f->anchor * 1e9);
      path_flops[p.name] += flops(s);
    }
    std::printf("\n");
  }
  std::printf("  one call per shape (a step's mix):\n");
  for (const PathCase& p : kPaths) {
    if (path_seconds[p.name] == 0) continue;
    std::printf("  %-10s %7.1f GFLOP/s   anchor %7.1f GFLOP/s   ratio %.2fx\n", p.name,
                path_flops[p.name] / path_seconds[p.name] * 1e-9,
                path_flops[p.name] / anchor_seconds[p.name] * 1e-9,
                anchor_seconds[p.name] / path_seconds[p.name]);
  }
  std::printf("  MEMFIT_CPU_GEMM=auto takes: f32 %s, bf16 %s, f16 %s\n",
              cpu::dnnl_chosen_by_auto(DType::kF32) ? "dnnl" : "blas",
              cpu::dnnl_chosen_by_auto(DType::kBF16) ? "dnnl" : "blas",
              cpu::dnnl_chosen_by_auto(DType::kF16) ? "dnnl" : "blas");
  return 0;
}
