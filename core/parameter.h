// Parameter: one trainable tensor of a model, with its gradient and (in mixed precision) its
// FP32 master copy.
//
//   Parameter& w = linear.weight();
//   be.gemm(s, d, x, w.weight, y);              // compute reads the working copy
//   be.gemm(s, dw, dy, x, w.grad);              // gradients accumulate (+=) in FP32
//   Tensor m = w.master_view();                 // the FP32 values the optimizer updates
//
// Memory, all from the model's CachingAllocator, tagged with the parameter's name:
// - weight: the working copy compute reads, in the model's compute dtype (f32/f16/bf16),
//   Category::kParameter.
// - master: FP32, Category::kOptimizerState (ZeRO's accounting: masters + Adam moments are the
//   "optimizer states", K = 12 bytes per parameter). Present only when the compute dtype is not
//   f32; with f32 compute the weight is its own master. An offloading optimizer moves the master
//   to pinned host memory and resets this one (master_on_device() turns false).
// - grad: FP32, Category::kGradient, accumulated over micro-batches; zeroed by the trainer at
//   the start of each step (Model::zero_grad). Under gradient offload it is not allocated: the
//   offloading optimizer lends it a slice of a device bucket for the backward of the stage that
//   writes it (OwnedTensor::borrow) and takes it back after copying it to the host.
// - host_master: a view of the FP32 master in an offloading optimizer's pinned host memory,
//   bound by that optimizer (Model::init writes a fresh model's values there directly).
// - shard_master: under ZeRO-1/2 with a 16-bit compute dtype, this rank's chunk of the FP32
//   master (the rest live on the other ranks); the model then has no device master.
// - host_weight: under weight offload, the working copy in the compute dtype on the host (the
//   optimizer's weight staging, or the master itself for f32), bound by that optimizer; the
//   device then has no weight of its own: a WeightRing lends `weight` a slice of a device buffer
//   holding a fresh copy for each use of the parameter's unit (policies/offload_weight_ring.h).
// ParamPlacement says which of weight, master and grad the model allocates on the device: an
// offloading trainer builds its model without them, so they are never on the device, not even
// at setup.
// A Parameter never moves once made (layers and optimizers hold pointers to it); the model
// owns it. Tied parameters (GPT-2's head and token embedding) are one Parameter used twice.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace memfit {

// How Model::init fills a parameter (GPT-2's scheme: weights N(0, 0.02), the projections that
// write into the residual stream N(0, 0.02/sqrt(2 * layers)), biases 0, LayerNorm gains 1).
struct ParamInit {
  enum class Kind : std::uint8_t { kZeros, kOnes, kNormal };
  Kind kind = Kind::kZeros;
  float std = 0.0f;  // kNormal only
};

struct Parameter {
  Parameter() = default;
  Parameter(const Parameter&) = delete;
  Parameter& operator=(const Parameter&) = delete;

  std::string name;  // "h.3.attn.qkv.weight": unique within a model
  Shape shape;
  ParamInit init;
  OwnedTensor weight;  // compute dtype, kParameter; lent for one use under weight offload
  OwnedTensor master;  // f32, kOptimizerState; empty when weight is f32 or after offload
  OwnedTensor grad;    // f32, kGradient; lent for one stage's backward under gradient offload
  Tensor host_master;  // f32 on the host, when an offloading optimizer holds the master
  Tensor host_weight;  // compute dtype on the host, when an offloading optimizer holds it
  // ZeRO-1/2 (policies/zero_adamw.h): this rank's chunk of the f32 master on the device,
  // elements [shard_offset, shard_offset + shard_master.numel()) of the flattened parameter,
  // bound by the sharding optimizer (Model::init writes that chunk of a fresh model there).
  Tensor shard_master;
  std::int64_t shard_offset = 0;
  bool placed = false;  // allocate_parameter ran (a tied parameter is allocated once)

  std::int64_t numel() const { return shape.numel(); }
  bool master_on_device() const { return master.view().raw() != nullptr; }
  bool grad_on_device() const { return grad.view().raw() != nullptr; }
  bool weight_on_device() const { return weight.view().raw() != nullptr; }
  // The FP32 values an on-device optimizer updates: master when present, else weight (f32).
  // MEMFIT_CHECKs that one of them is f32 on the device.
  Tensor master_view() const;
};

class CachingAllocator;

// What of each parameter the model allocates on the device besides its working weight.
struct ParamPlacement {
  bool weight = true;  // the working weight; false: weight offload (lent per use)
  bool master = true;  // the f32 master (compute dtype != f32 only); false: optimizer offload
  bool grad = true;    // the f32 gradient; false: gradient offload (lent per stage)
  bool operator==(const ParamPlacement&) const = default;
};

// Where and how a layer allocates its parameters (Layer::allocate).
struct ParamAlloc {
  CachingAllocator& alloc;
  DType compute = DType::kF32;
  Device device = Device::kCpu;
  StreamId stream = kDefaultStream;
  ParamPlacement placement;
};

// Allocates p.weight (compute dtype, when placement.weight), p.master (f32, only when
// compute != f32 and placement.master) and p.grad (f32, when placement.grad) for p.shape,
// tagged p.name, uninitialized; sets p.placed. InvalidArgument for an empty name.
void allocate_parameter(Parameter& p, const ParamAlloc& a);

}  // namespace memfit
