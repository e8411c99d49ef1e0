// GPT-2 124M training steps on one GPU: step time, tokens/s and peak memory for f32, bf16,
// bf16 + checkpoint all, bf16 + checkpoint all + offload (and the same with ZeRO-Offload's
// delayed update, with gradient offload, with weight offload, and with all four switches),
// bf16 + checkpoint all + activation offload alone, at seq 1024 and
// batch 8; each offload step against the on-device optimizer step at equal settings (the
// targets: <= 1.15x with the optimizer offloaded, and <= 1.15x with its gradients too), and
// each switch's exposed time (its step - the step without that switch).
//
//   build/bench/gpu_step_bench                  # the table, then one JSON line
//   MEMFIT_BENCH_STEPS=10 MEMFIT_BENCH_BATCH=4 build/bench/gpu_step_bench
//
// Fixed work per variant: 2 warm-up steps (cuBLASLt plans, allocator segments, pinned slabs),
// then MEMFIT_BENCH_STEPS timed steps (default 5), each ended by a stream synchronize; the step
// time is their median, tokens/s is batch * seq / median. Peaks are the allocator's over each
// timed step (StepResult: reset at the start of the step, so parameters, gradients and
// optimizer state are in them, as in torch.cuda.max_memory_allocated after a reset).
// The anchor is bench/torch_gpu_step.py on the same GPU (tests/gpu/run.sh prints both side by
// side); the JSON keys are the same.
// Without a CUDA device (or in a build without the CUDA backend) it prints
// "SKIP: no CUDA device: <why>" and exits 0.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#if MEMFIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda/cuda_backend.h"
#include "core/model.h"
#include "memory/alloc_conf.h"
#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_provider.h"
#include "memory/error.h"
#include "memory/size.h"
#include "policies/offload_optimizer.h"
#include "policies/run_setup.h"
#include "policies/trainer.h"
#endif

#if !MEMFIT_HAVE_CUDA
int main() {
  std::printf("SKIP: no CUDA device: this build has no CUDA backend (configure -DMEMFIT_CUDA=ON)\n");
  return 0;
}
#else

namespace memfit {
namespace {

long env_int(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x <= 0) {
    std::fprintf(stderr, "%s='%s': valid is a positive integer; using %ld\n", name, v, fallback);
    return fallback;
  }
  return x;
}

struct Variant {
  const char* name;
  DType dtype;
  const char* checkpoint;
  bool offload;
  bool delayed;
  bool grads = false;
  bool weights = false;
  bool acts = false;  // activation offload (the checkpoints to the host and back)
};

struct Result {
  std::string name;
  bool ok = false;
  std::string error;
  double step_ms = 0, tokens_per_s = 0, loss = 0;
  std::size_t peak_allocated = 0, peak_reserved = 0;
  double wait_grads_ms = 0, adamw_ms = 0;  // offload: the last step's host-side timing
};

Batch make_batch(std::int64_t b, std::int64_t t, std::int64_t vocab) {
  Batch out;
  out.batch = b;
  out.seq_len = t;
  std::uint32_t x = 12345u;
  for (std::int64_t i = 0; i < b * t; ++i) {
    x = x * 1664525u + 1013904223u;
    out.tokens.push_back(static_cast<std::int32_t>((x >> 8) % static_cast<std::uint32_t>(vocab)));
    out.targets.push_back(
        static_cast<std::int32_t>((x >> 3) % static_cast<std::uint32_t>(vocab)));
  }
  return out;
}

Result run(const Variant& v, const ModelSpec& spec, const Batch& batch, int warmup, int steps) {
  Result r;
  r.name = v.name;
  try {
    // RunSetup: what `memfit train --backend cuda` trains on (CudaBackend, CudaProvider, the
    // cuBLASLt workspace from the budgeted allocator, pinned host memory for offload).
    RunSpec rs;
    rs.model = spec;
    rs.trainer.policy.dtype = v.dtype;
    rs.trainer.policy.checkpoint =
        Checkpointing::parse(v.checkpoint, static_cast<int>(spec.layers));
    rs.trainer.policy.offload.optimizer = v.offload;
    rs.trainer.policy.offload.delayed_update = v.delayed;
    rs.trainer.policy.offload.gradients = v.grads;
    rs.trainer.policy.offload.weights = v.weights;
    rs.trainer.policy.offload.activations = v.acts;
    rs.trainer.adamw.lr = 3e-4;
    rs.batch = batch.batch;
    rs.seq_len = batch.seq_len;
    rs.alloc = alloc_conf_from_env();
    rs.device = DeviceKind::kCuda;
    RunSetup run(rs);
    Backend& be = run.backend();
    std::vector<double> ms;
    for (int i = 0; i < warmup + steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const StepResult s = run.step(batch);
      be.synchronize(kDefaultStream);
      const double dt =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i < warmup) continue;
      ms.push_back(dt);
      r.loss = s.loss;
      r.peak_allocated = std::max(r.peak_allocated, s.peaks.allocated);
      r.peak_reserved = std::max(r.peak_reserved, s.peaks.reserved);
    }
    if (v.offload) {
      run.trainer().optimizer().flush(run.context());
      const OffloadOptimizer::Timing t =
          static_cast<OffloadOptimizer&>(run.trainer().optimizer()).last_timing();
      r.wait_grads_ms = 1e3 * t.wait_grads_s;
      r.adamw_ms = 1e3 * t.adamw_s;
    }
    std::sort(ms.begin(), ms.end());
    r.step_ms = ms[ms.size() / 2];
    r.tokens_per_s = double(batch.batch * batch.seq_len) / (r.step_ms / 1e3);
    r.ok = true;
    be.synchronize(kDefaultStream);
  } catch (const std::exception& e) {
    r.error = e.what();
    const std::size_t nl = r.error.find('\n');
    if (nl != std::string::npos) r.error.resize(nl);
  }
  return r;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o;
}

int bench_main() {
  std::string why;
  if (CudaProvider::cuda_device_count(&why) == 0) {
    std::printf("SKIP: no CUDA device: %s\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) std::snprintf(prop.name, 8, "?");
  const int steps = static_cast<int>(env_int("MEMFIT_BENCH_STEPS", 5));
  const int warmup = 2;
  const std::int64_t batch_size = env_int("MEMFIT_BENCH_BATCH", 8);
  ModelSpec spec = ModelSpec::preset("gpt2");
  const std::int64_t seq = std::min<std::int64_t>(env_int("MEMFIT_BENCH_SEQ", 1024), spec.seq_len);
  const Batch batch = make_batch(batch_size, seq, spec.vocab);

  const std::vector<Variant> variants = {
      {"f32", DType::kF32, "none", false, false},
      {"bf16", DType::kBF16, "none", false, false},
      {"bf16+ckpt", DType::kBF16, "all", false, false},
      {"bf16+ckpt+offload", DType::kBF16, "all", true, false},
      {"bf16+ckpt+offload+dpu", DType::kBF16, "all", true, true},
      {"bf16+ckpt+offload+grads", DType::kBF16, "all", true, false, true, false},
      {"bf16+ckpt+offload+weights", DType::kBF16, "all", true, false, false, true},
      {"bf16+ckpt+acts", DType::kBF16, "all", false, false, false, false, true},
      {"bf16+ckpt+offload+all", DType::kBF16, "all", true, false, true, true, true},
  };
  std::printf("gpu_step_bench: %s (%lld parameters), seq %lld, batch %lld on %s; median of %d "
              "steps after %d warm-up\n",
              spec.name.c_str(), static_cast<long long>(spec.parameter_count()),
              static_cast<long long>(seq), static_cast<long long>(batch_size), prop.name, steps,
              warmup);
  std::fflush(stdout);
  std::vector<Result> results;
  for (const Variant& v : variants) {
    results.push_back(run(v, spec, batch, warmup, steps));
    const Result& r = results.back();
    if (!r.ok) {
      std::printf("  %-24s FAILED: %s\n", r.name.c_str(), r.error.c_str());
    } else {
      std::printf("  %-24s %9.1f ms %11.0f tok/s  peak alloc %10s  reserved %10s  loss %.4f",
                  r.name.c_str(), r.step_ms, r.tokens_per_s, format_bytes(r.peak_allocated).c_str(),
                  format_bytes(r.peak_reserved).c_str(), r.loss);
      if (r.adamw_ms > 0) {
        std::printf("  (cpu adamw %.1f ms, grad wait %.1f ms)", r.adamw_ms, r.wait_grads_ms);
      }
      std::printf("\n");
      // tests/gpu/run.sh lists "figure:" lines under its table.
      std::printf("figure: gpt2 step %s: %.1f ms, %.0f tok/s, peak allocated %s\n", r.name.c_str(),
                  r.step_ms, r.tokens_per_s, format_bytes(r.peak_allocated).c_str());
    }
    std::fflush(stdout);
  }
  // Offload against the on-device optimizer at equal batch and checkpointing.
  auto find = [&](const char* n) -> const Result* {
    for (const Result& r : results) {
      if (r.name == n && r.ok) return &r;
    }
    return nullptr;
  };
  const Result* dev = find("bf16+ckpt");
  const Result* off = find("bf16+ckpt+offload");
  const Result* dpu = find("bf16+ckpt+offload+dpu");
  double ratio = 0, ratio_dpu = 0;
  if (dev && off) ratio = off->step_ms / dev->step_ms;
  if (dev && dpu) ratio_dpu = dpu->step_ms / dev->step_ms;
  std::printf("offload / on-device optimizer step: %.2fx (target <= 1.15x: %s); with delayed "
              "update %.2fx\n",
              ratio, ratio > 0 && ratio <= 1.15 ? "met" : "NOT met", ratio_dpu);
  std::printf("figure: gpt2 offload / on-device optimizer step: %.2fx (dpu %.2fx)\n", ratio,
              ratio_dpu);
  // Each further switch: its step against the on-device one, and what it adds over the
  // optimizer's offload alone (the transfer time its overlap does not hide).
  double ratio_grads = 0;
  for (const char* n :
       {"bf16+ckpt+offload+grads", "bf16+ckpt+offload+weights", "bf16+ckpt+offload+all"}) {
    const Result* r = find(n);
    if (!dev || !off || !r) continue;
    const double q = r->step_ms / dev->step_ms;
    if (std::string(n) == "bf16+ckpt+offload+grads") ratio_grads = q;
    std::printf("figure: gpt2 %s / on-device optimizer step: %.2fx, exposed over offload %.1f ms\n",
                n, q, r->step_ms - off->step_ms);
  }
  if (const Result* acts = find("bf16+ckpt+acts"); dev && acts) {
    std::printf("figure: gpt2 bf16+ckpt+acts / bf16+ckpt step: %.2fx, exposed %.1f ms\n",
                acts->step_ms / dev->step_ms, acts->step_ms - dev->step_ms);
  }
  std::printf("gradient + optimizer offload / on-device step: %.2fx (target <= 1.15x: %s)\n",
              ratio_grads, ratio_grads > 0 && ratio_grads <= 1.15 ? "met" : "NOT met");

  std::string j = "{\"bench\":\"gpu_step\",\"impl\":\"memfit\",\"device\":\"" +
                  json_escape(prop.name) + "\",\"model\":\"" + spec.name +
                  "\",\"seq\":" + std::to_string(seq) + ",\"batch\":" + std::to_string(batch_size) +
                  ",\"steps\":" + std::to_string(steps) + ",\"results\":[";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    char buf[512];
    if (r.ok) {
      std::snprintf(buf, sizeof buf,
                    "{\"name\":\"%s\",\"step_ms\":%.3f,\"tokens_per_s\":%.1f,"
                    "\"peak_allocated\":%zu,\"peak_reserved\":%zu,\"loss\":%.5f}",
                    r.name.c_str(), r.step_ms, r.tokens_per_s, r.peak_allocated, r.peak_reserved,
                    r.loss);
    } else {
      std::snprintf(buf, sizeof buf, "{\"name\":\"%s\",\"error\":\"%s\"}", r.name.c_str(),
                    json_escape(r.error).substr(0, 300).c_str());
    }
    j += (i ? "," : "") + std::string(buf);
  }
  char tail[256];
  std::snprintf(tail, sizeof tail,
                "],\"offload_ratio\":%.4f,\"offload_ratio_dpu\":%.4f,"
                "\"offload_grads_ratio\":%.4f,\"offload_target\":1.15}",
                ratio, ratio_dpu, ratio_grads);
  j += tail;
  std::printf("JSON %s\n", j.c_str());
  bool all_ok = true;
  for (const Result& r : results) all_ok = all_ok && r.ok;
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace memfit

int main() { return memfit::bench_main(); }
#endif
