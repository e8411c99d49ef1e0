// A GPT training step on the GPU (CudaBackend, CudaProvider, the caching allocator on device
// memory, cuBLASLt's workspace from it), checked against the CPU backend and against itself
// under each memory policy:
// - the loss and every parameter gradient match the CPU backend's for the same seed and batch
//   (f32: TF32 off, so only summation order differs; bf16: both round activations to bf16,
//   so per-element differences are a few bf16 ulps; NaN never passes);
// - checkpointing (all, every:2) gives bit-identical losses, gradients, weights and optimizer
//   state to no checkpointing on the GPU (the recomputed forward runs the same kernels on the
//   same shapes, and the kernels are deterministic: core/cuda/cuda_backend.h);
// - the offloaded optimizer (pinned FP32 masters, CPU AdamW, copies on a stream of their own)
//   equals DeviceAdamW (the CUDA AdamW kernel) to a few f32 ulps;
// - an OutOfMemory under a budget leaves the trainer's state untouched and a smaller
//   micro-batch then trains under the same budget;
// - during a real step the allocator's reserved bytes are what the driver's free memory lost.
// Every test starts with MEMFIT_REQUIRE_GPU(): without a device it skips with the reason.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cuda/cuda_backend.h"
#include "core/model.h"
#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/cuda_provider.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "memory/pinned_host_provider.h"
#include "memory/size.h"
#include "policies/dry_run.h"
#include "policies/offload_optimizer.h"
#include "policies/trainer.h"
#include "tests/gpu/gpu_testutil.h"

namespace memfit {
namespace {

using testing::print_figure;

ModelSpec step_spec(std::int64_t layers = 2) {
  ModelSpec s;
  s.name = "gpu-step";
  s.vocab = 500;  // not a multiple of 64: the padded vocabulary path runs too
  s.seq_len = 64;
  s.layers = layers;
  s.hidden = 128;
  s.heads = 4;
  s.mlp_ratio = 4;
  s.tied_head = true;
  return s;
}

Batch make_batch(std::int64_t b, std::int64_t t, std::int64_t vocab, std::uint32_t seed) {
  Batch out;
  out.batch = b;
  out.seq_len = t;
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (std::int64_t i = 0; i < b * t; ++i) {
    x = x * 1664525u + 1013904223u;  // LCG: the same tokens on every machine
    out.tokens.push_back(static_cast<std::int32_t>((x >> 8) % static_cast<std::uint32_t>(vocab)));
    out.targets.push_back(
        static_cast<std::int32_t>(((x >> 4) * 7u) % static_cast<std::uint32_t>(vocab)));
  }
  return out;
}

// The GPU "device": backend, device memory, the caching allocator on the backend's events, and
// cuBLASLt's workspace from that allocator (what RuntimeEnv sets up for `memfit train`).
struct GpuRig {
  explicit GpuRig(DType dt, AllocatorConfig conf = {})
      : be(CudaBackendOptions{.device = 0}),
        gpu(0),
        alloc(gpu, conf, &be.stream_sync()),
        ctx{be, alloc, kDefaultStream, dt} {
    be.set_workspace_allocator(&alloc);
  }
  ~GpuRig() {
    be.synchronize(kDefaultStream);
    be.set_workspace_allocator(nullptr);
  }
  // Trainer options for this rig's dtype (a trainer's policy dtype is its model's).
  TrainerOptions opts(TrainerOptions o = {}) const {
    o.policy.dtype = ctx.dtype;
    return o;
  }
  CudaBackend be;
  CudaProvider gpu;
  CachingAllocator alloc;
  LayerContext ctx;
};

struct CpuRig {
  explicit CpuRig(DType dt)
      : alloc(host, {}, &be.stream_sync()), ctx{be, alloc, kDefaultStream, dt} {
    be.set_workspace_allocator(&alloc);
  }
  ~CpuRig() { be.set_workspace_allocator(nullptr); }
  // Trainer options for this rig's dtype (a trainer's policy dtype is its model's).
  TrainerOptions opts(TrainerOptions o = {}) const {
    o.policy.dtype = ctx.dtype;
    return o;
  }
  CpuBackend be;
  HostProvider host;
  CachingAllocator alloc;
  LayerContext ctx;
};

// A tensor's bytes on the host (any device), through the backend's copy.
std::vector<unsigned char> bytes_of(LayerContext& ctx, const Tensor& t) {
  std::vector<unsigned char> raw(t.nbytes());
  if (t.numel() == 0) return raw;
  ctx.backend.copy(ctx.stream, t, Tensor(raw.data(), t.shape(), t.dtype(), Device::kCpu));
  ctx.backend.synchronize(ctx.stream);
  return raw;
}

std::vector<float> values_of(LayerContext& ctx, const Tensor& t) {
  const std::vector<unsigned char> raw = bytes_of(ctx, t);
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  if (!out.empty()) convert(raw.data(), t.dtype(), out.data(), DType::kF32, out.size());
  return out;
}

struct Tolerance {
  double loss_rel;  // |loss - ref| <= loss_rel * |ref|
  double abs_frac;  // per element: |x - ref| <= abs_frac * max|ref| + rel * |ref|
  double rel;
  double l2_rel;  // ||x - ref|| <= l2_rel * ||ref||
};
Tolerance tolerance(DType dt) {
  // f32: ~1e-5 relative per kernel (the figure), a few kernels deep. bf16: 2^-8
  // relative per rounding of an activation; the gradients are sums over every row, so the
  // norm-wise error stays near the per-rounding figure while a few small elements move more.
  if (dt == DType::kF32) return {1e-5, 1e-4, 1e-3, 1e-4};
  return {1e-2, 3e-2, 3e-2, 2e-2};
}

// Compares x with ref elementwise and norm-wise; returns the relative L2 error.
double expect_close(const std::vector<float>& x, const std::vector<float>& ref,
                    const Tolerance& tol, const std::string& what) {
  EXPECT_EQ(x.size(), ref.size()) << what;
  if (x.size() != ref.size()) return INFINITY;
  double max_ref = 0, diff2 = 0, ref2 = 0;
  for (float r : ref) max_ref = std::max(max_ref, std::fabs(double(r)));
  int reported = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = double(x[i]) - double(ref[i]);
    diff2 += d * d;
    ref2 += double(ref[i]) * double(ref[i]);
    const double allowed = tol.abs_frac * max_ref + tol.rel * std::fabs(double(ref[i]));
    // Written so that NaN fails: !(|d| <= allowed).
    if (!(std::isfinite(x[i]) && std::fabs(d) <= allowed) && reported++ < 3) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << x[i] << " cpu " << ref[i] << " (allowed "
                    << allowed << ")";
    }
  }
  const double l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  EXPECT_LE(l2, tol.l2_rel) << what << ": relative L2 error";
  return l2;
}

// The Llama family's step: grouped-query rotary attention with q/k/v biases, SwiGLU, an RMSNorm
// head, untied, and the chunked loss (vocab 500 over width 128: 4 chunks).
ModelSpec llama_step_spec() {
  ModelSpec s;
  s.kind = ModelSpec::Kind::kLlama;
  s.name = "gpu-llama-step";
  s.vocab = 500;
  s.seq_len = 64;
  s.layers = 2;
  s.hidden = 128;
  s.heads = 4;
  s.kv_heads = 2;
  s.intermediate = 352;
  s.qkv_bias = true;
  s.tied_head = false;
  s.ln_eps = 1e-5f;
  s.rope_theta = 10000.0f;
  return s;
}

void check_step_against_cpu(const ModelSpec& spec, DType dt, const std::string& what);

class GptStepGpu : public ::testing::TestWithParam<DType> {};

TEST_P(GptStepGpu, LossAndEveryGradientMatchTheCpuBackend) {
  MEMFIT_REQUIRE_GPU();
  check_step_against_cpu(step_spec(), GetParam(), "gpt");
}

class LlamaStepGpu : public ::testing::TestWithParam<DType> {};

TEST_P(LlamaStepGpu, LossAndEveryGradientMatchTheCpuBackend) {
  MEMFIT_REQUIRE_GPU();
  check_step_against_cpu(llama_step_spec(), GetParam(), "llama");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LlamaStepGpu, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Qwen3's step: the same with per-head q/k RMSNorms, no biases, a tied head.
class Qwen3StepGpu : public ::testing::TestWithParam<DType> {};

TEST_P(Qwen3StepGpu, LossAndEveryGradientMatchTheCpuBackend) {
  MEMFIT_REQUIRE_GPU();
  ModelSpec s = llama_step_spec();
  s.name = "gpu-qwen3-step";
  s.qkv_bias = false;
  s.qk_norm = true;
  s.tied_head = true;
  check_step_against_cpu(s, GetParam(), "qwen3");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Qwen3StepGpu, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

void check_step_against_cpu(const ModelSpec& spec, DType dt, const std::string& what) {
  const Batch b = make_batch(4, spec.seq_len, spec.vocab, 7);
  TrainerOptions o;
  o.seed = 2024;

  CpuRig cpu(dt);
  Model cpu_model(spec, cpu.ctx);
  Trainer cpu_trainer(cpu_model, cpu.ctx, cpu.opts(o));

  GpuRig gpu(dt);
  Model gpu_model(spec, gpu.ctx);
  Trainer gpu_trainer(gpu_model, gpu.ctx, gpu.opts(o));
  // Same initialization: the working weights start equal bit for bit (init draws on the host).
  const std::vector<Parameter*> pc = cpu_model.parameters(), pg = gpu_model.parameters();
  ASSERT_EQ(pc.size(), pg.size());
  for (std::size_t i = 0; i < pc.size(); ++i) {
    EXPECT_TRUE(bytes_of(gpu.ctx, pg[i]->weight.view()) == bytes_of(cpu.ctx, pc[i]->weight.view()))
        << "initial " << pg[i]->name;
  }
  const StepResult rc = cpu_trainer.step(b);
  const StepResult rg = gpu_trainer.step(b);

  const Tolerance tol = tolerance(dt);
  ASSERT_TRUE(std::isfinite(rg.loss));
  EXPECT_NEAR(rg.loss, rc.loss, tol.loss_rel * std::fabs(rc.loss));
  double worst = 0;
  std::string worst_name;
  for (std::size_t i = 0; i < pc.size(); ++i) {
    ASSERT_EQ(pc[i]->name, pg[i]->name);
    const double l2 =
        expect_close(values_of(gpu.ctx, pg[i]->grad.view()), values_of(cpu.ctx, pc[i]->grad.view()),
                     tol, "grad " + pg[i]->name);
    if (l2 > worst) {
      worst = l2;
      worst_name = pg[i]->name;
    }
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "loss gpu %.7f cpu %.7f; worst gradient rel-L2 %.2e (%s)", rg.loss,
                rc.loss, worst, worst_name.c_str());
  print_figure(what + " step vs cpu, " + dtype_name(dt), buf);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GptStepGpu, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Everything a step changes, as bytes: gradients, optimizer state, working weights.
using Snapshot = std::map<std::string, std::vector<unsigned char>>;
Snapshot snapshot(Trainer& t) {
  LayerContext& ctx = t.context();
  t.optimizer().flush(ctx);
  Snapshot s;
  for (const StateTensor& st : t.optimizer().state()) s[st.name] = bytes_of(ctx, st.tensor);
  for (Parameter* p : t.model().parameters()) {
    // Under weight offload the working weight is the host copy; under gradient offload the
    // gradients are on the host only, in the optimizer's slab (not a state tensor).
    s["weight/" + p->name] =
        bytes_of(ctx, p->weight_on_device() ? p->weight.view() : p->host_weight);
    if (p->grad_on_device()) s["grad/" + p->name] = bytes_of(ctx, p->grad.view());
  }
  return s;
}

TEST(GptStepGpuPolicies, CheckpointingIsBitIdenticalToNone) {
  MEMFIT_REQUIRE_GPU();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const ModelSpec spec = step_spec(4);
    auto run = [&](const std::string& checkpoint, std::vector<double>& losses) {
      GpuRig gpu(dt);
      Model m(spec, gpu.ctx);
      TrainerOptions o;
      o.policy.checkpoint = Checkpointing::parse(checkpoint, static_cast<int>(spec.layers));
      o.policy.micro_batch = 2;  // accumulation too: gradients summed over two micro-batches
      Trainer t(m, gpu.ctx, gpu.opts(o));
      for (std::uint32_t step = 0; step < 2; ++step) {
        losses.push_back(t.step(make_batch(4, spec.seq_len, spec.vocab, 11 + step)).loss);
      }
      return snapshot(t);
    };
    std::vector<double> ref_losses;
    const Snapshot ref = run("none", ref_losses);
    for (const char* checkpoint : {"all", "every:2"}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " checkpoint " + checkpoint);
      std::vector<double> losses;
      const Snapshot got = run(checkpoint, losses);
      EXPECT_EQ(losses, ref_losses);  // exact: same bits
      ASSERT_EQ(got.size(), ref.size());
      for (const auto& [name, bytes] : ref) {
        auto it = got.find(name);
        ASSERT_NE(it, got.end()) << name;
        EXPECT_TRUE(it->second == bytes) << name << " differs";
      }
    }
  }
}

// f32 values within `ulps` units in the last place of each other (NaN never is).
bool within_ulps(float a, float b, int ulps) {
  if (!std::isfinite(a) || !std::isfinite(b)) return false;
  if (a == b) return true;
  const float scale = std::max(std::fabs(a), std::fabs(b));
  const double ulp = double(std::nextafter(scale, INFINITY)) - double(scale);
  return std::fabs(double(a) - double(b)) <= ulps * ulp;
}

TEST(GptStepGpuPolicies, OffloadEqualsDeviceAdamW) {
  MEMFIT_REQUIRE_GPU();
  // The offload path's copies are asynchronous only from page-locked memory the driver knows.
  ASSERT_EQ(PinnedHostProvider().mode(), PinnedHostProvider::Mode::kCudaHostAlloc);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const ModelSpec spec = step_spec(3);
    struct Out {
      std::vector<double> losses;
      std::map<std::string, std::vector<float>> values;  // masters, moments, working weights
      OffloadOptimizer::Timing timing;
    };
    auto run = [&](bool offload) {
      GpuRig gpu(dt);
      Model m(spec, gpu.ctx);
      TrainerOptions o;
      o.policy.offload.optimizer = offload;
      Trainer t(m, gpu.ctx, gpu.opts(o));
      Out out;
      for (std::uint32_t step = 0; step < 3; ++step) {
        out.losses.push_back(t.step(make_batch(4, spec.seq_len, spec.vocab, 21 + step)).loss);
      }
      if (offload) {
        auto& opt = static_cast<OffloadOptimizer&>(t.optimizer());
        opt.flush(gpu.ctx);
        out.timing = opt.last_timing();
      }
      for (const StateTensor& st : t.optimizer().state()) {
        std::string name = st.name;
        // DeviceAdamW calls an f32 model's master "weight/<name>": the same values.
        if (name.rfind("weight/", 0) == 0) name = "master/" + name.substr(7);
        out.values[name] = values_of(gpu.ctx, st.tensor);
      }
      for (Parameter* p : m.parameters()) {
        out.values["working/" + p->name] = values_of(gpu.ctx, p->weight.view());
      }
      return out;
    };
    const Out dev = run(false);
    const Out off = run(true);
    // Step 1 runs on identical weights; later steps on weights that agree to a few ulps.
    ASSERT_EQ(off.losses.size(), dev.losses.size());
    EXPECT_EQ(off.losses[0], dev.losses[0]);
    for (std::size_t i = 1; i < dev.losses.size(); ++i) {
      EXPECT_NEAR(off.losses[i], dev.losses[i], 1e-5 * std::fabs(dev.losses[i])) << "step " << i;
    }
    std::int64_t total = 0, exact = 0;
    for (const auto& [name, ref] : dev.values) {
      auto it = off.values.find(name);
      ASSERT_NE(it, off.values.end()) << name << " missing from the offloaded state";
      ASSERT_EQ(it->second.size(), ref.size()) << name;
      // Working weights in bf16 are rounded masters: one bf16 ulp apart at most when the
      // masters straddle a rounding boundary (2^-7 relative); f32 state to 4 f32 ulps.
      const bool low = name.rfind("working/", 0) == 0 && dt != DType::kF32;
      int bad = 0;
      for (std::size_t i = 0; i < ref.size(); ++i) {
        const float a = it->second[i], b = ref[i];
        ++total;
        if (a == b) {
          ++exact;
          continue;
        }
        const bool ok =
            low ? std::fabs(a - b) <= std::ldexp(std::fabs(b), -7) : within_ulps(a, b, 4);
        if (!ok && bad++ < 3)
          ADD_FAILURE() << name << "[" << i << "]: offload " << a << " device " << b;
      }
    }
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "%lld of %lld values bit-equal; last step: waited %.2f ms for gradients, "
                  "AdamW %.2f ms, copy-back queued in %.2f ms",
                  static_cast<long long>(exact), static_cast<long long>(total),
                  1e3 * off.timing.wait_grads_s, 1e3 * off.timing.adamw_s,
                  1e3 * off.timing.copy_back_s);
    print_figure(std::string("offload vs device adamw, ") + dtype_name(dt), buf);
  }
}

// Gradient and weight offload on the GPU: the gradients stream out through the bucket ring
// and the weights in through the buffer ring on copy streams, and the run is bit-identical to
// optimizer offload alone (the same CPU AdamW on the same values), with accumulation and
// checkpointing; the device's gradient and parameter peaks are the rings'.
TEST(GptStepGpuPolicies, GradientAndWeightOffloadAreBitIdentical) {
  MEMFIT_REQUIRE_GPU();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const ModelSpec spec = step_spec(4);
    struct Out {
      std::vector<double> losses;
      Snapshot state;
      std::size_t grad_peak = 0, param_peak = 0;
    };
    auto run = [&](OffloadSwitches off) {
      GpuRig gpu(dt);
      TrainerOptions o;
      o.policy.offload = off;
      o.policy.checkpoint = Checkpointing::every(2);
      o.policy.micro_batch = 2;
      Model m(spec, gpu.ctx, Trainer::placement(o.policy));
      Trainer t(m, gpu.ctx, gpu.opts(o));
      Out out;
      for (std::uint32_t step = 0; step < 3; ++step) {
        const StepResult r = t.step(make_batch(4, spec.seq_len, spec.vocab, 31 + step));
        out.losses.push_back(r.loss);
        out.grad_peak =
            std::max(out.grad_peak, r.peaks.category_peaks[category_index(Category::kGradient)]);
        out.param_peak =
            std::max(out.param_peak, r.peaks.category_peaks[category_index(Category::kParameter)]);
      }
      out.state = snapshot(t);
      return out;
    };
    const Out opt = run(OffloadSwitches::parse("optimizer"));
    for (const char* which : {"optimizer,gradients", "optimizer,weights", "all"}) {
      SCOPED_TRACE(which);
      const OffloadSwitches sw = OffloadSwitches::parse(which);
      const Out got = run(sw);
      EXPECT_EQ(got.losses, opt.losses);  // exact: same bits
      for (const auto& [name, bytes] : opt.state) {
        if (sw.gradients && name.rfind("grad/", 0) == 0) continue;  // not on the device
        auto it = got.state.find(name);
        ASSERT_NE(it, got.state.end()) << name;
        EXPECT_TRUE(it->second == bytes) << name << " differs";
      }
      if (sw.gradients) EXPECT_LT(got.grad_peak, opt.grad_peak);
      if (sw.weights) EXPECT_LT(got.param_peak, opt.param_peak);
    }
  }
}

// Activation offload on the GPU: under checkpoint all the checkpoints go device -> pinned host
// on the stash's copy stream after the forward that keeps them and come back one read ahead;
// bit-identical to keeping them on the device (losses and every weight), alone and with every
// other switch, and the device's activation peak is lower by all but two checkpoints.
TEST(GptStepGpuPolicies, ActivationOffloadIsBitIdenticalAndMovesTheCheckpoints) {
  MEMFIT_REQUIRE_GPU();
  const DType dt = DType::kBF16;
  const int n = 6;
  const ModelSpec spec = step_spec(n);
  struct Out {
    std::vector<double> losses;
    Snapshot state;
    std::size_t act_peak = 0, host = 0;
  };
  auto run = [&](OffloadSwitches off) {
    GpuRig gpu(dt);
    TrainerOptions o;
    o.policy.offload = off;
    o.policy.checkpoint = Checkpointing::all();
    o.policy.micro_batch = 4;
    Model m(spec, gpu.ctx, Trainer::placement(o.policy));
    Trainer t(m, gpu.ctx, gpu.opts(o));
    Out out;
    for (std::uint32_t step = 0; step < 3; ++step) {
      const StepResult r = t.step(make_batch(8, spec.seq_len, spec.vocab, 51 + step));
      out.losses.push_back(r.loss);
      out.act_peak =
          std::max(out.act_peak, r.peaks.category_peaks[category_index(Category::kActivation)]);
      out.host = r.peaks.host_at_peak[category_index(Category::kActivation)];
    }
    out.state = snapshot(t);
    return out;
  };
  const std::size_t one = 4 * static_cast<std::size_t>(spec.seq_len * spec.hidden) * 2;
  for (const char* pair : {"off|activations", "optimizer,gradients,weights|all"}) {
    const std::string base_text(pair, std::strchr(pair, '|'));
    SCOPED_TRACE(pair);
    const Out base = run(OffloadSwitches::parse(base_text));
    const Out got = run(OffloadSwitches::parse(std::strchr(pair, '|') + 1));
    EXPECT_EQ(got.losses, base.losses);  // exact: the same bits come back
    for (const auto& [name, bytes] : base.state) {
      auto it = got.state.find(name);
      ASSERT_NE(it, got.state.end()) << name;
      EXPECT_TRUE(it->second == bytes) << name << " differs";
    }
    EXPECT_GE(base.act_peak, got.act_peak + (n - 2) * one)
        << base.act_peak << " vs " << got.act_peak;
    EXPECT_GE(got.host, n * one);  // a room for each checkpoint
  }
}

// Gradient clipping on the GPU: the device's norm (the CUDA sumsq) and the host's under gradient
// offload (OffloadOptimizer::grads_sumsq) read the same gradient bits in different orders, so
// the first step's norms agree within 1e-6 relative; both steps are clipped.
TEST(GptStepGpuPolicies, ClippingReadsTheSameNormOnTheDeviceAndTheHost) {
  MEMFIT_REQUIRE_GPU();
  const ModelSpec spec = step_spec(4);
  auto first_step = [&](const char* offload) {
    GpuRig gpu(DType::kBF16);
    TrainerOptions o;
    o.policy.offload = OffloadSwitches::parse(offload);
    o.policy.micro_batch = 2;
    o.max_grad_norm = 1e-3;  // below any real norm: always clipped
    Model m(spec, gpu.ctx, Trainer::placement(o.policy));
    Trainer t(m, gpu.ctx, gpu.opts(o));
    return t.step(make_batch(4, spec.seq_len, spec.vocab, 71));
  };
  const StepResult dev = first_step("optimizer");
  const StepResult host = first_step("optimizer,gradients");
  ASSERT_GT(dev.grad_norm, 0);
  EXPECT_TRUE(dev.clipped);
  EXPECT_TRUE(host.clipped);
  EXPECT_NEAR(host.grad_norm, dev.grad_norm, 1e-6 * dev.grad_norm);
  EXPECT_EQ(host.loss, dev.loss);  // the first step's forward precedes any update
  std::printf("figure: clipping grad norm device %.9g host %.9g\n", dev.grad_norm, host.grad_norm);
}

TEST(GptStepGpuPolicies, OutOfMemoryUnderABudgetIsRecoverableWithASmallerMicroBatch) {
  MEMFIT_REQUIRE_GPU();
  const DType dt = DType::kBF16;
  const ModelSpec spec = step_spec(4);
  const Batch b = make_batch(16, spec.seq_len, spec.vocab, 31);
  // What a whole-batch step and a micro-batch-2 step need, measured on identical trainers.
  auto peak_of = [&](std::int64_t micro) {
    GpuRig gpu(dt);
    Model m(spec, gpu.ctx);
    TrainerOptions o;
    o.policy.micro_batch = micro;
    Trainer t(m, gpu.ctx, gpu.opts(o));
    return t.step(b).peaks.reserved;
  };
  const std::size_t big = peak_of(0), small = peak_of(2);
  ASSERT_LT(small, big);
  AllocatorConfig conf;
  conf.budget = small + (big - small) / 2;
  GpuRig gpu(dt, conf);
  Model m(spec, gpu.ctx);
  auto t = std::make_unique<Trainer>(m, gpu.ctx, gpu.opts());
  const Snapshot before = snapshot(*t);
  try {
    t->step(b);
    FAIL() << "a step needing " << format_bytes(big) << " fit under " << format_bytes(conf.budget);
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info().budget_bytes, conf.budget);
  }
  EXPECT_TRUE(snapshot(*t) == before);  // nothing changed
  EXPECT_EQ(t->steps(), 0);
  EXPECT_FALSE(m.any_saved());
  // The same model, a smaller micro-batch, the same budget: it trains.
  t.reset();
  TrainerOptions o;
  o.policy.micro_batch = 2;
  o.init_model = false;
  t = std::make_unique<Trainer>(m, gpu.ctx, gpu.opts(o));
  const StepResult r = t->step(b);
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_LE(r.peaks.reserved, conf.budget);
  EXPECT_EQ(t->steps(), 1);
  print_figure("gpu oom recovery",
               "batch 16 needs " + format_bytes(big) + ", micro-batch 2 " + format_bytes(small) +
                   "; budget " + format_bytes(conf.budget) + ": OOM, then micro-batch 2 trains");
}

std::size_t free_device_bytes() {
  std::size_t free = 0, total = 0;
  MEMFIT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

TEST(GptStepGpuPolicies, ReservedBytesMatchTheDriversFreeMemoryDropDuringAStep) {
  MEMFIT_REQUIRE_GPU();
  GpuRig gpu(DType::kBF16);
  ModelSpec spec = step_spec(4);  // big enough that the step reserves hundreds of MiB
  spec.vocab = 8192;
  spec.seq_len = 256;
  spec.hidden = 512;
  spec.heads = 8;
  const Batch b = make_batch(16, spec.seq_len, spec.vocab, 41);
  auto train_once = [&](auto&& inspect) {
    Model m(spec, gpu.ctx);
    Trainer t(m, gpu.ctx, gpu.opts());
    const StepResult r = t.step(b);
    gpu.be.synchronize(kDefaultStream);
    inspect(r);
  };
  // A first step loads every kernel this step uses (lazy module loading maps their code into
  // device memory on first launch) and builds the cuBLASLt plans; then the cache goes back.
  train_once([](const StepResult&) {});
  gpu.alloc.empty_cache();
  const std::size_t free0 = free_device_bytes();
  train_once([&](const StepResult& r) {
    const AllocatorStats s = gpu.alloc.stats();
    const auto reserved = static_cast<std::size_t>(s.reserved_bytes[kStatAll].current);
    const auto segments = static_cast<std::size_t>(s.segment[kStatAll].current);
    const std::size_t drop = free0 - free_device_bytes();
    // The driver maps device memory in 2 MiB pages: a segment can cost up to one more page.
    // 8 MiB on top for whatever a library maps on its own; more than that is device memory the
    // allocator does not account for.
    const std::size_t granules = segments * 2 * kMiB;
    EXPECT_GE(drop + granules, reserved);
    EXPECT_LE(drop, reserved + granules + 8 * kMiB);
    EXPECT_GT(reserved, 100 * kMiB);  // the comparison means something
    EXPECT_LE(r.peaks.reserved, static_cast<std::size_t>(s.reserved_bytes[kStatAll].peak));
    print_figure("gpt step: allocator reserved vs driver free-memory drop",
                 format_bytes(reserved) + " in " + std::to_string(segments) + " segments vs " +
                     format_bytes(drop) + "; workspace peak " +
                     format_bytes(static_cast<std::size_t>(
                         s.category_bytes[category_index(Category::kWorkspace)].peak)));
  });
  gpu.alloc.empty_cache();
}

// The planner's dry run for a GPU (policies/dry_run.h: cuBLASLt's workspace at its cap per
// GEMM) bounds the real step's allocated peak from above, by no more than that cap: everything
// else is the same runtime code allocating the same tensors.
TEST(GptStepGpuPolicies, TheDryRunBoundsTheStepsPeak) {
  MEMFIT_REQUIRE_GPU();
  for (const char* checkpoint : {"none", "all"}) {
    SCOPED_TRACE(checkpoint);
    const ModelSpec spec = step_spec(4);
    const Batch b = make_batch(8, spec.seq_len, spec.vocab, 51);
    GpuRig gpu(DType::kBF16);
    StepResult r;
    {
      Model m(spec, gpu.ctx);
      TrainerOptions o;
      o.policy.checkpoint = Checkpointing::parse(checkpoint, static_cast<int>(spec.layers));
      o.policy.micro_batch = 4;
      Trainer t(m, gpu.ctx, gpu.opts(o));
      r = t.step(b);
    }
    RunSpec q;
    q.model = spec;
    q.trainer.policy.dtype = DType::kBF16;
    q.trainer.policy.checkpoint = Checkpointing::parse(checkpoint, static_cast<int>(spec.layers));
    q.trainer.policy.micro_batch = 4;
    q.batch = 8;
    q.device = DeviceKind::kCuda;
    q.gpu_gemm_workspace = gpu.be.options().gemm_workspace_bytes;
    const DryRunResult d = dry_run(q);
    ASSERT_TRUE(d.fits);
    // 1 MiB: the nn kernels' small reduction scratch (CudaScratch), which the dry run does not
    // model; it is never live together with a GEMM's workspace.
    EXPECT_LE(r.peaks.allocated, d.step.allocated + kMiB);
    EXPECT_LE(d.step.allocated, r.peaks.allocated + q.gpu_gemm_workspace);
    print_figure(std::string("dry run vs gpu step peak allocated, bf16 ") + checkpoint,
                 format_bytes(d.step.allocated) + " predicted, " + format_bytes(r.peaks.allocated) +
                     " measured (reserved " + format_bytes(d.step.reserved) + " vs " +
                     format_bytes(r.peaks.reserved) + ")");
  }
}

}  // namespace
}  // namespace memfit
