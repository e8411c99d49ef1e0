// CpuRates::measure: this machine's CPU backend op by op (cpu_rates.h).
#include "policies/cpu_rates.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <vector>

#include <omp.h>

#include "core/adamw.h"
#include "core/cpu/cpu_backend.h"
#include "core/meta/meta_backend.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "policies/cost_model.h"
#include "policies/dry_run.h"
#include "policies/run_setup.h"

namespace memfit {
namespace {

using Clock = std::chrono::steady_clock;
using i64 = std::int64_t;

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// One operand of a measured call.
struct Spec {
  Shape shape;
  DType dtype = DType::kF32;
};

// Tensors of a call on one backend; index tensors share one buffer of valid ids.
struct Operands {
  std::vector<OwnedTensor> owned;
  std::vector<Tensor> t;
  IndexTensor idx;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The same call on a CpuBackend (timed) and a MetaBackend (its work counted).
class Bench {
 public:
  Bench() : cpu_alloc_(host_, {}, &cpu_.stream_sync()), meta_alloc_(null_, {}, &meta_.stream_sync()) {}

  // The median of `reps` timed calls after one warm-up (a step's ops run at their typical
  // speed, not their best); `work` = the meta backend's count for one.
  struct Timing {
    double seconds = 0, work = 0, bytes = 0;
  };
  using Call = std::function<void(Backend&, const Operands&)>;

  Timing time(const std::vector<Spec>& specs, i64 idx_n, i64 idx_range, const Call& call,
              int reps) {
    Operands c = make(cpu_alloc_, Device::kCpu, specs, idx_n, idx_range, &ids_);
    Operands m = make(meta_alloc_, Device::kMeta, specs, idx_n, idx_range, &ids_);
    meta_.reset_stats();
    call(meta_, m);
    const MetaStats s = meta_.stats();
    Timing r;
    const double flops = static_cast<double>(s.gemm_flops) + static_cast<double>(s.other_flops);
    r.bytes = static_cast<double>(s.bytes_moved());
    r.work = flops > 0 ? flops : r.bytes;
    for (std::size_t i = 0; i < c.t.size(); ++i) fill_small(c.t[i]);
    call(cpu_, c);  // warm-up: caches, primitives, pages
    cpu_.synchronize(kDefaultStream);
    std::vector<double> secs;
    for (int k = 0; k < reps; ++k) {
      const Clock::time_point t0 = Clock::now();
      call(cpu_, c);
      cpu_.synchronize(kDefaultStream);
      secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    r.seconds = median(secs);
    return r;
  }

 private:
  static Operands make(CachingAllocator& alloc, Device dev, const std::vector<Spec>& specs,
                       i64 idx_n, i64 idx_range, std::vector<std::int32_t>* ids) {
    Operands o;
    for (const Spec& s : specs) {
      o.owned.push_back(OwnedTensor::empty(alloc, s.shape, s.dtype, dev, Category::kTemporary));
      o.t.push_back(o.owned.back().view());
    }
    if (idx_n > 0) {
      ids->resize(static_cast<std::size_t>(idx_n));
      for (i64 i = 0; i < idx_n; ++i) {
        (*ids)[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7919) % idx_range);
      }
      o.idx = IndexTensor{ids->data(), Shape{1, idx_n}, dev};
    }
    return o;
  }

  // Small finite values in every element (f32, f16, bf16 alike: 1/64 is exact in all).
  static void fill_small(const Tensor& t) {
    const std::size_t n = static_cast<std::size_t>(t.numel());
    std::vector<float> v(n, 1.0f / 64);
    convert(v.data(), DType::kF32, t.raw(), t.dtype(), n);
  }

  HostProvider host_;
  NullProvider null_;
  CpuBackend cpu_;
  MetaBackend meta_;
  CachingAllocator cpu_alloc_;
  CachingAllocator meta_alloc_;
  std::vector<std::int32_t> ids_;
};

// per_call and rate from a small and a large call of the same op: the line through the two.
OpRates::Rate fit(const Bench::Timing& a, const Bench::Timing& b) {
  OpRates::Rate r;
  const double dw = b.work - a.work, ds = b.seconds - a.seconds;
  if (dw > 0 && ds > 0) {
    r.rate = dw / ds;
    r.per_call = std::max(0.0, a.seconds - a.work / r.rate);
  } else {
    r.rate = b.work / b.seconds;  // noise made the small call the slower per unit: no fixed part
  }
  return r;
}

// Seconds this process's threads have spent runnable but waiting for a core (the second field
// of /proc/self/task/*/schedstat, in ns); -1 where the kernel does not say.
double seconds_waiting_to_run() {
  namespace fs = std::filesystem;
  std::error_code ec;
  double ns = 0;
  bool any = false;
  for (const fs::directory_entry& t : fs::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(t.path() / "schedstat");
    unsigned long long run = 0, wait = 0;
    if (in >> run >> wait) {
      ns += static_cast<double>(wait);
      any = true;
    }
  }
  return any && !ec ? ns * 1e-9 : -1.0;
}

// Each op at two sizes: `size` gives the operands and index sizes for step 0 (small) or 1.
struct OpCase {
  MetaOp op;
  std::function<std::vector<Spec>(int size, DType dt)> specs;
  std::function<std::pair<i64, i64>(int size)> index;  // (count, range); {0, 0}: none
  Bench::Call call;
};

// A real step of gpt-tiny (no policy) at `batch` samples in dtype `dt`: its wall time (the
// median of `timed` after a warm-up), and from its dry run the seconds its ops are priced at by
// `rates` with per_op 0 and scale 1, and their number.
struct RealStep {
  double measured = 0, priced = 0, ops = 0;
};
RealStep real_step(const OpRates& rates, DType dt, i64 batch, int timed) {
  RunSpec run;
  run.model = ModelSpec::preset("gpt-tiny");
  run.batch = batch;
  run.trainer.policy.dtype = dt;
  Batch b;
  b.batch = batch;
  b.seq_len = run.model.seq_len;
  b.tokens.resize(static_cast<std::size_t>(batch * b.seq_len));
  for (std::size_t i = 0; i < b.tokens.size(); ++i) b.tokens[i] = static_cast<int>((i * 7) % 256);
  b.targets = b.tokens;
  std::vector<double> secs;
  {
    RunSetup setup(run);
    for (int k = 0; k <= timed; ++k) {
      const double s = setup.step(b).seconds;
      if (k > 0) secs.push_back(s);
    }
  }
  RealStep r;
  r.measured = median(secs);
  auto priced = std::make_shared<OpRates>(rates);
  priced->per_op = 0;
  priced->scale = 1;
  run.op_rates = priced;
  const DryRunResult dry = dry_run(run, 1);
  r.priced = dry.compute_seconds;
  r.ops = dry.op_calls;
  return r;
}

// OpRates::scale and per_op, from real steps of gpt-tiny: one micro-batch of 8 samples (1024
// tokens: large ops, where the kernels' speed inside a step shows) and one of 1 (128 tokens:
// small ops, where the cost per op does), in f32 and bf16. Per dtype, scale = measured / priced
// at 8 samples (the per-op cost there is a few percent), then per_op = what the 1-sample step
// takes beyond its ops at that scale, per op. (Solving both from the two steps at once swung
// with each step's noise: scale 0.82-1.15 over quiet measurements.) The mean over the dtypes,
// scale within [0.5, 4], per_op within [0, 1 ms]; a dtype whose steps fail, say for memory, is
// left out, and with none left scale stays 1 and per_op 0.
void calibrate(OpRates& rates) {
  double scale = 0, per_op = 0;
  int n = 0;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    RealStep a, b;
    try {
      a = real_step(rates, dt, 1, 9);  // short steps: more of them (per_op is a small difference)
      b = real_step(rates, dt, 8, 3);
    } catch (const Error&) {  // no real step here (memory, say): the kernels' rates alone
      continue;
    }
    if (!(a.priced > 0 && b.priced > 0 && a.ops >= 1 && b.ops >= 1)) continue;
    const double s = std::clamp(b.measured / b.priced, 0.5, 4.0);
    const double c = std::clamp((a.measured - s * a.priced) / a.ops, 0.0, 1e-3);
    scale += s;
    per_op += c;
    ++n;
  }
  if (n > 0) {
    rates.scale = scale / n;
    rates.per_op = per_op / n;
  }
}

}  // namespace

CpuRates CpuRates::measure() {
  const Clock::time_point start = Clock::now();
  const double waited0 = seconds_waiting_to_run();
  CpuRates r;
  r.key = this_key();
  Bench bench;

  // ---- GEMM: M = 16N, K = N; x W^T, dy W, dy^T x -------------------------------------------
  for (DType dt : kDTypes) {
    std::vector<OpRates::GemmPoint>& pts = r.ops.gemm[OpRates::dtype_index(dt)];
    for (i64 n : {32, 64, 128, 256}) {
      const i64 m = 16 * n, k = n;
      const int reps = n >= 256 ? 3 : 5;
      double secs = 0, flops = 0;
      // One GEMM form: A (shape sa) and B (sb) in dt, C (gm, gn) in c_dt; its time and flops add up.
      const auto form = [&](Shape sa, Shape sb, DType c_dt, i64 gm, i64 gn, i64 gk, bool ta,
                            bool tb, float beta) {
        const Bench::Timing t = bench.time(
            {{sa, dt}, {sb, dt}, {Shape{gm, gn}, c_dt}}, 0, 0,
            [=](Backend& be, const Operands& o) {
              GemmDesc d{};
              d.m = gm, d.n = gn, d.k = gk, d.trans_a = ta, d.trans_b = tb, d.beta = beta;
              be.gemm(kDefaultStream, d, o.t[0], o.t[1], o.t[2]);
            },
            reps);
        secs += t.seconds;
        flops += t.work;
      };
      form(Shape{m, k}, Shape{n, k}, dt, m, n, k, false, true, 0);            // x W^T
      form(Shape{m, n}, Shape{n, k}, dt, m, k, n, false, false, 0);           // dy W
      form(Shape{m, n}, Shape{m, k}, DType::kF32, n, k, m, true, false, 1);  // dW += dy^T x
      pts.push_back({flops / 3, flops / secs});
    }
  }

  // ---- the other ops, small (0) and large (1) per dtype ------------------------------------
  const auto rows = [](int size) -> i64 { return size == 0 ? 256 : 2048; };
  const auto cols = [](int size) -> i64 { return size == 0 ? 256 : 512; };
  const auto no_index = [](int) { return std::pair<i64, i64>{0, 0}; };
  constexpr float kEps = 1e-5f;
  const std::vector<OpCase> cases = {
      {MetaOp::kLayerNormForward,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{n, c}, dt}, {Shape{c}, dt}, {Shape{c}, dt},
                                  {Shape{n, c}, dt}, {Shape{n}, DType::kF32}, {Shape{n}, DType::kF32}};
       },
       no_index,
       [](Backend& be, const Operands& o) {
         be.layernorm_forward(kDefaultStream, o.t[0], o.t[1], o.t[2], kEps, o.t[3], o.t[4], o.t[5]);
       }},
      {MetaOp::kLayerNormBackward,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{n, c}, dt},          {Shape{n, c}, dt},
                                  {Shape{c}, dt},             {Shape{n}, DType::kF32},
                                  {Shape{n}, DType::kF32},    {Shape{n, c}, dt},
                                  {Shape{c}, DType::kF32},    {Shape{c}, DType::kF32}};
       },
       no_index,
       [](Backend& be, const Operands& o) {
         be.layernorm_backward(kDefaultStream, o.t[0], o.t[1], o.t[2], o.t[3], o.t[4], o.t[5],
                               o.t[6], o.t[7]);
       }},
      {MetaOp::kRmsNormForward,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{n, c}, dt}, {Shape{c}, dt}, {Shape{n, c}, dt},
                                  {Shape{n}, DType::kF32}};
       },
       no_index,
       [](Backend& be, const Operands& o) {
         be.rmsnorm_forward(kDefaultStream, o.t[0], o.t[1], kEps, o.t[2], o.t[3]);
       }},
      {MetaOp::kRmsNormBackward,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{n, c}, dt}, {Shape{n, c}, dt}, {Shape{c}, dt},
                                  {Shape{n}, DType::kF32}, {Shape{n, c}, dt},
                                  {Shape{c}, DType::kF32}};
       },
       no_index,
       [](Backend& be, const Operands& o) {
         be.rmsnorm_backward(kDefaultStream, o.t[0], o.t[1], o.t[2], o.t[3], o.t[4], o.t[5]);
       }},
      {MetaOp::kGeluForward,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = 4 * cols(z);
         return std::vector<Spec>{{Shape{n, c}, dt}, {Shape{n, c}, dt}};
       },
       no_index, [](Backend& be, const Operands& o) { be.gelu_forward(kDefaultStream, o.t[0], o.t[1]); }},
      {MetaOp::kGeluBackward,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = 4 * cols(z);
         return std::vector<Spec>{{Shape{n, c}, dt}, {Shape{n, c}, dt}, {Shape{n, c}, dt}};
       },
       no_index,
       [](Backend& be, const Operands& o) {
         be.gelu_backward(kDefaultStream, o.t[0], o.t[1], o.t[2]);
       }},
      {MetaOp::kSwiGluForward,
       [&](int z, DType dt) {
         const i64 n = rows(z), f = 2 * cols(z);
         return std::vector<Spec>{{Shape{n, 2 * f}, dt}, {Shape{n, f}, dt}};
       },
       no_index,
       [](Backend& be, const Operands& o) { be.swiglu_forward(kDefaultStream, o.t[0], o.t[1]); }},
      {MetaOp::kSwiGluBackward,
       [&](int z, DType dt) {
         const i64 n = rows(z), f = 2 * cols(z);
         return std::vector<Spec>{{Shape{n, f}, dt}, {Shape{n, 2 * f}, dt}, {Shape{n, 2 * f}, dt}};
       },
       no_index,
       [](Backend& be, const Operands& o) {
         be.swiglu_backward(kDefaultStream, o.t[0], o.t[1], o.t[2]);
       }},
      {MetaOp::kAdd,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{n, c}, dt}, {Shape{n, c}, dt}, {Shape{n, c}, dt}};
       },
       no_index, [](Backend& be, const Operands& o) { be.add(kDefaultStream, o.t[0], o.t[1], o.t[2]); }},
      {MetaOp::kAddBias,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{c}, dt}, {Shape{n, c}, dt}};
       },
       no_index, [](Backend& be, const Operands& o) { be.add_bias(kDefaultStream, o.t[0], o.t[1]); }},
      {MetaOp::kBiasBackward,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{n, c}, dt}, {Shape{c}, DType::kF32}};
       },
       no_index,
       [](Backend& be, const Operands& o) { be.bias_backward(kDefaultStream, o.t[0], o.t[1]); }},
      {MetaOp::kFlashAttentionForward,
       [&](int z, DType dt) {
         const i64 b = z == 0 ? 1 : 4, t = z == 0 ? 128 : 256, h = 4, hs = 64;
         return std::vector<Spec>{{Shape{b, t, 3 * h * hs}, dt}, {Shape{b, t, h * hs}, dt},
                                  {Shape{b, h, t}, DType::kF32}};
       },
       no_index,
       [](Backend& be, const Operands& o) {
         be.flash_attention_forward(kDefaultStream, o.t[0], 4, 4, o.t[1], o.t[2]);
       }},
      {MetaOp::kFlashAttentionBackward,
       [&](int z, DType dt) {
         const i64 b = z == 0 ? 1 : 4, t = z == 0 ? 128 : 256, h = 4, hs = 64;
         return std::vector<Spec>{{Shape{b, t, h * hs}, dt},     {Shape{b, t, 3 * h * hs}, dt},
                                  {Shape{b, t, h * hs}, dt},     {Shape{b, h, t}, DType::kF32},
                                  {Shape{b, h, t}, DType::kF32}, {Shape{b, t, 3 * h * hs}, dt}};
       },
       no_index,
       [](Backend& be, const Operands& o) {
         be.flash_attention_backward(kDefaultStream, o.t[0], o.t[1], o.t[2], o.t[3], 4, 4, o.t[4],
                                     o.t[5]);
       }},
      {MetaOp::kEmbeddingForward,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{1024, c}, dt}, {Shape{n, c}, dt}, {Shape{1, n, c}, dt}};
       },
       [&](int z) { return std::pair<i64, i64>{rows(z), 1024}; },
       [](Backend& be, const Operands& o) {
         be.embedding_forward(kDefaultStream, o.idx, o.t[0], o.t[1], o.t[2]);
       }},
      {MetaOp::kEmbeddingBackward,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{1, n, c}, dt}, {Shape{1024, c}, DType::kF32},
                                  {Shape{n, c}, DType::kF32}};
       },
       [&](int z) { return std::pair<i64, i64>{rows(z), 1024}; },
       [](Backend& be, const Operands& o) {
         be.embedding_backward(kDefaultStream, o.t[0], o.idx, o.t[1], o.t[2]);
       }},
      {MetaOp::kCrossEntropyForward,
       [&](int z, DType dt) {
         const i64 n = rows(z) / 4, v = 4 * cols(z);
         return std::vector<Spec>{{Shape{1, n, v}, dt}, {Shape{1, n}, DType::kF32},
                                  {Shape{1, n}, DType::kF32}};
       },
       [&](int z) { return std::pair<i64, i64>{rows(z) / 4, 4 * cols(z)}; },
       [&](Backend& be, const Operands& o) {
         be.crossentropy_forward(kDefaultStream, o.t[0], o.idx, o.t[0].size(2), o.t[1], o.t[2]);
       }},
      {MetaOp::kCrossEntropyBackward,
       [&](int z, DType dt) {
         const i64 n = rows(z) / 4, v = 4 * cols(z);
         return std::vector<Spec>{{Shape{1, n, v}, dt}, {Shape{1, n}, DType::kF32},
                                  {Shape{1, n, v}, dt}};
       },
       [&](int z) { return std::pair<i64, i64>{rows(z) / 4, 4 * cols(z)}; },
       [&](Backend& be, const Operands& o) {
         be.crossentropy_backward(kDefaultStream, o.t[0], o.t[1], o.idx, o.t[0].size(2), 1e-3f,
                                  nullptr, o.t[2]);
       }},
      {MetaOp::kCopy,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{n, c}, dt}, {Shape{n, c}, dt}};
       },
       no_index, [](Backend& be, const Operands& o) { be.copy(kDefaultStream, o.t[0], o.t[1]); }},
      {MetaOp::kFill,
       [&](int z, DType dt) { return std::vector<Spec>{{Shape{rows(z), cols(z)}, dt}}; },
       no_index, [](Backend& be, const Operands& o) { be.fill(kDefaultStream, o.t[0], 0.0f); }},
      {MetaOp::kCast,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{n, c}, DType::kF32}, {Shape{n, c}, dt}};
       },
       no_index, [](Backend& be, const Operands& o) { be.cast(kDefaultStream, o.t[0], o.t[1]); }},
      {MetaOp::kAxpy,
       [&](int z, DType dt) {
         const i64 n = rows(z), c = cols(z);
         return std::vector<Spec>{{Shape{n, c}, dt}, {Shape{n, c}, DType::kF32}};
       },
       no_index,
       [](Backend& be, const Operands& o) { be.axpy(kDefaultStream, 0.5f, o.t[0], o.t[1]); }},
      {MetaOp::kScale,
       [&](int z, DType dt) { return std::vector<Spec>{{Shape{rows(z), cols(z)}, dt}}; },
       no_index, [](Backend& be, const Operands& o) { be.scale(kDefaultStream, 1.0f, o.t[0]); }},
      {MetaOp::kSumSq,
       [&](int z, DType dt) {
         return std::vector<Spec>{{Shape{rows(z), cols(z)}, dt}, {Shape{kSumSqSlots}, DType::kF32}};
       },
       no_index, [](Backend& be, const Operands& o) { be.sumsq(kDefaultStream, o.t[0], o.t[1]); }},
      {MetaOp::kAdamW,
       [&](int z, DType dt) {
         const Shape s{rows(z), cols(z)};
         return std::vector<Spec>{{s, DType::kF32}, {s, DType::kF32}, {s, DType::kF32},
                                  {s, DType::kF32}, {s, dt}};
       },
       no_index,
       [](Backend& be, const Operands& o) {
         const AdamWConstants k = adamw_constants(AdamWOptions{}, 1);
         const Tensor* out = o.t[4].dtype() == DType::kF32 ? nullptr : &o.t[4];
         be.adamw(kDefaultStream, k, o.t[0], o.t[1], o.t[2], o.t[3], out);
       }},
  };
  for (const OpCase& c : cases) {
    for (DType dt : kDTypes) {
      Bench::Timing t[2];
      for (int z = 0; z < 2; ++z) {
        const auto [idx_n, idx_range] = c.index(z);
        t[z] = bench.time(c.specs(z, dt), idx_n, idx_range, c.call, z == 0 ? 31 : 3);
      }
      r.ops.ops[static_cast<std::size_t>(c.op)][OpRates::dtype_index(dt)] = fit(t[0], t[1]);
    }
  }

  // ---- memcpy and the host AdamW ----------------------------------------------------------
  {
    constexpr std::size_t kBytes = std::size_t{64} << 20;  // beyond any last-level cache
    std::vector<char> src(kBytes, 1), dst(kBytes, 0);
    double best = std::numeric_limits<double>::infinity();
    for (int k = 0; k < 3; ++k) {
      const Clock::time_point t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), kBytes);
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    r.copy = 2.0 * static_cast<double>(kBytes) / best;  // read + write, as MetaBackend counts
    r.ops.bandwidth = r.copy;
  }
  r.adamw = CostModel::cpu_adamw_rate();
  calibrate(r.ops);
  r.measure_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double waited1 = seconds_waiting_to_run();
  if (waited0 >= 0 && waited1 >= waited0) {
    r.contention = (waited1 - waited0) / (r.measure_seconds * omp_get_max_threads());
  }
  return r;
}

}  // namespace memfit
