// Offload switches on the CPU backend: the step time with each offload switch against the
// on-device step at the same dtype, checkpointing and batch, and what each switch's transfers
// add that the overlap does not hide (exposed time = this variant's step - the step of the
// variant without that switch; for the optimizer's switch that includes the CPU AdamW, shown
// apart). RunSetup builds what `memfit train` trains on: a CpuBackend with worker streams when
// anything is offloaded (every copy stream a thread of its own, so the copies really overlap
// the compute), the budgeted CachingAllocator, and mlock'd pinned memory.
//
// Variants (bf16, checkpoint all unless --checkpoint): off; optimizer; optimizer + gradients;
// optimizer + weights; optimizer + gradients + weights; activations (the checkpoints to the host
// and back, alone); all four. The GPU twin of this table is in
// bench/gpu_step_bench.cpp (GPT-2 124M, batch 8, seq 1024; its target: <= 1.15x with gradients
// and optimizer offloaded).
// Fixed work: --warmup untimed steps, then --steps timed ones (median); losses must agree
// across variants (offload is bit-identical), which the bench checks and prints.
//
//   ./build/bench/offload_switch_bench                       # gpt-tiny, batch 8, 3 steps
//   ./build/bench/offload_switch_bench --model gpt-tiny --batch 16 --steps 5 --accum 4
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "memory/size.h"
#include "policies/offload_optimizer.h"
#include "policies/run_setup.h"

namespace memfit {
namespace {

struct Args {
  std::string model = "gpt-tiny";
  std::string checkpoint = "all";
  std::int64_t batch = 8, accum = 1;
  int steps = 3, warmup = 1;
};

struct Variant {
  const char* name;
  OffloadSwitches off;
  int base;  // the variant without this one's last switch (-1: none)
};

struct Result {
  bool ok = false;
  std::string error;
  double step_s = 0, adamw_s = 0, wait_grads_s = 0;
  std::vector<double> losses;
  std::size_t allocated = 0, reserved = 0, host = 0;
};

Batch make_batch(std::int64_t b, std::int64_t t, std::int64_t vocab) {
  Batch out;
  out.batch = b;
  out.seq_len = t;
  std::uint32_t x = 2024u;
  for (std::int64_t i = 0; i < b * t; ++i) {
    x = x * 1664525u + 1013904223u;
    out.tokens.push_back(static_cast<std::int32_t>((x >> 8) % static_cast<std::uint32_t>(vocab)));
    out.targets.push_back(static_cast<std::int32_t>((x >> 3) % static_cast<std::uint32_t>(vocab)));
  }
  return out;
}

Result run(const Variant& v, const Args& a, const ModelSpec& spec, const Batch& batch) {
  Result r;
  try {
    RunSpec rs;
    rs.model = spec;
    rs.trainer.policy.dtype = DType::kBF16;
    rs.trainer.policy.checkpoint =
        Checkpointing::parse(a.checkpoint, static_cast<int>(spec.layers));
    rs.trainer.policy.offload = v.off;
    if (a.accum > 1) rs.trainer.policy.accum = a.accum;
    rs.trainer.adamw.lr = 1e-3;
    rs.batch = batch.batch;
    rs.seq_len = batch.seq_len;
    RunSetup run(rs);
    std::vector<double> secs;
    for (int i = 0; i < a.warmup + a.steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const StepResult s = run.step(batch);
      run.backend().synchronize(kDefaultStream);
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.losses.push_back(s.loss);
      if (i < a.warmup) continue;
      secs.push_back(dt);
      r.allocated = std::max(r.allocated, s.peaks.allocated);
      r.reserved = std::max(r.reserved, s.peaks.reserved);
      r.host = s.peaks.host_pinned;
      if (v.off.optimizer) {
        const auto t = dynamic_cast<OffloadOptimizer&>(run.trainer().optimizer()).last_timing();
        r.adamw_s += t.adamw_s / a.steps;
        r.wait_grads_s += t.wait_grads_s / a.steps;
      }
    }
    std::sort(secs.begin(), secs.end());
    r.step_s = secs[secs.size() / 2];
    r.ok = true;
  } catch (const std::exception& e) {
    r.error = e.what();
    const std::size_t nl = r.error.find('\n');
    if (nl != std::string::npos) r.error.resize(nl);
  }
  return r;
}

int bench_main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const bool has = i + 1 < argc;
    if (s == "--model" && has) {
      a.model = argv[++i];
    } else if (s == "--checkpoint" && has) {
      a.checkpoint = argv[++i];
    } else if (s == "--batch" && has) {
      a.batch = std::atoll(argv[++i]);
    } else if (s == "--accum" && has) {
      a.accum = std::atoll(argv[++i]);
    } else if (s == "--steps" && has) {
      a.steps = std::atoi(argv[++i]);
    } else if (s == "--warmup" && has) {
      a.warmup = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--model NAME] [--checkpoint none|all|every:K] [--batch N] "
                   "[--accum K] [--steps N] [--warmup W]\n",
                   argv[0]);
      return 2;
    }
  }
  if (a.batch < 1 || a.accum < 1 || a.batch % a.accum != 0 || a.steps < 1 || a.warmup < 0) {
    std::fprintf(stderr,
                 "--batch, --accum, --steps >= 1, --accum dividing --batch, --warmup >= 0\n");
    return 2;
  }
  const ModelSpec spec = ModelSpec::load(a.model);
  const Batch batch = make_batch(a.batch, spec.seq_len, spec.vocab);
  const std::vector<Variant> variants = {
      {"off", {}, -1},
      {"optimizer", {.optimizer = true}, 0},
      {"opt+grads", {.optimizer = true, .gradients = true}, 1},
      {"opt+weights", {.optimizer = true, .weights = true}, 1},
      {"opt+grads+weights", {.optimizer = true, .gradients = true, .weights = true}, 2},
      {"activations", {.activations = true}, 0},
      {"all", {.optimizer = true, .gradients = true, .weights = true, .activations = true}, 4},
  };
  std::printf(
      "offload_switch_bench: %s (%lld parameters), bf16, checkpoint %s, batch %lld x %lld "
      "(%lld micro-batches), CPU backend with worker streams; median of %d steps after %d\n",
      spec.name.c_str(), static_cast<long long>(spec.parameter_count()), a.checkpoint.c_str(),
      static_cast<long long>(a.batch), static_cast<long long>(spec.seq_len),
      static_cast<long long>(a.accum), a.steps, a.warmup);
  std::printf("%-18s %8s %7s %10s %9s %9s | %10s %10s %10s\n", "offload", "step_s", "vs off",
              "exposed_s", "adamw_s", "wait_g_s", "allocated", "reserved", "host");
  std::vector<Result> res;
  bool same = true;
  for (const Variant& v : variants) {
    res.push_back(run(v, a, spec, batch));
    const Result& r = res.back();
    if (!r.ok) {
      std::printf("%-18s error: %s\n", v.name, r.error.c_str());
      continue;
    }
    const Result* off = res[0].ok ? &res[0] : nullptr;
    const Result* base = v.base >= 0 && res[static_cast<std::size_t>(v.base)].ok
                             ? &res[static_cast<std::size_t>(v.base)]
                             : nullptr;
    if (off) same = same && r.losses == off->losses;
    std::printf("%-18s %8.3f %6.2fx %10.3f %9.3f %9.3f | %10s %10s %10s\n", v.name, r.step_s,
                off ? r.step_s / off->step_s : 0.0, base ? r.step_s - base->step_s : 0.0, r.adamw_s,
                r.wait_grads_s, format_bytes(r.allocated).c_str(), format_bytes(r.reserved).c_str(),
                format_bytes(r.host).c_str());
    std::fflush(stdout);
  }
  std::printf(
      "exposed_s: this step - the step without its last switch (optimizer and activations: vs "
      "off, CPU AdamW included for the optimizer; grads and weights: vs optimizer; "
      "opt+grads+weights: vs opt+grads; all: vs opt+grads+weights)\n");
  std::printf("losses identical across variants (offload is bit-identical): %s\n",
              same ? "yes" : "NO");
  return same ? 0 : 1;
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) { return memfit::bench_main(argc, argv); }
