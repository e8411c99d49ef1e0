// Layer: the unit of a model's computation, and Block: a layer the executor may checkpoint.
//
//   LayerContext ctx{backend, alloc, stream, DType::kBF16};
//   Act y = layer.forward(ctx, x, /*save=*/true);   // keeps what backward needs
//   Act dx = layer.backward(ctx, dy);               // grads +=, saved state released
//
// Activations are shared handles (Act = shared_ptr<OwnedTensor>): a layer that needs its input
// in backward keeps the handle, not a copy, so memory is freed exactly when its last user lets
// go (as autograd's saved tensors). A forward output and everything a layer saves is allocated
// from ctx.alloc with Category::kActivation and the layer's name as tag; activation gradients
// and scratch that dies inside one call are Category::kTemporary. Every tensor is in ctx.dtype
// except statistics (LayerNorm mean/rstd, cross-entropy lse/losses) and parameter gradients,
// which are f32 (core/backend.h).
//
// Contract of forward/backward, for every layer (built-in or a user's):
// - forward(ctx, x, save): x is (B, T, C_in) on ctx.backend's device; returns a new
//   activation (B, T, C_out) (never x itself, never a view of it). With save == false nothing
//   outlives the call except the output. With save == true the layer keeps what backward
//   needs (has_saved() turns true); forward while has_saved() is a caller bug (CheckFailure).
// - backward(ctx, dy): needs has_saved(); dy has the output's shape. Accumulates (+=) the
//   gradients of parameters() and returns dx (input's shape, Category::kTemporary), then
//   releases everything it saved (has_saved() false).
// - release_saved(): drops saved state without a backward (an aborted step). Never throws.
// - The arithmetic is a deterministic function of x and the parameters: a recomputed forward
//   gives the same bits, which is what makes checkpointing exact.
// - No host reads of device data: the same code runs on the meta backend (dry runs).
// - Layers are not thread-safe; one executor drives a model at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "memory/caching_allocator.h"

namespace memfit {

using Act = std::shared_ptr<OwnedTensor>;

struct LayerContext {
  Backend& backend;
  CachingAllocator& alloc;
  StreamId stream = kDefaultStream;
  DType dtype = DType::kF32;  // activations and weights in use

  Device device() const { return backend.device(); }
  // A new tensor from alloc on the device and stream, wrapped in an Act.
  Act make(Shape shape, DType dtype, Category category, std::string_view tag) const;
};

// Per sample (one sequence of seq_len tokens) in a given dtype. The planner's cost model adds
// these up; a test compares them with what the allocator sees.
struct LayerCost {
  std::int64_t saved_bytes = 0;      // held from forward(save=true) to backward, input excluded
  bool saves_input = false;          // backward also needs the input (counted by its producer)
  std::int64_t output_bytes = 0;     // the forward output
  std::int64_t workspace_bytes = 0;  // transient peak within one forward or backward, beyond
                                     // input, output, saved and the gradients in/out
  std::int64_t forward_flops = 0;
  std::int64_t backward_flops = 0;
  // forward_for_backward()'s flops (a recomputation whose output nobody reads); -1: those of
  // forward(), as the default forward_for_backward runs it. A layer that overrides it says.
  std::int64_t for_backward_flops = -1;

  std::int64_t flops_for_backward() const {
    return for_backward_flops < 0 ? forward_flops : for_backward_flops;
  }
  // Sums; saves_input ORs; for_backward_flops becomes -1 (a sum of layers recomputes as its
  // forward unless the layer that sums them says otherwise).
  LayerCost& operator+=(const LayerCost& o);
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }

  virtual Act forward(LayerContext& ctx, const Act& x, bool save) = 0;
  // What backward() needs and no more: saves as forward(ctx, x, true) does and makes no
  // output. For a recomputation whose output nobody reads (a checkpointed block recomputed
  // just before its backward): a layer whose last op only makes the output (a projection into
  // the residual stream, whose backward needs its input and weight, not its output) skips it.
  // By default forward(ctx, x, true), its output dropped.
  virtual void forward_for_backward(LayerContext& ctx, const Act& x);
  virtual Act backward(LayerContext& ctx, const Act& dy) = 0;
  virtual void release_saved() noexcept = 0;
  virtual bool has_saved() const = 0;

  // Parameters this layer owns or uses, in a fixed order (tied ones appear in each user).
  virtual std::vector<Parameter*> parameters() = 0;
  // Allocates its parameters (allocate_parameter) as `a` says. Called once by Model.
  virtual void allocate(const ParamAlloc& a);

  virtual LayerCost cost(std::int64_t seq_len, DType dtype) const = 0;

 private:
  std::string name_;
};

}  // namespace memfit
