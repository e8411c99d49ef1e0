#include "core/model.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/layers/transformer_block.h"
#include "core/rng.h"
#include "core/rope.h"
#include "memory/error.h"

namespace memfit {

namespace {

// p's initial FP32 values, drawn from rng (GPT-2's scheme, core/parameter.h's ParamInit).
void fill_init(const Parameter& p, Rng& rng, float* out) {
  const auto n = static_cast<std::size_t>(p.numel());
  switch (p.init.kind) {
    case ParamInit::Kind::kZeros:
      std::fill(out, out + n, 0.0f);
      break;
    case ParamInit::Kind::kOnes:
      std::fill(out, out + n, 1.0f);
      break;
    case ParamInit::Kind::kNormal:
      for (std::size_t i = 0; i < n; ++i) out[i] = rng.normal() * p.init.std;
      break;
  }
}

}  // namespace

Model::Model(const ModelSpec& spec, LayerContext& ctx, ParamPlacement placement)
    : spec_(spec), dtype_(ctx.dtype), device_(ctx.device()), placement_(placement) {
  spec_.validate();
  const int n = static_cast<int>(spec_.layers);
  blocks_.reserve(static_cast<std::size_t>(n));
  const bool llama = spec_.kind == ModelSpec::Kind::kLlama;
  LlamaBlockShape shape;
  if (llama) {
    const std::int64_t hs = spec_.resolved_head_dim();
    shape.attention =
        AttentionShape{.heads = spec_.heads,
                       .kv_heads = spec_.resolved_kv_heads(),
                       .head_dim = hs,
                       .qkv_bias = spec_.qkv_bias,
                       .proj_bias = spec_.proj_bias,
                       .rope = true,
                       .freqs = rope_frequencies(hs, spec_.rope_theta, spec_.rope_scaling),
                       .qk_norm = spec_.qk_norm,
                       .qk_norm_eps = spec_.ln_eps};
    shape.inner = spec_.intermediate;
    shape.mlp_bias = spec_.mlp_bias;
    shape.rms_eps = spec_.ln_eps;
  }
  for (int i = 0; i < n; ++i) {
    // HuggingFace's names: GPT-2's blocks are h.<i>, the Llama family's layers.<i>.
    const std::string name = (llama ? "layers." : "h.") + std::to_string(i);
    if (llama) {
      blocks_.push_back(
          std::make_unique<LlamaBlock>(name, spec_.hidden, shape, spec_.layers, spec_.attention));
    } else if (spec_.kind == ModelSpec::Kind::kGpt) {
      blocks_.push_back(std::make_unique<TransformerBlock>(name, spec_.hidden, spec_.heads,
                                                           spec_.mlp_ratio, spec_.layers,
                                                           spec_.ln_eps, spec_.attention));
    } else {
      blocks_.push_back(std::make_unique<MLPBlock>(name, spec_.hidden, spec_.mlp_ratio,
                                                   spec_.layers, spec_.ln_eps));
    }
  }
  build(ctx);
}

Model::Model(const ModelSpec& spec, std::vector<std::unique_ptr<Layer>> blocks, LayerContext& ctx,
             ParamPlacement placement)
    : spec_(spec),
      dtype_(ctx.dtype),
      device_(ctx.device()),
      placement_(placement),
      blocks_(std::move(blocks)) {
  if (blocks_.empty()) {
    throw InvalidArgument("Model: an empty chain of blocks; valid: at least one block");
  }
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    if (!blocks_[i]) {
      throw InvalidArgument("Model: block " + std::to_string(i) +
                            " is null; valid: every block a Layer");
    }
  }
  spec_.layers = static_cast<std::int64_t>(blocks_.size());
  spec_.validate();
  build(ctx);
}

void Model::build(LayerContext& ctx) {
  const bool llama = spec_.kind == ModelSpec::Kind::kLlama;
  embedding_ = std::make_unique<TokenEmbedding>("emb", spec_.vocab, spec_.seq_len, spec_.hidden,
                                                /*positions=*/!llama);
  head_ = std::make_unique<LmHead>("head", spec_.vocab, spec_.hidden,
                                   spec_.tied_head ? &embedding_->wte() : nullptr,
                                   llama ? HeadNorm::kRMSNorm : HeadNorm::kLayerNorm, spec_.ln_eps);
  // Names must be unique: optimizers and training-state files key on them. Checked before any
  // allocation so a bad user chain costs nothing.
  std::set<std::string> names;
  for (Parameter* p : parameters()) {
    if (!names.insert(p->name).second) {
      throw InvalidArgument("Model: two parameters are named '" + p->name +
                            "'; valid: unique names (give each block its own name prefix)");
    }
  }
  // In parameters() order, so the allocator's layout is the same on every backend. On an
  // exception the members already allocated free their blocks as the Model unwinds.
  const ParamAlloc a{ctx.alloc, dtype_, device_, ctx.stream, placement_};
  embedding_->allocate(a);
  for (auto& b : blocks_) b->allocate(a);
  head_->allocate(a);
}

Layer& Model::block(int i) {
  if (i < 0 || i >= num_blocks()) {
    throw InvalidArgument("Model::block(" + std::to_string(i) + "): valid: 0 to " +
                          std::to_string(num_blocks() - 1));
  }
  return *blocks_[static_cast<std::size_t>(i)];
}

std::vector<Parameter*> Model::parameters() {
  std::vector<Parameter*> out = embedding_parameters();
  for (int i = 0; i < num_blocks(); ++i) {
    for (Parameter* p : block_parameters(i)) out.push_back(p);
  }
  for (Parameter* p : head_parameters()) out.push_back(p);
  return out;
}

std::vector<Parameter*> Model::block_parameters(int i) {
  std::vector<Parameter*> out;
  for (Parameter* p : block(i).parameters()) {
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

std::vector<Parameter*> Model::head_parameters() {
  std::vector<Parameter*> out;
  for (Parameter* p : head_->parameters()) {
    if (p != &embedding_->wte()) out.push_back(p);  // a tied wte is the embedding's
  }
  return out;
}

std::vector<Parameter*> Model::embedding_parameters() { return embedding_->parameters(); }

std::vector<Model::BackwardStage> Model::backward_stages() {
  std::vector<BackwardStage> out;
  out.reserve(static_cast<std::size_t>(num_blocks()) + 2);
  out.push_back({head_->parameters(), head_parameters()});
  for (int i = num_blocks() - 1; i >= 0; --i) {
    std::vector<Parameter*> own = block_parameters(i);
    out.push_back({own, own});
  }
  out.push_back({embedding_parameters(), embedding_parameters()});
  return out;
}

std::vector<std::vector<Parameter*>> Model::weight_units() {
  std::vector<std::vector<Parameter*>> out;
  out.reserve(static_cast<std::size_t>(num_blocks()) + 2);
  out.push_back(embedding_parameters());
  for (int i = 0; i < num_blocks(); ++i) out.push_back(block_parameters(i));
  std::vector<Parameter*> head;
  for (Parameter* p : head_->parameters()) {
    if (std::find(head.begin(), head.end(), p) == head.end()) head.push_back(p);
  }
  out.push_back(std::move(head));
  return out;
}

std::int64_t Model::parameter_count() {
  std::int64_t n = 0;
  for (Parameter* p : parameters()) n += p->numel();
  return n;
}

void Model::init(std::uint64_t seed, LayerContext& ctx) {
  Backend& be = ctx.backend;
  const bool meta = be.device() == Device::kMeta;
  Rng rng(seed);
  std::vector<float> host;
  std::vector<unsigned char> rounded;  // a low-precision weight without a device master
  for (Parameter* p : parameters()) {
    const bool on_host = !p->master_on_device() && p->host_master.defined();
    const bool weight_on_host = !p->weight_on_device() && p->host_weight.defined();
    const bool sharded = !p->master_on_device() && !on_host && p->shard_master.defined();
    if (!p->weight_on_device() && !(weight_on_host && on_host)) {
      throw InvalidArgument("Model::init: parameter '" + p->name +
                            "' has no working weight on the device, and no host weight and "
                            "master; valid: build the model with weights, or bind host weights "
                            "and masters (an optimizer offloading the weights)");
    }
    // The working weight's dtype, wherever it lives.
    const DType wt = weight_on_host ? p->host_weight.dtype() : p->weight.view().dtype();
    if (!p->master_on_device() && !on_host && !sharded && wt != DType::kF32) {
      throw InvalidArgument("Model::init: parameter '" + p->name + "' (" + dtype_name(wt) +
                            ") has no f32 master on the device or the host; valid: build the "
                            "model with masters, or bind host masters (an offloading optimizer) "
                            "or master shards (a ZeRO one)");
    }
    if (sharded) {
      // This rank's chunk of the FP32 values into its master shard; the whole working weight
      // is their rounding, made on the host and copied up, as on every other rank.
      const Tensor shard = p->shard_master;
      if (meta) {  // a host shard (optimizer offload) is an address only: not touched
        if (shard.device() == Device::kMeta) be.fill(ctx.stream, shard, 0.0f);
        be.fill(ctx.stream, p->weight.view(), 0.0f);
        continue;
      }
      const auto n = static_cast<std::size_t>(p->numel());
      host.resize(n);
      fill_init(*p, rng, host.data());
      be.copy(ctx.stream,
              Tensor(host.data() + p->shard_offset, Shape{shard.numel()}, DType::kF32,
                     Device::kCpu),
              shard.reshape(Shape{shard.numel()}));
      rounded.resize(n * dtype_size(wt));
      convert(host.data(), DType::kF32, rounded.data(), wt, n);
      be.copy(ctx.stream, Tensor(rounded.data(), p->shape, wt, Device::kCpu), p->weight.view());
      be.synchronize(ctx.stream);  // `host` and `rounded` are reused for the next parameter
      continue;
    }
    // Where the FP32 values go: the device master, the f32 weight, or a host master.
    const Tensor master = p->master_on_device() || !on_host ? p->master_view() : p->host_master;
    if (meta) {
      // No host values to copy on a dry run; a fill stands for the upload (no allocation either
      // way, so the allocator sees the same run).
      const Tensor target = on_host ? p->weight.view() : master;
      if (target.raw() != nullptr) be.fill(ctx.stream, target, 0.0f);
    } else if (on_host) {
      // Straight into the pinned master; the working weight is its rounding, copied up (or,
      // under weight offload, written beside it on the host; an f32 one is the master itself).
      float* m = static_cast<float*>(master.raw());
      fill_init(*p, rng, m);
      const auto n = static_cast<std::size_t>(p->numel());
      if (weight_on_host) {
        if (wt != DType::kF32) convert(m, DType::kF32, p->host_weight.raw(), wt, n);
        continue;
      }
      const void* src = m;
      if (wt != DType::kF32) {
        rounded.resize(n * dtype_size(wt));
        convert(m, DType::kF32, rounded.data(), wt, n);
        src = rounded.data();
      }
      be.copy(ctx.stream, Tensor(const_cast<void*>(src), p->shape, wt, Device::kCpu),
              p->weight.view());
      be.synchronize(ctx.stream);  // `rounded` is reused for the next parameter
      continue;
    } else {
      host.resize(static_cast<std::size_t>(p->numel()));
      fill_init(*p, rng, host.data());
      const Tensor src(host.data(), p->shape, DType::kF32, Device::kCpu);
      be.copy(ctx.stream, src, master);
      // The host buffer is reused for the next parameter: the copy must have read it.
      be.synchronize(ctx.stream);
    }
    if (p->master_on_device()) be.cast(ctx.stream, master, p->weight.view());
  }
}

void Model::zero_grad(LayerContext& ctx) {
  for (Parameter* p : parameters()) {
    if (p->grad_on_device()) ctx.backend.fill(ctx.stream, p->grad.view(), 0.0f);
  }
}

void Model::release_saved() noexcept {
  for (auto& b : blocks_) b->release_saved();
  if (head_) head_->release_saved();
}

bool Model::any_saved() const {
  for (const auto& b : blocks_) {
    if (b->has_saved()) return true;
  }
  return head_ && head_->has_saved();
}

LayerCost Model::embedding_cost(std::int64_t seq_len, DType dtype) const {
  return embedding_->cost(seq_len, dtype);
}

LayerCost Model::block_cost(int i, std::int64_t seq_len, DType dtype) const {
  if (i < 0 || i >= num_blocks()) {
    throw InvalidArgument("Model::block_cost(" + std::to_string(i) + "): valid: 0 to " +
                          std::to_string(num_blocks() - 1));
  }
  return blocks_[static_cast<std::size_t>(i)]->cost(seq_len, dtype);
}

LayerCost Model::head_cost(std::int64_t seq_len, DType dtype) const {
  return head_->cost(seq_len, dtype);
}

}  // namespace memfit
