// CpuRates: this machine's CPU backend, measured op by op, so the planner predicts CPU step
// times from what this CPU does rather than from a preset's peak figures.
//
//   std::shared_ptr<const CpuRates> r = CpuRates::cached(&note);   // measures once per machine
//   RunSpec run = ...;  run.op_rates = r->op_rates();                // dry_run prices its ops
//   DeviceSpec d = r->apply(DeviceSpec::preset("cpu"));             // cpu_adamw, host_link, ...
//
// What is measured (CpuBackend on host memory, the OpenMP threads of this process, each op
// timed as the median of a few calls after a warm-up; about 2 s in all):
// - GEMM at four sizes (M = 16N, K = N for N = 32 ... 256: 1 MFLOP to 537 MFLOP a call) in the
//   three forms a linear layer issues (x W^T, dy W, dy^T x), per dtype: OpRates' GEMM curve.
// - The elementwise and row-wise ops a transformer step issues (layernorm, RMSNorm, GELU,
//   SwiGLU, add, bias add and its backward, flash attention forward and backward, embedding,
//   cross-entropy, copy, fill, cast, axpy, scale, sumsq, AdamW), each at a small and a large
//   size per dtype: per_call and rate of OpRates::Rate from the two, in the work MetaBackend
//   counts for the same call (it runs on a MetaBackend too). Ops not measured (rope, q/k
//   norm, materialized softmax, head permutes, conv2d) take the copy bandwidth.
// - memcpy bandwidth (bytes/s; "host_link" of the CPU device, where offload copies are
//   memcpy) and the CPU AdamW's parameters/s (CostModel::cpu_adamw_rate).
// - OpRates::scale and per_op, how a real step differs from its ops priced by the above: real
//   steps of gpt-tiny at micro-batch 1 and 8, f32 and bf16 (cpu_rates.cpp, calibrate()).
// The cache: one YAML file per key in $MEMFIT_CACHE_DIR, else $XDG_CACHE_HOME/memfit, else
// $HOME/.cache/memfit (cpu-rates-<hash of the key>.yaml). The key is the CPU model
// (/proc/cpuinfo's "model name"), the OpenMP thread count, memfit's version and build, and
// the CPU GEMM engine this process uses; a file whose key differs, or that does not parse, is
// measured again and rewritten (atomically: a temporary file renamed).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/meta/op_rates.h"
#include "policies/device_spec.h"
#include "policies/dry_run.h"
#include "policies/run_spec.h"

namespace memfit {

struct CpuRates {
  std::string key;          // what the rates are valid for (see above)
  OpRates ops;              // ops.bandwidth = copy
  double copy = 0;          // memcpy bytes/s
  double adamw = 0;         // CPU AdamW parameters/s
  double measure_seconds = 0;  // how long measure() took
  // The share of measure()'s thread time spent waiting for a core that another process held
  // (Linux's per-thread run delay over measure_seconds x OpenMP threads); -1: unknown. Near 0
  // on a quiet machine; above kContended the rates are slower than this CPU is, and the
  // cached() note says so (the file is kept: plans stay reproducible until `--measure`).
  double contention = -1;
  static constexpr double kContended = 0.05;

  static std::string this_key();
  static CpuRates measure();
  // The cached rates for this_key(), measured and saved when missing, stale or unreadable
  // (`note`, if given, says which: "measured in 2.1 s, saved to PATH", "from PATH", or why
  // the cache could not be written, and warns when the rates were measured contended). `remeasure`: measure and save whatever is cached.
  // `measure_fn` stands in for measure() (tests).
  static std::shared_ptr<const CpuRates> cached(std::string* note = nullptr,
                                                bool remeasure = false,
                                                CpuRates (*measure_fn)() = &CpuRates::measure);
  static std::string cache_path();

  std::shared_ptr<const OpRates> op_rates() const { return std::make_shared<OpRates>(ops); }
  // Predicted seconds of one step of `run` on this CPU: `dry` (dry_run of `run` with
  // run.op_rates = op_rates(); its compute_seconds price every backend op, the transfers of
  // offload included: on the CPU backend they are copies that take the cores as compute does)
  // plus what runs outside the backend: optimizer offload's host AdamW over every parameter.
  double step_seconds(const RunSpec& run, const DryRunResult& dry) const;
  // The same, dry-running `run` (one step) with these rates.
  double step_seconds(RunSpec run) const;
  // `d` with this machine's host_link (copy), cpu_adamw and per-dtype flops (the GEMM rate at
  // 537 MFLOP a call) and mem_bandwidth (copy); d must be a kind-cpu device.
  DeviceSpec apply(DeviceSpec d) const;

  std::string to_yaml() const;
  // ConfigError naming `source`, the line and the key when the text is not a rates file.
  static CpuRates from_yaml(std::string_view text, std::string_view source);
};

}  // namespace memfit
