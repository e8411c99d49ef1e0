// CPU GEMM, C = A @ B (NN, row-major), for n^3 = 512^3 and 1024^3: memfit's CpuBackend::gemm
// with f32 operands and with bf16 A/B into f32 C, against the anchor: one direct cblas_sgemm
// call on f32 matrices of the same shape (cpu::blas_sgemm, OpenBLAS itself), timed in the same
// iterations. Prints GFLOP/s (2*n^3 per call) for both and the memfit/anchor ratio; the summary
// takes the repetition with the median ratio. The bf16 ratio is the price of widening A and B
// to f32 scratch before sgemm (2*n^2 conversions and 8*n^2 bytes of scratch per call).
//
//   ./build/bench/gemm_bench                       # all, then the summary lines
//   ./build/bench/gemm_bench --benchmark_repetitions=9
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
#include "core/dtype.h"

namespace memfit {
namespace {

// Operands of one shape in every storage the benchmarks use, built once.
struct Operands {
  std::int64_t n;
  std::vector<float> a, b, c;
  std::vector<std::uint16_t> a16, b16;
};

// Mutable: the benchmarks write their results into c.
Operands& operands(std::int64_t n) {
  static std::map<std::int64_t, Operands> cache;
  auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  Operands o{n, {}, {}, {}, {}, {}};
  const std::size_t nn = static_cast<std::size_t>(n * n);
  std::mt19937 rng(static_cast<std::uint32_t>(n));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  o.a.resize(nn);
  o.b.resize(nn);
  o.c.assign(nn, 0.0f);
  for (float& v : o.a) v = u(rng);
  for (float& v : o.b) v = u(rng);
  o.a16.resize(nn);
  o.b16.resize(nn);
  convert(o.a.data(), DType::kF32, o.a16.data(), DType::kBF16, nn);
  convert(o.b.data(), DType::kF32, o.b16.data(), DType::kBF16, nn);
  return cache.emplace(n, std::move(o)).first->second;
}

double flops(std::int64_t n) { return 2.0 * static_cast<double>(n) * n * n; }

// Each iteration times the anchor and memfit back to back, alternating which goes first, so
// both see the same machine load and cache state: on a shared machine a ratio of paired
// timings is far steadier than a ratio of two benchmarks run seconds apart. The iteration
// time reported to Google Benchmark is memfit's alone.
void run(benchmark::State& state, DType in) {
  using Clock = std::chrono::steady_clock;
  const std::int64_t n = state.range(0);
  Operands& o = operands(n);
  void* pa = in == DType::kF32 ? static_cast<void*>(o.a.data()) : o.a16.data();
  void* pb = in == DType::kF32 ? static_cast<void*>(o.b.data()) : o.b16.data();
  Tensor a(pa, Shape{n, n}, in, Device::kCpu);
  Tensor b(pb, Shape{n, n}, in, Device::kCpu);
  Tensor c(o.c.data(), Shape{n, n}, DType::kF32, Device::kCpu);
  std::vector<float> c_anchor(o.c.size());
  CpuBackend be;
  GemmDesc d;
  d.m = d.n = d.k = n;
  const int ni = static_cast<int>(n);
  auto anchor = [&] {
    cpu::blas_sgemm(false, false, ni, ni, ni, 1.0f, o.a.data(), o.b.data(), 0.0f, c_anchor.data());
  };
  auto memfit = [&] {
    be.gemm(kDefaultStream, d, a, b, c);
    be.synchronize(kDefaultStream);
  };
  double anchor_s = 0, memfit_s = 0;
  std::int64_t i = 0;
  for (auto _ : state) {
    double tm, ta;
    if (i++ % 2 == 0) {
      auto t0 = Clock::now();
      anchor();
      auto t1 = Clock::now();
      memfit();
      auto t2 = Clock::now();
      ta = std::chrono::duration<double>(t1 - t0).count();
      tm = std::chrono::duration<double>(t2 - t1).count();
    } else {
      auto t0 = Clock::now();
      memfit();
      auto t1 = Clock::now();
      anchor();
      auto t2 = Clock::now();
      tm = std::chrono::duration<double>(t1 - t0).count();
      ta = std::chrono::duration<double>(t2 - t1).count();
    }
    benchmark::ClobberMemory();
    state.SetIterationTime(tm);
    anchor_s += ta;
    memfit_s += tm;
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["GFLOP/s"] = flops(n) * iters / memfit_s * 1e-9;
  state.counters["anchor_GFLOP/s"] = flops(n) * iters / anchor_s * 1e-9;
  state.counters["ratio"] = anchor_s / memfit_s;
}

void BM_Gemm_F32(benchmark::State& s) { run(s, DType::kF32); }
void BM_Gemm_BF16in_F32out(benchmark::State& s) { run(s, DType::kBF16); }

#define MEMFIT_GEMM_BENCH(fn) \
  BENCHMARK(fn)               \
      ->Arg(512)              \
      ->Arg(1024)             \
      ->UseManualTime()       \
      ->MinWarmUpTime(0.3)    \
      ->MinTime(1.0)          \
      ->Repetitions(3)        \
      ->Unit(benchmark::kMillisecond)
MEMFIT_GEMM_BENCH(BM_Gemm_F32);
MEMFIT_GEMM_BENCH(BM_Gemm_BF16in_F32out);

struct Figures {
  double gflops, anchor, ratio;
};

// Prints as usual and keeps each repetition's figures per (benchmark, n) for the summary.
class CollectingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred || r.iterations == 0) continue;
      figures_[{r.run_name.function_name, std::stoll(r.run_name.args)}].push_back(
          {r.counters.at("GFLOP/s").value, r.counters.at("anchor_GFLOP/s").value,
           r.counters.at("ratio").value});
    }
  }
  // The repetition with the median ratio; nullopt when the benchmark was filtered out.
  std::optional<Figures> median(const std::string& name, std::int64_t n) {
    std::vector<Figures>& v = figures_[{name, n}];
    if (v.empty()) return std::nullopt;
    std::sort(v.begin(), v.end(),
              [](const Figures& x, const Figures& y) { return x.ratio < y.ratio; });
    return v[v.size() / 2];
  }

 private:
  std::map<std::pair<std::string, std::int64_t>, std::vector<Figures>> figures_;
};

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  memfit::CollectingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  std::printf(
      "\nCPU GEMM NN n^3, repetition with the median ratio (hardware threads: %u)\n"
      "anchor = direct cblas_sgemm on f32 operands of the same shape, timed in the same "
      "iterations; ratio = memfit GFLOP/s / anchor GFLOP/s\n",
      std::thread::hardware_concurrency());
  for (std::int64_t n : {512, 1024}) {
    for (const char* name : {"BM_Gemm_F32", "BM_Gemm_BF16in_F32out"}) {
      std::optional<memfit::Figures> f = reporter.median(name, n);
      if (!f) continue;
      std::printf("  n=%-5lld %-22s memfit %7.1f GFLOP/s   anchor %7.1f GFLOP/s   ratio %.3f\n",
                  static_cast<long long>(n), name + 3, f->gflops, f->anchor, f->ratio);
    }
  }
  return 0;
}
