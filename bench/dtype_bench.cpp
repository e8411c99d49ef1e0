// f32 -> bf16 and f32 -> f16 conversion of 1M elements: the scalar path (the anchor) against
// what convert() dispatches to on this CPU. Prints GB/s (bytes read + written: 6 per element)
// for each and the dispatched/scalar ratio, both from this run (median of the repetitions,
// CPU time per call).
//
//   ./build/bench/dtype_bench                 # all four, then the summary lines
//   ./build/bench/dtype_bench --benchmark_repetitions=9
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace memfit {
namespace {

constexpr std::size_t kElems = std::size_t{1} << 20;
constexpr std::size_t kBytesPerElem = 4 + 2;

const std::vector<float>& source() {
  // Activation-like values: normal around 0 with a spread of magnitudes; no NaN/inf, which
  // would only make the scalar path's branches more predictable than real data.
  static const std::vector<float> v = [] {
    std::mt19937 rng(42);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> x(kElems);
    for (float& f : x) f = d(rng);
    return x;
  }();
  return v;
}

using ConvertFn = void (*)(const void*, DType, void*, DType, std::size_t);

void run(benchmark::State& state, ConvertFn fn, DType dt) {
  const std::vector<float>& src = source();
  std::vector<std::uint16_t> dst(kElems);
  for (auto _ : state) {
    fn(src.data(), DType::kF32, dst.data(), dt, kElems);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(kElems * kBytesPerElem));
}

void BM_F32ToBF16_Scalar(benchmark::State& s) { run(s, detail::convert_scalar, DType::kBF16); }
void BM_F32ToBF16_Dispatched(benchmark::State& s) { run(s, convert, DType::kBF16); }
void BM_F32ToF16_Scalar(benchmark::State& s) { run(s, detail::convert_scalar, DType::kF16); }
void BM_F32ToF16_Dispatched(benchmark::State& s) { run(s, convert, DType::kF16); }

#define MEMFIT_DTYPE_BENCH(fn) \
  BENCHMARK(fn)->MinWarmUpTime(0.2)->MinTime(0.5)->Repetitions(5)->Unit(benchmark::kMicrosecond)
MEMFIT_DTYPE_BENCH(BM_F32ToBF16_Scalar);
MEMFIT_DTYPE_BENCH(BM_F32ToBF16_Dispatched);
MEMFIT_DTYPE_BENCH(BM_F32ToF16_Scalar);
MEMFIT_DTYPE_BENCH(BM_F32ToF16_Dispatched);

// Prints as usual and keeps each repetition's GB/s per benchmark for the summary.
class CollectingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred || r.iterations == 0) continue;
      // CPU time, as the G/s column above: on a shared machine wall time also counts the
      // time this thread was descheduled.
      const double secs = r.cpu_accumulated_time / static_cast<double>(r.iterations);
      gbps_[r.run_name.function_name].push_back(kElems * kBytesPerElem / secs / 1e9);
    }
  }
  // Median GB/s of a benchmark's repetitions; 0 when it did not run (filtered out).
  double median(const std::string& name) {
    std::vector<double>& v = gbps_[name];
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }

 private:
  std::map<std::string, std::vector<double>> gbps_;
};

void summary(CollectingReporter& rep, const char* what, const char* scalar, const char* disp) {
  const double s = rep.median(scalar), d = rep.median(disp);
  if (s == 0 || d == 0) return;
  std::printf(
      "%-9s %zu elements: scalar %.2f GB/s (anchor), dispatched [%s] %.2f GB/s, "
      "ratio %.2fx\n",
      what, kElems, s, convert_isa(), d, d / s);
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  memfit::CollectingReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  std::printf("\nGB/s = (4 B read + 2 B written) per element / median CPU time per call\n");
  memfit::summary(rep, "f32->bf16", "BM_F32ToBF16_Scalar", "BM_F32ToBF16_Dispatched");
  memfit::summary(rep, "f32->f16", "BM_F32ToF16_Scalar", "BM_F32ToF16_Dispatched");
  benchmark::Shutdown();
  return 0;
}
