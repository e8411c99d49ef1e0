// The caching allocator's fast path: an allocate + free pair of a size already in the cache.
//
//   build/bench/allocator_bench [pairs_per_rep] [reps]
//
// For each allocator mode (fixed segments, expandable_segments:True), form (Block RAII, raw
// pointer), pool (4 KiB small, 32 MiB large) and listener (none, one no-op listener), it warms the cache, discards the warm-up, then times `reps`
// repetitions of `pairs_per_rep` pairs and prints the median ns per pair. The same run times
// malloc/free of the same sizes as a same-machine anchor. Anchors from elsewhere (other
// machines, other years: read them as orders of magnitude, not as a race):
//   PyTorch: a whole at::empty (dispatch + TensorImpl + CUDA caching allocator) about 1.46 us
//            (pytorch/pytorch#13785; the figure as the project brief cites it, not
//            re-measured here).
//   CUDA.jl: pooled alloc averaged 3.52 us, pooled free 1.68 us (JuliaGPU/CUDA.jl#746, the
//            timing table in the description); the 3.52 us is the allocation alone.
// Target: <= 100 ns per pair (PASS/MISS printed per row).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/host_provider.h"

namespace {

using memfit::Block;
using memfit::CachingAllocator;
using memfit::Category;

constexpr double kTargetNs = 100.0;
constexpr double kAtEmptyNs = 1460.0;      // pytorch/pytorch#13785
constexpr double kCudaJlAllocNs = 3520.0;  // JuliaGPU/CUDA.jl#746
constexpr int kWarmupPairs = 20000;

// Median over reps of ns per pair; `pairs(n)` runs n pairs.
double median_ns(const std::function<void(long)>& pairs, long n, int reps) {
  pairs(kWarmupPairs);  // discarded: fills the cache, the branch predictors and the TLB
  std::vector<double> ns;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pairs(n);
    const auto t1 = std::chrono::steady_clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / double(n));
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

struct Row {
  std::string mode, form, pool, listener;
  double ns;
};

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 200000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 21;
  if (n < 1 || reps < 1) {
    std::fprintf(stderr, "usage: %s [pairs_per_rep >= 1] [reps >= 1]\n", argv[0]);
    return 2;
  }
  struct Pool {
    const char* name;
    std::size_t bytes;
  };
  const Pool pools[] = {{"small 4KiB", 4096}, {"large 32MiB", std::size_t{32} << 20}};

  std::vector<Row> rows;
  std::vector<std::pair<std::string, double>> malloc_ns;
  for (const Pool& pool : pools) {
    const std::size_t bytes = pool.bytes;
    malloc_ns.emplace_back(pool.name, median_ns(
                                          [bytes](long k) {
                                            for (long i = 0; i < k; ++i) {
                                              void* p = std::malloc(bytes);
                                              benchmark::DoNotOptimize(p);
                                              std::free(p);
                                            }
                                          },
                                          n, reps));
    for (const bool expandable : {false, true})
    for (bool listener : {false, true}) {
      memfit::HostProvider host;
      memfit::AllocatorConfig conf;
      conf.expandable_segments = expandable;
      CachingAllocator alloc(host, conf);
      const char* mode = expandable ? "expandable" : "segments";
      long events = 0;
      if (listener) alloc.add_listener([&events](const memfit::AllocatorEvent&) { ++events; });
      const char* lname = listener ? "1 no-op" : "none";
      rows.push_back({mode, "Block RAII", pool.name, lname,
                      median_ns(
                          [&](long k) {
                            for (long i = 0; i < k; ++i) {
                              Block b = alloc.allocate(bytes, Category::kActivation);
                              benchmark::DoNotOptimize(b.data());
                            }
                          },
                          n, reps)});
      rows.push_back({mode, "raw pointer", pool.name, lname,
                      median_ns(
                          [&](long k) {
                            for (long i = 0; i < k; ++i) {
                              void* p = alloc.allocate_raw(bytes, Category::kActivation);
                              benchmark::DoNotOptimize(p);
                              alloc.free(p);
                            }
                          },
                          n, reps)});
      if (alloc.stats().num_device_alloc != 1) {
        std::fprintf(stderr, "error: %lld provider allocations; the fast path was not timed\n",
                     static_cast<long long>(alloc.stats().num_device_alloc));
        return 1;
      }
      if (listener && events == 0) {
        std::fprintf(stderr, "error: the listener saw no events\n");
        return 1;
      }
    }
  }

  std::printf("CachingAllocator fast path: allocate + free of a cached size\n");
  std::printf("median of %d reps x %ld pairs, %d warm-up pairs discarded per row\n\n", reps, n,
              kWarmupPairs);
  std::printf("%-11s %-12s %-12s %-9s %9s %10s %10s %12s %12s  %s\n", "mode", "form", "pool",
              "listener",
              "ns/pair", "malloc ns", "/malloc", "/at::empty", "/CUDA.jl", "target<=100ns");
  bool all_pass = true;
  for (const Row& r : rows) {
    double m = 0;
    for (const auto& [name, ns] : malloc_ns)
      if (name == r.pool) m = ns;
    const bool pass = r.ns <= kTargetNs;
    // The target is the fast path nobody observes; listener rows show what observing costs.
    if (r.listener == "none") all_pass = all_pass && pass;
    std::printf("%-11s %-12s %-12s %-9s %9.1f %10.1f %10.2f %12.4f %12.4f  %s\n",
                r.mode.c_str(), r.form.c_str(),
                r.pool.c_str(), r.listener.c_str(), r.ns, m, r.ns / m, r.ns / kAtEmptyNs,
                r.ns / kCudaJlAllocNs, pass ? "PASS" : "MISS");
  }
  std::printf(
      "\nanchors: malloc/free of the same size, this machine, this run (column 'malloc ns');\n"
      "         PyTorch whole at::empty ~%.0f ns (pytorch/pytorch#13785);\n"
      "         CUDA.jl pooled alloc %.0f ns, allocation alone (JuliaGPU/CUDA.jl#746).\n"
      "ratios are ours / anchor (below 1 = faster than the anchor).\n"
      "overall, rows without a listener: %s (target <= %.0f ns per pair)\n",
      kAtEmptyNs, kCudaJlAllocNs, all_pass ? "PASS" : "MISS", kTargetNs);
  return 0;
}
