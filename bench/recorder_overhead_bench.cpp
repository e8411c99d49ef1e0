// Recorder overhead: what attaching a Recorder (profiler/recorder.h) costs a training step.
// Target (issue 5): <= 5% of the step time.
//
// The workload: Trainer::step on the CPU backend, gpt-tiny (6 x 256, vocab 256), f32, batch
// 1 x 32 tokens, device AdamW, no checkpointing, one compute thread (the bench re-executes
// itself with OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 unless either is set: on a shared
// machine, thread teams waiting for a busy core make step times swing far more than 5%). One
// model and trainer serve both arms, which alternate step by step in ABBA order (so drift
// such as a neighbour's load hits both alike): a bare step, then a step with a Recorder
// attached (a new one for each, as `memfit profile` attaches one per run, so its rings grow
// from empty every time: the pessimistic case), then the reverse. Warm-up steps (allocator
// caches, page faults) are discarded. The figure is the median over rounds of each round's
// ratio (recorded / bare, `--steps` steps of each), beside each arm's median step time.
//
// Beside it, a noise-free estimate of the same ratio: the Recorder's cost per allocate + free
// pair (NullProvider, no memory touched: the listener path alone, with and without a
// Recorder) times the pairs per step, over the bare step time. On a shared machine the
// measured ratio can swing by a few percent either way; the estimate says what the listener
// itself costs.
//
//   ./build/bench/recorder_overhead_bench                   # 40 rounds x 1 step, 2 warm-up
//   ./build/bench/recorder_overhead_bench --rounds 20 --steps 2 --batch 4 --seq 64
// Prints both times, the ratios and PASS/FAIL (exit status 1 on FAIL).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/model.h"
#include "core/text_dataset.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "policies/trainer.h"
#include "profiler/recorder.h"

namespace memfit {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kTarget = 1.05;  // issue 5: recording costs <= 5% of a step

struct Config {
  int rounds = 40, steps = 1, warmup = 2;
  std::int64_t batch = 1, seq = 32;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Random tokens: the step's cost does not depend on the text.
Batch random_batch(std::int64_t b, std::int64_t t, Rng& rng) {
  Batch out;
  out.batch = b;
  out.seq_len = t;
  for (std::int64_t i = 0; i < b * t; ++i) {
    out.tokens.push_back(static_cast<std::int32_t>(rng.below(256)));
    out.targets.push_back(static_cast<std::int32_t>(rng.below(256)));
  }
  return out;
}

// ns per allocate + free pair of a 4 KiB block, best of 5 runs of `n` pairs.
double pair_ns(CachingAllocator& alloc, int n) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      void* p = alloc.allocate_raw(4096, Category::kActivation);
      alloc.free(p);
    }
    best = std::min(best, std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n);
  }
  return best;
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  using namespace memfit;
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr && std::getenv("OMP_NUM_THREADS") == nullptr) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    execv("/proc/self/exe", argv);
    std::perror("recorder_overhead_bench: re-exec failed; running with default threads");
  }
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> long long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::max(1LL, std::atoll(argv[++i]));
    };
    if (a == "--rounds") {
      c.rounds = static_cast<int>(next());
    } else if (a == "--steps") {
      c.steps = static_cast<int>(next());
    } else if (a == "--warmup") {
      c.warmup = static_cast<int>(next());
    } else if (a == "--batch") {
      c.batch = next();
    } else if (a == "--seq") {
      c.seq = std::min(128LL, next());  // gpt-tiny's seq_len
    } else {
      std::fprintf(stderr,
                   "usage: %s [--rounds R] [--steps S] [--warmup W] [--batch B] [--seq T]\n",
                   argv[0]);
      return 2;
    }
  }

  CpuBackend be;
  HostProvider host;
  CachingAllocator alloc(host, {}, &be.stream_sync());
  LayerContext ctx{be, alloc, kDefaultStream, DType::kF32};
  Model model(ModelSpec::preset("gpt-tiny"), ctx);
  TrainerOptions opt;
  opt.adamw.lr = 1e-4;
  Trainer trainer(model, ctx, opt);
  Rng data(42);
  const Batch batch = random_batch(c.batch, c.seq, data);

  for (int i = 0; i < c.warmup; ++i) trainer.step(batch);

  std::vector<double> bare, recorded, ratios;
  std::size_t events = 0, recorded_steps = 0;
  // Seconds of `c.steps` steps, with or without a Recorder.
  const auto run = [&](bool with_recorder) {
    double sum = 0;
    if (!with_recorder) {
      for (int s = 0; s < c.steps; ++s) {
        bare.push_back(trainer.step(batch).seconds);
        sum += bare.back();
      }
      return sum;
    }
    Recorder rec(alloc);
    for (int s = 0; s < c.steps; ++s) {
      recorded.push_back(trainer.step(batch).seconds);
      sum += recorded.back();
    }
    events += rec.recording().events.size();
    recorded_steps += static_cast<std::size_t>(c.steps);
    return sum;
  };
  const auto t_all = Clock::now();
  for (int r = 0; r < c.rounds; ++r) {
    double with = 0, without = 0;
    if (r % 2 == 0) {
      without = run(false);
      with = run(true);
    } else {
      with = run(true);
      without = run(false);
    }
    ratios.push_back(with / without);
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t_all).count();

  const double t_bare = median(bare), t_rec = median(recorded);
  const double ratio = median(ratios);

  // The listener path alone.
  NullProvider null;
  CachingAllocator quiet(null);
  const int kPairs = 200000;
  const double ns_bare = pair_ns(quiet, kPairs);
  double ns_rec = 0;
  {
    Recorder rec(quiet, {.capacity = std::size_t{1} << 16});  // the ring wraps: the steady state
    ns_rec = pair_ns(quiet, kPairs);
  }
  // An allocate + free pair is 2 events (alloc, free_requested) plus free_completed: 3 events.
  const double events_per_step = static_cast<double>(events) / static_cast<double>(recorded_steps);
  const double estimate = 1.0 + (events_per_step / 3.0) * (ns_rec - ns_bare) * 1e-9 / t_bare;

  std::printf(
      "recorder overhead: gpt-tiny f32, batch %lld x %lld, CPU backend (%s compute "
      "threads), %d rounds x %d steps per arm (ABBA), %d warm-up steps discarded, %.1f s\n",
      static_cast<long long>(c.batch), static_cast<long long>(c.seq),
      std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "default", c.rounds,
      c.steps, c.warmup, wall);
  std::printf("  step, no recorder    median %8.2f ms   (min %.2f)\n", t_bare * 1e3,
              *std::min_element(bare.begin(), bare.end()) * 1e3);
  std::printf("  step, recorder       median %8.2f ms   (min %.2f)\n", t_rec * 1e3,
              *std::min_element(recorded.begin(), recorded.end()) * 1e3);
  std::printf(
      "  ratio (recorded / bare), median of rounds %.4f   target <= %.2f"
      "   (ratio of the medians %.4f)\n",
      ratio, kTarget, t_rec / t_bare);
  std::printf("  events per step %.0f; alloc+free pair %.1f ns bare, %.1f ns recorded\n",
              events_per_step, ns_bare, ns_rec);
  std::printf("  estimated ratio from the listener's cost %.4f\n", estimate);
  const bool pass = ratio <= kTarget;
  std::printf("%s: recording overhead %.2f%% (target <= %.0f%%)\n", pass ? "PASS" : "FAIL",
              (ratio - 1.0) * 100.0, (kTarget - 1.0) * 100.0);
  return pass ? 0 : 1;
}
