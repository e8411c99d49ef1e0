// train_cnn: a small convolutional classifier trained with memfit's layers, by hand, to show
// that the same layer/backend/optimizer pieces that train a GPT train a CNN too. The runtime
// (backend, allocator, GEMM/cuDNN workspace from that allocator) is the library's
// (policies/runtime_env.h), the one `memfit train` stands on.
//
//   build/examples/example_train_cnn [--backend cpu|cuda] [--dtype f32|bf16|f16] [--steps N]
//
// The task is synthetic and learnable: each 12 x 12 one-channel image holds a short bright
// line segment (4 pixels) at a random place over uniform noise, and the class is the
// segment's orientation: horizontal, vertical, diagonal or anti-diagonal (4 classes, chance
// 25%). Orientation does not depend on where the segment is, which suits convolutions
// followed by a global average pool. The network, channels-last, activations (B, H*W, C):
//   images (B,144,1) -> conv 3x3 pad 1, 16 filters -> GELU -> (B,144,16)
//                    -> conv 3x3 pad 1 stride 2, 32 filters -> GELU -> (B,36,32)
//                    -> global average pool (B,1,32) -> linear (B,1,4) -> cross-entropy
// trained with DeviceAdamW on fresh batches of 32 (so every step's batch is unseen data).
// It prints the loss and the batch accuracy every 10 steps, then evaluates a held-out set of
// 512 images, and exits 1 unless the mean loss of the last 10 steps is below half that of
// the first 10 and the held-out accuracy is at least 80%.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/device_adamw.h"
#include "core/executor.h"  // sum_losses
#include "core/layers/conv2d.h"
#include "core/layers/gelu.h"
#include "core/layers/global_avg_pool.h"
#include "core/layers/linear.h"
#include "core/rng.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "policies/runtime_env.h"

using namespace memfit;

namespace {

constexpr std::int64_t kSide = 12, kPositions = kSide * kSide, kClasses = 4, kBatch = 32;
constexpr std::int64_t kSegment = 4;

struct HostBatch {
  std::vector<float> images;         // (B, 144, 1)
  std::vector<std::int32_t> labels;  // (B)
};

// One image per label: noise in [-0.25, 0.25), the segment's pixels at 1.
HostBatch make_batch(std::int64_t b, Rng& rng) {
  HostBatch hb;
  hb.images.resize(static_cast<std::size_t>(b * kPositions));
  hb.labels.resize(static_cast<std::size_t>(b));
  for (std::int64_t i = 0; i < b; ++i) {
    float* img = hb.images.data() + i * kPositions;
    for (std::int64_t j = 0; j < kPositions; ++j) img[j] = 0.5f * rng.uniform() - 0.25f;
    const auto label = static_cast<std::int32_t>(rng.below(kClasses));
    const std::int64_t y0 = rng.below(kSide - kSegment + 1);
    const std::int64_t x0 = rng.below(kSide - kSegment + 1);
    // (dy, dx) from one pixel of the segment to the next: horizontal, vertical, diagonal,
    // anti-diagonal (which starts at the right end of its box).
    constexpr std::int64_t kStep[kClasses][2] = {{0, 1}, {1, 0}, {1, 1}, {1, -1}};
    const std::int64_t dy = kStep[label][0], dx = kStep[label][1];
    const std::int64_t xs = dx < 0 ? x0 + kSegment - 1 : x0;
    for (std::int64_t t = 0; t < kSegment; ++t) img[(y0 + t * dy) * kSide + xs + t * dx] = 1.0f;
    hb.labels[static_cast<std::size_t>(i)] = label;
  }
  return hb;
}

struct Net {
  Conv2d conv1{"conv1", Conv2dSpec{.height = kSide,
                                   .width = kSide,
                                   .in_channels = 1,
                                   .out_channels = 16,
                                   .pad_h = 1,
                                   .pad_w = 1}};
  GELU act1{"act1", 16};
  Conv2d conv2{"conv2", Conv2dSpec{.height = kSide,
                                   .width = kSide,
                                   .in_channels = 16,
                                   .out_channels = 32,
                                   .stride_h = 2,
                                   .stride_w = 2,
                                   .pad_h = 1,
                                   .pad_w = 1}};
  GELU act2{"act2", 32};
  GlobalAvgPool pool{"pool", conv2.out_positions(), 32};
  Linear fc{"fc", 32, kClasses, /*bias=*/true, /*init_std=*/0.1f};

  std::vector<Layer*> layers() { return {&conv1, &act1, &conv2, &act2, &pool, &fc}; }
  std::vector<Parameter*> parameters() {
    std::vector<Parameter*> ps;
    for (Layer* l : layers()) {
      for (Parameter* p : l->parameters()) ps.push_back(p);
    }
    return ps;
  }
  Act forward(LayerContext& ctx, Act x, bool save) {
    for (Layer* l : layers()) x = l->forward(ctx, x, save);
    return x;
  }
  void backward(LayerContext& ctx, Act dy) {
    auto ls = layers();
    for (auto it = ls.rbegin(); it != ls.rend(); ++it) dy = (*it)->backward(ctx, dy);
  }
};

// Parameters from a seeded Rng on the host, into the FP32 masters and the working copies
// (what Model::init does for a Model's parameters).
void init_params(LayerContext& ctx, const std::vector<Parameter*>& ps, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> host;
  for (Parameter* p : ps) {
    host.assign(static_cast<std::size_t>(p->numel()), 0.0f);
    if (p->init.kind == ParamInit::Kind::kNormal) {
      for (float& v : host) v = rng.normal() * p->init.std;
    } else if (p->init.kind == ParamInit::Kind::kOnes) {
      std::fill(host.begin(), host.end(), 1.0f);
    }
    const Tensor master = p->master_view();
    ctx.backend.copy(ctx.stream, Tensor(host.data(), p->shape, DType::kF32, Device::kCpu), master);
    ctx.backend.synchronize(ctx.stream);  // `host` is reused for the next parameter
    if (p->master_on_device()) ctx.backend.cast(ctx.stream, master, p->weight.view());
  }
}

// A host batch on the device: images in ctx.dtype (kInput), labels as int32 (their 4-byte
// patterns travel through copy() as f32, which never converts).
struct DeviceBatch {
  Act images;
  Block labels;
  IndexTensor targets;
};
DeviceBatch upload(LayerContext& ctx, const HostBatch& hb) {
  const auto b = static_cast<std::int64_t>(hb.labels.size());
  DeviceBatch d;
  const Shape shape{b, kPositions, 1};
  d.images = ctx.make(shape, ctx.dtype, Category::kInput, "images");
  const Tensor host(const_cast<float*>(hb.images.data()), shape, DType::kF32, Device::kCpu);
  if (ctx.dtype == DType::kF32) {
    ctx.backend.copy(ctx.stream, host, d.images->view());
  } else {
    const Act staged = ctx.make(shape, DType::kF32, Category::kInput, "images.f32");
    ctx.backend.copy(ctx.stream, host, staged->view());
    ctx.backend.cast(ctx.stream, staged->view(), d.images->view());
    ctx.backend.synchronize(ctx.stream);  // before `staged` goes (a CPU worker would need it)
  }
  d.labels =
      ctx.alloc.allocate(static_cast<std::size_t>(b) * 4, Category::kInput, ctx.stream, "labels");
  ctx.backend.copy(
      ctx.stream,
      Tensor(const_cast<std::int32_t*>(hb.labels.data()), Shape{b}, DType::kF32, Device::kCpu),
      Tensor(d.labels.data(), Shape{b}, DType::kF32, ctx.device()));
  d.targets = {static_cast<const std::int32_t*>(d.labels.data()), Shape{b}, ctx.device()};
  ctx.backend.synchronize(ctx.stream);  // the host batch may go once this returns
  return d;
}

// Correct predictions in a (B,1,classes) logits tensor: copied to the host as f32.
std::int64_t correct(LayerContext& ctx, const Tensor& logits, const HostBatch& hb) {
  const std::int64_t b = logits.numel() / kClasses;
  const Act f = ctx.make(Shape{b, kClasses}, DType::kF32, Category::kTemporary, "logits.f32");
  ctx.backend.cast(ctx.stream, logits, f->view());
  std::vector<float> host(static_cast<std::size_t>(b * kClasses));
  ctx.backend.copy(ctx.stream, f->view(),
                   Tensor(host.data(), Shape{b, kClasses}, DType::kF32, Device::kCpu));
  ctx.backend.synchronize(ctx.stream);
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < b; ++i) {
    const float* row = host.data() + i * kClasses;
    const auto pred = std::max_element(row, row + kClasses) - row;
    if (pred == hb.labels[static_cast<std::size_t>(i)]) ++n;
  }
  return n;
}

struct Args {
  std::string backend = "cpu";
  DType dtype = DType::kF32;
  int steps = 100;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const bool has_value = i + 1 < argc;
    if (k == "--backend" && has_value) {
      a.backend = argv[++i];
    } else if (k == "--dtype" && has_value) {
      a.dtype = parse_dtype(argv[++i]);
    } else if (k == "--steps" && has_value) {
      a.steps = std::atoi(argv[++i]);
    } else {
      throw InvalidArgument("train_cnn: unknown or incomplete argument '" + k +
                            "'; valid: --backend cpu|cuda, --dtype f32|bf16|f16, --steps N");
    }
  }
  if (a.backend != "cpu" && a.backend != "cuda") {
    throw InvalidArgument("train_cnn: --backend " + a.backend + "; valid: cpu, cuda");
  }
  if (a.steps < 20) {
    throw InvalidArgument("train_cnn: --steps " + std::to_string(a.steps) +
                          "; valid: >= 20 (the check compares the first and last 10 steps)");
  }
  return a;
}

int train(RuntimeEnv& env, const Args& args) {
  Backend& be = *env.backend;
  CachingAllocator& alloc = *env.alloc;
  LayerContext ctx{be, alloc, kDefaultStream, args.dtype};
  int status = 1;
  {
    Net net;
    for (Layer* l : net.layers()) l->allocate({alloc, ctx.dtype, be.device(), ctx.stream});
    const std::vector<Parameter*> params = net.parameters();
    init_params(ctx, params, /*seed=*/1);
    AdamWOptions opts;
    opts.lr = 1e-2;
    opts.weight_decay = 0.0;
    DeviceAdamW opt(params, opts, ctx);

    Rng data(2);
    std::vector<double> losses;
    std::vector<double> accuracy;
    for (int step = 1; step <= args.steps; ++step) {
      const HostBatch hb = make_batch(kBatch, data);
      const DeviceBatch d = upload(ctx, hb);
      for (Parameter* p : params) be.fill(ctx.stream, p->grad.view(), 0.0f);
      const Act logits = net.forward(ctx, d.images, /*save=*/true);
      const Act loss = ctx.make(Shape{kBatch}, DType::kF32, Category::kTemporary, "losses");
      const Act lse = ctx.make(Shape{kBatch}, DType::kF32, Category::kTemporary, "lse");
      be.crossentropy_forward(ctx.stream, logits->view(), d.targets, kClasses, loss->view(),
                              lse->view());
      accuracy.push_back(static_cast<double>(correct(ctx, logits->view(), hb)) / kBatch);
      // Mean loss over the batch: dloss = 1/B; dlogits in place over the logits.
      be.crossentropy_backward(ctx.stream, logits->view(), lse->view(), d.targets, kClasses,
                               1.0f / static_cast<float>(kBatch), nullptr, logits->view());
      net.backward(ctx, logits);
      opt.step(ctx, 1.0);
      losses.push_back(sum_losses(ctx, loss->view()) / kBatch);
      if (step % 10 == 0 || step == 1) {
        std::printf("step %4d  loss %.4f  batch accuracy %5.1f%%\n", step, losses.back(),
                    100.0 * accuracy.back());
      }
    }

    // Held-out images from another seed, forward only.
    Rng eval_rng(99);
    std::int64_t right = 0, seen = 0;
    for (int i = 0; i < 16; ++i) {
      const HostBatch hb = make_batch(kBatch, eval_rng);
      const DeviceBatch d = upload(ctx, hb);
      const Act logits = net.forward(ctx, d.images, /*save=*/false);
      right += correct(ctx, logits->view(), hb);
      seen += kBatch;
    }
    auto mean = [](const std::vector<double>& v, std::size_t from, std::size_t to) {
      double s = 0;
      for (std::size_t i = from; i < to; ++i) s += v[i];
      return s / static_cast<double>(to - from);
    };
    const std::size_t n = losses.size();
    const double first = mean(losses, 0, 10), last = mean(losses, n - 10, n);
    const double held_out = static_cast<double>(right) / static_cast<double>(seen);
    std::printf("mean loss: first 10 steps %.4f, last 10 steps %.4f (%.2fx)\n", first, last,
                first / last);
    std::printf("batch accuracy: first 10 steps %.1f%%, last 10 steps %.1f%%\n",
                100.0 * mean(accuracy, 0, 10), 100.0 * mean(accuracy, n - 10, n));
    std::printf("held-out accuracy: %.1f%% of %lld images (chance 25%%)\n", 100.0 * held_out,
                static_cast<long long>(seen));
    std::printf("peak allocated: %lld bytes\n",
                static_cast<long long>(alloc.stats().allocated_bytes[kStatAll].peak));
    const bool learned = last < 0.5 * first && held_out >= 0.8;
    std::printf("learned: %s\n", learned ? "yes" : "no");
    status = learned ? 0 : 1;
    for (Parameter* p : params) {  // before the allocator goes
      p->weight.reset();
      p->master.reset();
      p->grad.reset();
    }
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse(argc, argv);
    std::printf("train_cnn: backend %s, %s, %d steps of batch %lld\n", args.backend.c_str(),
                dtype_name(args.dtype), args.steps, static_cast<long long>(kBatch));
    // InvalidArgument (exit 2) for cuda in a build or on a machine without it.
    RuntimeEnv env = make_runtime(args.backend == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu,
                                  AllocatorConfig{});
    return train(env, args);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
