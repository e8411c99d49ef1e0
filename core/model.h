// Model: token embedding, a chain of blocks, and the output head with its loss; the parameters
// of all of them. What an Executor runs and an optimizer updates.
//
//   LayerContext ctx{backend, alloc, kDefaultStream, DType::kBF16};
//   Model m(ModelSpec::preset("gpt-tiny"), ctx);     // GPT-2 blocks, parameters allocated
//   m.init(/*seed=*/1337, ctx);                     // GPT-2's initialization, deterministic
//   Executor ex(m, ctx);  ...                       // core/executor.h
//
// or with a user's blocks (each maps (B,T,hidden) to (B,T,hidden)):
//   std::vector<std::unique_ptr<Layer>> blocks; blocks.push_back(std::make_unique<MyBlock>(..));
//   Model m(spec, std::move(blocks), ctx);          // spec gives vocab, seq_len, hidden, tied
//
// Parameters are allocated when the model is built, in the compute dtype ctx.dtype (with FP32
// masters when that is not f32, and FP32 gradients; core/parameter.h), on ctx's device and
// allocator, in parameters() order: embedding, blocks in order, head; `placement` leaves the
// masters or the gradients off the device (an offloading trainer's model). init() fills them
// from a seeded Rng (core/rng.h) in that order, generating FP32 values on the host and copying
// them to the masters (the device's, or the host ones an offloading optimizer bound as
// Parameter::host_master; the rounded working copies follow), so the same seed gives the same
// model on any backend, in any compute dtype and with any placement. On the meta backend init()
// only issues the copies.
// backward_stages(): the backward in the executor's order (head, blocks n-1..0, embedding),
// each stage with the parameters it adds gradients to and those final after it.
// weight_units(): the parameters each unit of the executor reads (0 the embedding, 1 + i block
// i, n + 1 the head, a tied wte in the first and the last): what weight offload fetches for
// each use (ExecutorHooks::before_use).
// Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/layer.h"
#include "core/layers/embedding.h"
#include "core/layers/lm_head.h"
#include "core/model_spec.h"

namespace memfit {

class Model {
 public:
  // kind gpt: TransformerBlock x layers, named "h.<i>"; kind llama: LlamaBlock x layers,
  // named "layers.<i>" (HuggingFace's names), with an RMSNorm head and no position table;
  // kind mlp: MLPBlock x layers, "h.<i>".
  Model(const ModelSpec& spec, LayerContext& ctx, ParamPlacement placement = {});
  // A user's chain; spec.kind and spec.heads/layers/mlp_ratio are ignored (layers is set to
  // blocks.size()). InvalidArgument for an empty chain or a null block.
  Model(const ModelSpec& spec, std::vector<std::unique_ptr<Layer>> blocks, LayerContext& ctx,
        ParamPlacement placement = {});
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelSpec& spec() const { return spec_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const ParamPlacement& placement() const { return placement_; }

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  Layer& block(int i);  // 0 <= i < num_blocks()
  TokenEmbedding& embedding() { return *embedding_; }
  LmHead& head() { return *head_; }

  // Every parameter once (a tied wte once, in the embedding), in a fixed order.
  std::vector<Parameter*> parameters();
  // The parameters whose gradients are final once that stage's backward has run (in the last
  // micro-batch of a step): block i's; the head's own (a tied wte is the embedding's, final
  // only after the embedding's backward, the last of all).
  std::vector<Parameter*> block_parameters(int i);
  std::vector<Parameter*> head_parameters();
  std::vector<Parameter*> embedding_parameters();
  std::int64_t parameter_count();

  struct BackwardStage {
    std::vector<Parameter*> writes;  // gradients its backward adds to (a tied wte in two stages)
    std::vector<Parameter*> final;   // gradients complete after it: each parameter in one stage
  };
  // Stage 0 is the head, stage 1 + k block n-1-k, stage n + 1 the embedding: the order the
  // executor runs them in every micro-batch (ExecutorHooks::before_stage/after_stage).
  std::vector<BackwardStage> backward_stages();
  // Unit 0 the embedding, 1 + i block i, n + 1 the head (its own parameters and a tied wte):
  // the parameters each reads, each once.
  std::vector<std::vector<Parameter*>> weight_units();

  // Under weight offload (no device weight) the rounded values go to Parameter::host_weight.
  void init(std::uint64_t seed, LayerContext& ctx);
  void zero_grad(LayerContext& ctx);  // every grad on the device := 0
  // Drops every layer's saved state (an aborted step). Never throws.
  void release_saved() noexcept;
  bool any_saved() const;

  // Per-sample costs at seq_len: embedding, each block, head (for the planner and for tests).
  LayerCost embedding_cost(std::int64_t seq_len, DType dtype) const;
  LayerCost block_cost(int i, std::int64_t seq_len, DType dtype) const;
  LayerCost head_cost(std::int64_t seq_len, DType dtype) const;

 private:
  void build(LayerContext& ctx);
  ModelSpec spec_;
  DType dtype_;
  Device device_;
  ParamPlacement placement_;
  std::unique_ptr<TokenEmbedding> embedding_;
  std::vector<std::unique_ptr<Layer>> blocks_;
  std::unique_ptr<LmHead> head_;
};

}  // namespace memfit
