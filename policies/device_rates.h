// DeviceRates: a device's rates measured on the device itself (GEMM flops per dtype, memory
// bandwidth, the pinned host link), so a GPU preset's datasheet figures can be replaced by
// what this GPU does (`memfit plan --measure --device h100-80g` writes them to a device file).
//
//   RuntimeEnv env = make_runtime(DeviceKind::kCuda, {});        // or a CpuBackend (tests)
//   PinnedHostProvider pinned;
//   CachingAllocator host(pinned, {}, &env.backend->stream_sync());
//   MeasuredRates r = measure_device_rates(*env.backend, *env.alloc, host, {});
//   DeviceSpec d = apply_measured(DeviceSpec::preset("h100-80g"), r);  // five figures replaced
//
//   MeasuredDevice m = measure_cuda_device(DeviceSpec::preset("h100-80g"));  // all of the above
//   write_file_atomic("h100-80g-measured.yaml", m.to_yaml());   // loadable by --device FILE
//
// Only the Backend interface (gemm, fill, copy, synchronize on kDefaultStream) and the two
// allocators are used, so the same code measures the CPU backend in tests and CudaBackend for
// real. Each figure is the median of `reps` timed samples after `warmup` untimed ones; a sample
// is timed from a synchronize of the stream to the synchronize after its work:
// - flops_f32/f16/bf16: 2*n^3 / seconds of one square GEMM C = A @ B^T (the Linear layer's
//   form; A, B and C all of that dtype, FP32 accumulation), n = gemm_size (16-bit) or
//   gemm_size_f32. On CUDA, f32 runs without TF32 (CudaBackendOptions' default), as the
//   presets' flops_f32 ("no tensor cores") assume.
// - mem_bandwidth: bytes read plus bytes written per second by device-to-device copies of
//   copy_bytes, i.e. 2 * copy_bytes per copy: the unit of the cost model, which divides the
//   bytes MetaBackend counts (a copy: bytes(src) + bytes(dst)) by mem_bandwidth. A sample is
//   kDeviceCopiesPerSample copies, so the synchronize is a small part of it.
// - host_to_device, device_to_host: copy_bytes / seconds of one copy between pinned host
//   memory and the device, in one direction (device_spec.h's host_link unit: bytes crossing
//   the link, not read + write). host_link is the slower of the two: the cost model prices
//   both directions (gradients and stashed activations out, weights and activations back)
//   with one figure, and the slower one is the one a plan must not underestimate.
// Memory: device 3 * gemm_size_f32^2 * 4 bytes at most at once (the f32 GEMM), then
// 2 * copy_bytes; pinned host copy_bytes throughout. Everything is freed (to the allocators' caches)
// before returning. Defaults are sized for a datacenter GPU (a second or so on an H100, by
// estimate); the CPU backend would take minutes at those sizes, so tests pass small ones.
//
// Errors: InvalidArgument naming the option and what is valid for a bad option (a size < 1,
// copy_bytes not a multiple of 4, reps < 1, warmup < 0), a meta backend (it does no work to
// time), or a sample too short to time. An allocator that does not serve the backend's device
// (device_alloc) or the host (host_alloc) fails in OwnedTensor::empty with its own message: the
// host buffer is taken first, before any GEMM. OutOfMemory from the allocators as usual.
// measure_cuda_device: InvalidArgument without a usable CUDA device (the runtime's reason)
// or for a device spec that is not kind cuda. apply_measured: InvalidArgument when a rate is
// not finite or outside what a device file may hold (1 to 1e21 per second).
// Not thread-safe with other work on the backend's default stream: run it alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "memory/caching_allocator.h"
#include "policies/device_spec.h"

namespace memfit {

struct DeviceRatesOptions {
  std::int64_t gemm_size = 8192;                      // M = N = K of the f16 and bf16 GEMMs
  std::int64_t gemm_size_f32 = 8192;                  // M = N = K of the f32 GEMM
  std::int64_t copy_bytes = std::int64_t{512} << 20;  // each copy, device and host; % 4 == 0
  int reps = 10;   // timed samples per figure (the median is taken)
  int warmup = 2;  // untimed samples first (library set-up, clocks)
};

inline constexpr int kDeviceCopiesPerSample = 8;

struct MeasuredRates {
  double flops_f32 = 0, flops_f16 = 0, flops_bf16 = 0;  // FLOP/s
  double mem_bandwidth = 0;                             // bytes read + written per second
  double host_to_device = 0, device_to_host = 0;        // bytes/s, pinned, one direction
  double host_link = 0;                                 // min(host_to_device, device_to_host)
  double seconds = 0;                                   // wall time of the measurement
};

MeasuredRates measure_device_rates(Backend& backend, CachingAllocator& device_alloc,
                                   CachingAllocator& host_alloc,
                                   const DeviceRatesOptions& options = {});

// `d` with flops_f32, flops_f16, flops_bf16, mem_bandwidth and host_link from `r`; every other
// figure (name, kind, memory, context, rank_link, cpu_adamw) as it was.
DeviceSpec apply_measured(DeviceSpec d, const MeasuredRates& r);

// One measured figure beside the device file's: what `memfit plan --measure` prints and the
// measured file's header comment lists. `bytes`: a size (context), else a rate per second.
struct MeasuredFigure {
  std::string key;  // the device file's key: flops_f32, ..., host_link, context
  double measured = 0;
  double file = 0;  // the figure the loaded device file (preset) had
  bool bytes = false;
  double ratio() const { return file > 0 ? measured / file : 0.0; }
};

// This machine's GPU (the CUDA runtime's device, as make_runtime picks it) measured against a
// loaded device spec: rates as above, and the context (what the CUDA context and the
// backend's library handles take, RuntimeEnv::context_bytes).
struct MeasuredDevice {
  DeviceSpec file;      // as loaded (the preset or file the user named)
  DeviceSpec measured;  // `file` with the five rates and the context replaced
  MeasuredRates rates;
  DeviceRatesOptions options;
  std::size_t device_total_bytes = 0;  // what the runtime reports (the file's memory is kept)

  std::vector<MeasuredFigure> figures() const;  // the five rates, then context
  // measured.to_yaml() under comment lines: what was measured how, each figure beside the
  // file's. DeviceSpec::load reads it back as `measured`.
  std::string to_yaml() const;
};

MeasuredDevice measure_cuda_device(const DeviceSpec& file, const DeviceRatesOptions& options = {});

}  // namespace memfit
