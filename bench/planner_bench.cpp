// Planning time: gpt2-xl (48 blocks) on h100-80g with every combination (f32/f16/bf16 x
// none/all/sqrt/optimal x offload off/on = 24), in max-batch mode and in throughput mode, and the
// time of one dry run, against the target (plan <= 1 s).
//
//   build/bench/planner_bench [model] [device] [--threads N] [--repeat R]
//
// Printed: wall seconds per plan (best of R, and the spread: median and worst of the R), dry
// runs taken, seconds per dry run (the plan's wall time over its dry runs, and one dry run
// timed alone at the recommended micro-batch), and the ratio of the best to the 1 s target
// (<= 1.00 passes). On a shared machine the spread says how far to trust the best.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "memory/size.h"
#include "policies/dry_run.h"
#include "policies/planner.h"

namespace {

using namespace memfit;
using Clock = std::chrono::steady_clock;

constexpr double kTargetSeconds = 1.0;  // issue 4: "gpt2-xl with every combination <= 1 s"

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "gpt2-xl", device = "h100-80g";
  int threads = 0, repeat = 3, positional = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (positional == 0) {
      model = argv[i], ++positional;
    } else {
      device = argv[i], ++positional;
    }
  }
  PlannerOptions o;
  o.spec = ModelSpec::load(model);
  o.device = DeviceSpec::load(device);
  o.threads = threads;
  std::printf("planner_bench: %s on %s, budget %s, %zu combinations, threads %s\n", model.c_str(),
              device.c_str(), format_bytes(o.device.usable_bytes()).c_str(),
              o.dtypes.size() * o.checkpoints.size() * o.offloads.size(),
              threads ? std::to_string(threads).c_str() : "all CPUs");
  std::printf("%-26s %10s %15s %9s %12s %9s  %s\n", "mode", "seconds", "(median, max)", "dry runs",
              "s/dry run", "ratio", "recommended");
  bool pass = true;
  PlanResult last;
  for (const std::int64_t global : {std::int64_t{0}, std::int64_t{512}}) {
    o.global_batch = global;
    std::vector<double> times;
    for (int r = 0; r < repeat; ++r) {
      const auto t0 = Clock::now();
      last = plan(o);
      times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    const double best = times.front();
    const double ratio = best / kTargetSeconds;
    pass = pass && ratio <= 1.0;
    const std::string mode = global ? "throughput (global 512)" : "max-batch";
    char spread[64];
    std::snprintf(spread, sizeof spread, "(%.3f, %.3f)", times[times.size() / 2], times.back());
    std::printf("%-26s %10.3f %15s %9lld %12.4f %9.2f  %s\n", mode.c_str(), best, spread,
                static_cast<long long>(last.dry_runs),
                best / double(std::max<std::int64_t>(1, last.dry_runs)), ratio,
                last.recommended.describe().c_str());
  }
  // One dry run alone, single-threaded, at the recommended plan of the last mode (at most two
  // micro-batches of it).
  RunSpec q = last.recommended.run_spec();
  const std::int64_t micro = q.trainer.policy.micro_batch;
  q.batch = std::min<std::int64_t>(q.batch, 2 * micro);
  q.alloc.budget = o.device.usable_bytes();
  double one = 1e30;
  for (int r = 0; r < std::max(3, repeat); ++r) {
    const auto t0 = Clock::now();
    (void)dry_run(q);
    one = std::min(one, seconds_since(t0));
  }
  std::printf("one dry run (micro %lld, %lld micro-batches, %d blocks): %.4f s = %.3f ms/block\n",
              static_cast<long long>(micro), static_cast<long long>((q.batch + micro - 1) / micro),
              static_cast<int>(o.spec.layers), one, 1e3 * one / double(o.spec.layers));
  std::printf("%s: planning %s the %.1f s target\n", pass ? "PASS" : "FAIL",
              pass ? "within" : "over", kTargetSeconds);
  return 0;
}
