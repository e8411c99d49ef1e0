#include "policies/device_rates.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "memory/error.h"
#include "memory/pinned_host_provider.h"
#include "memory/size.h"
#include "policies/runtime_env.h"

namespace memfit {

namespace {

using Clock = std::chrono::steady_clock;

void check_options(const DeviceRatesOptions& o) {
  const auto bad = [](const std::string& what) {
    throw InvalidArgument("measure_device_rates: DeviceRatesOptions." + what);
  };
  if (o.gemm_size < 1) {
    bad("gemm_size " + std::to_string(o.gemm_size) +
        "; valid: 1 or more (M = N = K of the 16-bit GEMMs)");
  }
  if (o.gemm_size_f32 < 1) {
    bad("gemm_size_f32 " + std::to_string(o.gemm_size_f32) +
        "; valid: 1 or more (M = N = K of the f32 GEMM)");
  }
  if (o.copy_bytes < 4 || o.copy_bytes % 4 != 0) {
    bad("copy_bytes " + std::to_string(o.copy_bytes) +
        "; valid: a positive multiple of 4 (bytes of each copy, copied as f32)");
  }
  if (o.reps < 1) {
    bad("reps " + std::to_string(o.reps) + "; valid: 1 or more (timed samples per figure)");
  }
  if (o.warmup < 0) {
    bad("warmup " + std::to_string(o.warmup) + "; valid: 0 or more (untimed samples first)");
  }
}

// The median of `reps` samples of `work` after `warmup` untimed ones, each timed from a
// synchronize of the stream to the synchronize after it.
double median_seconds(Backend& b, const DeviceRatesOptions& o, const char* what,
                      const std::function<void()>& work) {
  for (int i = 0; i < o.warmup; ++i) {
    work();
    b.synchronize(kDefaultStream);
  }
  std::vector<double> secs;
  secs.reserve(static_cast<std::size_t>(o.reps));
  for (int i = 0; i < o.reps; ++i) {
    b.synchronize(kDefaultStream);
    const Clock::time_point t0 = Clock::now();
    work();
    b.synchronize(kDefaultStream);
    secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(secs.begin(), secs.end());
  const std::size_t n = secs.size();
  const double m = n % 2 == 1 ? secs[n / 2] : 0.5 * (secs[n / 2 - 1] + secs[n / 2]);
  if (!(m > 0)) {
    throw InvalidArgument(std::string("measure_device_rates: ") + what +
                          " took no measurable time; valid: larger sizes");
  }
  return m;
}

double gemm_rate(Backend& b, CachingAllocator& alloc, DType dt, std::int64_t n,
                 const DeviceRatesOptions& o) {
  const Device dev = b.device();
  // a (n,n) b (n,n) -> c = a @ b^T (n,n)
  OwnedTensor a = OwnedTensor::empty(alloc, {n, n}, dt, dev, Category::kTemporary, kDefaultStream,
                                     "device_rates.gemm.a");
  OwnedTensor w = OwnedTensor::empty(alloc, {n, n}, dt, dev, Category::kTemporary, kDefaultStream,
                                     "device_rates.gemm.b");
  OwnedTensor c = OwnedTensor::empty(alloc, {n, n}, dt, dev, Category::kTemporary, kDefaultStream,
                                     "device_rates.gemm.c");
  // Finite, normal inputs (uninitialized memory may hold subnormals, which a CPU runs slowly);
  // c stays small enough for f16 (n * 2^-10 for n up to 2^16).
  b.fill(kDefaultStream, a, 1.0f / 32);
  b.fill(kDefaultStream, w, 1.0f / 32);
  GemmDesc d;
  d.m = n;
  d.n = n;
  d.k = n;
  d.trans_b = true;
  const std::string what = std::string("the ") + dtype_name(dt) + " GEMM";
  const double s = median_seconds(b, o, what.c_str(), [&] { b.gemm(kDefaultStream, d, a, w, c); });
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / s;
}

}  // namespace

MeasuredRates measure_device_rates(Backend& b, CachingAllocator& device_alloc,
                                   CachingAllocator& host_alloc, const DeviceRatesOptions& o) {
  check_options(o);
  if (b.device() == Device::kMeta) {
    throw InvalidArgument(
        "measure_device_rates: backend meta does no work to time; valid: cpu or cuda");
  }
  const Clock::time_point start = Clock::now();
  // The host buffer first: an allocator that cannot serve it fails before seconds of GEMMs.
  const std::int64_t elems = o.copy_bytes / 4;
  OwnedTensor host = OwnedTensor::empty(host_alloc, {elems}, DType::kF32, Device::kCpu,
                                        Category::kTemporary, kDefaultStream, "device_rates.host");
  MeasuredRates r;
  r.flops_f32 = gemm_rate(b, device_alloc, DType::kF32, o.gemm_size_f32, o);
  r.flops_f16 = gemm_rate(b, device_alloc, DType::kF16, o.gemm_size, o);
  r.flops_bf16 = gemm_rate(b, device_alloc, DType::kBF16, o.gemm_size, o);

  const double bytes = static_cast<double>(o.copy_bytes);
  OwnedTensor src = OwnedTensor::empty(device_alloc, {elems}, DType::kF32, b.device(),
                                       Category::kTemporary, kDefaultStream, "device_rates.src");
  {
    OwnedTensor dst = OwnedTensor::empty(device_alloc, {elems}, DType::kF32, b.device(),
                                         Category::kTemporary, kDefaultStream, "device_rates.dst");
    b.fill(kDefaultStream, src, 1.0f);
    const double s = median_seconds(b, o, "the device copy", [&] {
      for (int i = 0; i < kDeviceCopiesPerSample; ++i) b.copy(kDefaultStream, src, dst);
    });
    r.mem_bandwidth = 2.0 * bytes * kDeviceCopiesPerSample / s;  // read + write
  }
  r.device_to_host = bytes / median_seconds(b, o, "the device-to-host copy",
                                            [&] { b.copy(kDefaultStream, src, host); });
  r.host_to_device = bytes / median_seconds(b, o, "the host-to-device copy",
                                            [&] { b.copy(kDefaultStream, host, src); });
  r.host_link = std::min(r.host_to_device, r.device_to_host);
  b.synchronize(kDefaultStream);  // before the blocks go back to their allocators
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

DeviceSpec apply_measured(DeviceSpec d, const MeasuredRates& r) {
  const auto take = [&](const char* key, double v, double& into) {
    // The range DeviceSpec's YAML reader accepts, so the written file loads.
    if (!std::isfinite(v) || v < 1 || v > 1e21) {
      throw InvalidArgument(std::string("apply_measured: ") + key + " = " + std::to_string(v) +
                            " for device '" + d.name + "'; valid: 1 to 1e21 per second");
    }
    into = v;
  };
  take("flops_f32", r.flops_f32, d.flops_f32);
  take("flops_f16", r.flops_f16, d.flops_f16);
  take("flops_bf16", r.flops_bf16, d.flops_bf16);
  take("mem_bandwidth", r.mem_bandwidth, d.mem_bandwidth);
  take("host_link", r.host_link, d.host_link);
  return d;
}

std::vector<MeasuredFigure> MeasuredDevice::figures() const {
  return {
      {"flops_f32", measured.flops_f32, file.flops_f32, false},
      {"flops_f16", measured.flops_f16, file.flops_f16, false},
      {"flops_bf16", measured.flops_bf16, file.flops_bf16, false},
      {"mem_bandwidth", measured.mem_bandwidth, file.mem_bandwidth, false},
      {"host_link", measured.host_link, file.host_link, false},
      {"context", static_cast<double>(measured.context_bytes),
       static_cast<double>(file.context_bytes), true},
  };
}

std::string MeasuredDevice::to_yaml() const {
  const auto g = [](double v) {  // 4 significant digits: a comment, not the figure itself
    char b[32];
    std::snprintf(b, sizeof b, "%.4g", v);
    return std::string(b);
  };
  const auto pad = [](std::string t, std::size_t w) {
    if (t.size() < w) t.resize(w, ' ');
    return t;
  };
  // The name goes in comments: a line break in it (a quoted YAML name may hold one) would end
  // the comment and break the file.
  std::string name = file.name;
  std::replace_if(
      name.begin(), name.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", rates.seconds);
  std::string s = "# " + name +
                  " measured on this machine's GPU by `memfit plan --measure` "
                  "(policies/device_rates.h).\n# GEMMs of " +
                  std::to_string(options.gemm_size) + "^3 (f16, bf16) and " +
                  std::to_string(options.gemm_size_f32) + "^3 (f32, no TF32); copies of " +
                  format_bytes(static_cast<std::size_t>(options.copy_bytes)) +
                  " device to device\n# and pinned host each way (host_link: the slower); each "
                  "figure the median of " +
                  std::to_string(options.reps) + " after " + std::to_string(options.warmup) +
                  "\n# warm-up, " + secs +
                  " s in all. context: what the CUDA context and the cuBLASLt/cuDNN handles\n"
                  "# took. The other figures are the file's.\n";
  s += "#   " + pad("figure", 15) + pad("measured", 13) + pad(name + "'s", 13) + "ratio\n";
  for (const MeasuredFigure& f : figures()) {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2f", f.ratio());
    const auto shown = [&](double v) {
      return f.bytes ? format_bytes(static_cast<std::size_t>(v)) : g(v);
    };
    s += "#   " + pad(f.key, 15) + pad(shown(f.measured), 13) + pad(shown(f.file), 13) + ratio +
         "\n";
  }
  s += "#   (host to device " + g(rates.host_to_device) + " B/s, device to host " +
       g(rates.device_to_host) + " B/s)\n";
  return s + measured.to_yaml();
}

MeasuredDevice measure_cuda_device(const DeviceSpec& file, const DeviceRatesOptions& options) {
  if (file.kind != DeviceKind::kCuda) {
    throw InvalidArgument("measure_cuda_device: device '" + file.name + "' is kind " +
                          device_kind_name(file.kind) + "; valid: a kind-cuda device");
  }
  std::string why;
  if (!cuda_runtime_available(&why)) {
    throw InvalidArgument("measure_cuda_device: " + why + "; valid: a machine with a GPU");
  }
  RuntimeEnv env = make_runtime(DeviceKind::kCuda, AllocatorConfig{});
  PinnedHostProvider pinned;  // cudaHostAlloc with a usable device
  // Declared after env: destroyed before the backend whose stream_sync it uses.
  CachingAllocator host(pinned, {}, &env.backend->stream_sync());
  MeasuredDevice m;
  m.file = file;
  m.options = options;
  m.device_total_bytes = env.device_total_bytes;
  m.rates = measure_device_rates(*env.backend, *env.alloc, host, options);
  m.measured = apply_measured(file, m.rates);
  if (env.context_bytes >= file.memory_bytes) {
    throw InvalidArgument("measure_cuda_device: the context measured here (" +
                          format_bytes(env.context_bytes) + ") leaves nothing of " + file.name +
                          "'s memory (" + format_bytes(file.memory_bytes) +
                          "); valid: a device file for this GPU");
  }
  m.measured.context_bytes = env.context_bytes;
  return m;
}

}  // namespace memfit
