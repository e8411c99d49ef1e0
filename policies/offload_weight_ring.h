// WeightRing: weight offload's device side. The working weights (compute dtype) live on the
// host (Parameter::host_weight: an offloading optimizer's weight staging, or its masters for
// f32); each use of a weight unit (Model::weight_units(): the embedding, a block, the head)
// borrows device copies of its parameters from a small ring of buffers, fetched host -> device
// on a copy stream of the ring's own, the next use's unit one use ahead, so the device holds
// O(ring) of weights instead of O(model).
//
//   WeightRing ring(ctx, model.weight_units(), /*buffers=*/2);
//   ... around every use the executor makes (ExecutorHooks::before_use / after_use) ...
//   ring.before_use(ctx, u, next);   // p.weight = a device copy; the fetch of `next` queued
//   ring.after_use(ctx, u);          // p.weight given back; the buffer free once compute is
//   ... before the host weights are rewritten (an optimizer step, a load) ...
//   ring.drain(); <write host weights>; ring.invalidate();
//
// Bit-identical to resident weights: the compute reads the same bits from another address.
// A buffer keeps the unit it last held until invalidate(), so a use of a unit still in a
// buffer (the last block after the head, with two buffers) fetches nothing. A parameter in two
// units (a tied wte: the embedding's and the head's) gets a slice in each unit's layout.
// Device memory: buffers x the largest unit's weights (each slice 256-byte aligned), allocated
// here (Category::kParameter, tag "weight_buffer"), so dry runs count them; sizes() gives the
// same figure to the planner without a ring.
// Ordering: a fetch into a buffer waits (on the copy stream) for the compute that last read
// it; the compute stream waits for the fetch before the use. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/layer.h"
#include "memory/block.h"

namespace memfit {

// Buffers in the ring unless an option says otherwise: the next use's fetch overlaps this
// use's compute.
inline constexpr int kDefaultWeightBuffers = 2;

class WeightRing {
 public:
  // Every parameter of `units` needs a host_weight of its shape and dtype on the host.
  // InvalidArgument otherwise, or for buffers < 1, or no units.
  WeightRing(LayerContext& ctx, std::vector<std::vector<Parameter*>> units, int buffers);
  ~WeightRing();  // drains its copy stream
  WeightRing(const WeightRing&) = delete;
  WeightRing& operator=(const WeightRing&) = delete;

  // Lends unit u's parameters device copies of their host weights (fetched now unless a buffer
  // holds them), and, with two or more buffers, queues the fetch of unit `next` (-1: none)
  // into another buffer. The compute stream waits for u's fetch. InvalidArgument for a unit
  // out of range or a use still open.
  void before_use(LayerContext& ctx, int u, int next);
  // Takes unit u's weights back; its buffer is free for a fetch once the compute stream's work
  // so far is done. InvalidArgument unless u is the open use.
  void after_use(LayerContext& ctx, int u);
  // The host has every fetch queued so far done (before the host weights are written).
  void drain();
  // The host weights changed: no buffer holds a valid unit any more.
  void invalidate();
  // Abandons a use in progress (an exception): the compute stream waits for fetches in flight,
  // every lent weight is taken back, and the buffers are invalidated.
  void reset(LayerContext& ctx);

  // One buffer's bytes for these units in dtype dt (the largest unit, slices 256-byte
  // aligned): what a ring allocates per buffer. For the planner.
  static std::size_t buffer_bytes(const std::vector<std::vector<Parameter*>>& units, DType dt);

  int units() const { return static_cast<int>(units_.size()); }
  std::size_t device_bytes() const;                  // buffers x buffer bytes
  std::int64_t fetches() const { return fetches_; }  // unit fetches since construction

 private:
  struct Buffer {
    Block block;
    int unit = -1;                     // what it holds (or is being fetched), -1: nothing
    std::optional<EventHandle> ready;  // the fetch's copy event
    std::optional<EventHandle> free;   // the compute that last read it
    std::uint64_t used = 0;            // when last used (LRU)
  };
  int find(int unit) const;
  int pick(int except) const;  // the least recently used buffer other than `except`
  void fetch(int b, int unit);
  Tensor slice(int b, int unit, std::size_t j) const;
  void bad_unit(const char* what, int u) const;

  Backend* be_;
  StreamId copy_;
  Device device_;
  std::vector<std::vector<Parameter*>> units_;
  std::vector<std::vector<std::size_t>> offset_;  // per unit, per parameter: byte in a buffer
  std::vector<Buffer> buffers_;
  std::size_t buffer_bytes_ = 0;
  int open_ = -1;  // the buffer of the use in progress
  int open_unit_ = -1;
  std::uint64_t clock_ = 0;
  std::int64_t fetches_ = 0;
};

}  // namespace memfit
