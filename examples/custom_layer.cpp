// custom_layer: a user-defined Layer, and a Model built from the user's own blocks, trained
// under gradient checkpointing.
//
//   build/examples/example_custom_layer [data/corpus.txt] [steps]
//
// ChannelShift is written from scratch against core/layer.h: one parameter (a per-channel
// offset), a forward that allocates its output through the context (so the allocator, the
// budget and the reports see it), a backward that accumulates its parameter's gradient in FP32
// and returns dx, and a cost() for the planner. ShiftedMlpBlock composes it with built-in
// layers into a residual block: x + shift(proj(gelu(fc(ln(x))))). The model is a chain of
// those blocks between memfit's embedding and head; the Trainer runs it with every block
// checkpointed, and the program checks that checkpointing changed memory, not the numbers.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/layers/gelu.h"
#include "core/layers/layernorm.h"
#include "core/layers/linear.h"
#include "core/model.h"
#include "core/text_dataset.h"
#include "memory/alloc_conf.h"
#include "memory/caching_allocator.h"
#include "memory/size.h"
#include "policies/runtime_env.h"
#include "policies/trainer.h"

using namespace memfit;

// y = x + b, b a learned vector over the last dimension.
class ChannelShift final : public Layer {
 public:
  ChannelShift(std::string name, std::int64_t channels) : Layer(std::move(name)), c_(channels) {
    b_.name = this->name() + ".bias";
    b_.shape = Shape{channels};
    b_.init = {ParamInit::Kind::kZeros, 0.0f};
  }

  Act forward(LayerContext& ctx, const Act& x, bool save) override {
    Act y = ctx.make(x->view().shape(), ctx.dtype, Category::kActivation, name());
    ctx.backend.copy(ctx.stream, *x, *y);
    ctx.backend.add_bias(ctx.stream, b_.weight, *y);
    saved_ = save;  // backward needs nothing but dy: nothing to keep
    return y;
  }
  Act backward(LayerContext& ctx, const Act& dy) override {
    ctx.backend.bias_backward(ctx.stream, *dy, b_.grad);  // db += sum over rows, FP32
    Act dx = ctx.make(dy->view().shape(), ctx.dtype, Category::kTemporary, name());
    ctx.backend.copy(ctx.stream, *dy, *dx);
    saved_ = false;
    return dx;
  }
  void release_saved() noexcept override { saved_ = false; }
  bool has_saved() const override { return saved_; }
  std::vector<Parameter*> parameters() override { return {&b_}; }
  LayerCost cost(std::int64_t seq_len, DType dtype) const override {
    LayerCost c;
    c.output_bytes = seq_len * c_ * static_cast<std::int64_t>(dtype_size(dtype));
    c.forward_flops = seq_len * c_;
    c.backward_flops = seq_len * c_;
    return c;
  }

 private:
  std::int64_t c_;
  Parameter b_;
  bool saved_ = false;
};

// x + shift(proj(gelu(fc(ln(x))))): a pre-LN MLP block with the user's layer at its end.
class ShiftedMlpBlock final : public Layer {
 public:
  ShiftedMlpBlock(const std::string& name, std::int64_t c, std::int64_t layers)
      : Layer(name),
        ln_(name + ".ln", c),
        fc_(name + ".fc", c, 4 * c),
        act_(name + ".gelu", 4 * c),
        proj_(name + ".proj", 4 * c, c, true, 0.02f / std::sqrt(2.0f * float(layers))),
        shift_(name + ".shift", c) {}

  Act forward(LayerContext& ctx, const Act& x, bool save) override {
    Act h = ln_.forward(ctx, x, save);
    h = fc_.forward(ctx, h, save);
    h = act_.forward(ctx, h, save);
    h = proj_.forward(ctx, h, save);
    h = shift_.forward(ctx, h, save);
    ctx.backend.add(ctx.stream, *x, *h, *h);  // the residual, in place over our own output
    return h;
  }
  Act backward(LayerContext& ctx, const Act& dy) override {
    Act d = shift_.backward(ctx, dy);
    d = proj_.backward(ctx, d);
    d = act_.backward(ctx, d);
    d = fc_.backward(ctx, d);
    d = ln_.backward(ctx, d);
    ctx.backend.add(ctx.stream, *d, *dy, *d);  // the skip connection's share
    return d;
  }
  void release_saved() noexcept override {
    for (Layer* l : sublayers()) l->release_saved();
  }
  bool has_saved() const override { return ln_.has_saved(); }
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> ps;
    for (Layer* l : sublayers()) {
      for (Parameter* p : l->parameters()) ps.push_back(p);
    }
    return ps;
  }
  LayerCost cost(std::int64_t seq_len, DType dtype) const override {
    LayerCost c = ln_.cost(seq_len, dtype);
    c += fc_.cost(seq_len, dtype);
    c += act_.cost(seq_len, dtype);
    c += proj_.cost(seq_len, dtype);
    c += shift_.cost(seq_len, dtype);
    return c;
  }

 private:
  std::vector<Layer*> sublayers() { return {&ln_, &fc_, &act_, &proj_, &shift_}; }
  LayerNorm ln_;
  Linear fc_;
  GELU act_;
  Linear proj_;
  ChannelShift shift_;
};

struct Run {
  std::vector<double> losses;
  std::size_t peak_activation = 0;
};

Run train(const TextDataset& data, const std::string& checkpoint, int steps) {
  RuntimeEnv env = make_runtime(DeviceKind::kCpu, alloc_conf_from_env());  // policies/runtime_env.h
  LayerContext ctx{*env.backend, *env.alloc, kDefaultStream, DType::kBF16};
  ModelSpec spec;  // the embedding and head around the user's chain
  spec.name = "shifted-mlp";
  spec.vocab = 256;
  spec.seq_len = 64;
  spec.hidden = 64;
  const int kBlocks = 4;
  std::vector<std::unique_ptr<Layer>> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    blocks.push_back(
        std::make_unique<ShiftedMlpBlock>("h." + std::to_string(i), spec.hidden, kBlocks));
  }
  Model model(spec, std::move(blocks), ctx);
  TrainerOptions opt;
  opt.policy.dtype = ctx.dtype;
  opt.policy.checkpoint = Checkpointing::parse(checkpoint, kBlocks);
  opt.adamw.lr = 3e-3;
  Trainer trainer(model, ctx, opt);
  Run run;
  for (int i = 0; i < steps; ++i) {
    const StepResult r = trainer.step(data.sample(8, 64, trainer.rng()));
    run.losses.push_back(r.loss);
    run.peak_activation = std::max(run.peak_activation,
                                   r.peaks.category_peaks[category_index(Category::kActivation)]);
  }
  return run;
}

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "data/corpus.txt";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  const TextDataset data(path);
  const Run plain = train(data, "none", steps);
  const Run ckpt = train(data, "all", steps);
  for (int i = 0; i < steps; i += std::max(1, steps / 5)) {
    std::printf("step %3d  loss %.4f\n", i + 1, ckpt.losses[static_cast<std::size_t>(i)]);
  }
  std::printf("final loss %.4f (first %.4f)\n", ckpt.losses.back(), ckpt.losses.front());
  std::printf("activation peak: %s without checkpointing, %s with every block checkpointed\n",
              format_bytes(plain.peak_activation).c_str(),
              format_bytes(ckpt.peak_activation).c_str());
  // Recomputation replays the same arithmetic, so the losses match bit for bit.
  const bool same = plain.losses == ckpt.losses;
  std::printf("losses identical with and without checkpointing: %s\n", same ? "yes" : "NO");
  return same && ckpt.losses.back() < ckpt.losses.front() ? 0 : 1;
}
