// ActivationStash: activation offload. Under a checkpoint schedule a block input kept for
// recomputation (a checkpoint, core/executor.h) waits on the device from the forward that keeps
// it to the recompute that reads it; the stash copies it to pinned host memory instead and
// fetches it back one checkpoint read ahead (torchtune's and Unsloth's offloaded checkpointing),
// so the device holds O(1) checkpoints instead of one per segment.
//
//   ActivationStash stash(ctx, host);                       // host: pinned (a NullProvider in
//   stash.reserve(ctx, {0, 2}, bytes, budget, others);      //   dry runs); once per step
//   hooks.stash   = [&](int i, Act& x) { stash.put(ctx, i, x); };
//   hooks.unstash = [&](int i, int next) { return stash.take(ctx, i, next); };
//   ... ex.run(schedule, mb, dloss, hooks) ...; on an exception: stash.reset(ctx)
//
// Each slot (an x index) has host room for one checkpoint, reserved up front for the step: the
// slots checkpoint_reads() names, each `bytes` (64-byte aligned), one host allocation. Copies
// run on a copy stream of the stash's own:
// - put(i, x): the copy to the host waits (on the copy stream) for the compute so far, which
//   wrote x. The stash keeps the device tensor until the next put, when the compute stream
//   waits for that copy and the tensor is dropped: at most one checkpoint (the latest) stays on
//   the device while the forward goes on, and its copy has a block's forward to hide behind.
// - take(i, next): the latest (still on the device) is returned as it is, after the compute
//   stream waits for its copy out; a checkpoint fetched ahead is returned once the compute stream
//   waits for its fetch; otherwise it is fetched now. Then `next`, when it is on the host only,
//   is fetched into a new device tensor (Category::kActivation, tag "checkpoint_fetch") while
//   this checkpoint's segment recomputes and runs its backwards.
// Every allocation and free happens at a fixed point of the executor's op sequence, so a dry
// run (meta backend, NullProvider host) predicts the device peak and the host bytes exactly.
// Bit-identical to keeping the checkpoints: the bits go out and come back unchanged.
// put() leaves a tensor another holder shares (its memory would not be freed), or one larger
// than its slot's room (InvalidArgument), alone. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/layer.h"
#include "memory/provider.h"
#include "memory/stream.h"
#include "profiler/host_region.h"

namespace memfit {

class ActivationStash {
 public:
  ActivationStash(LayerContext& ctx, MemoryProvider& host);
  ~ActivationStash();  // drains its copy stream, then frees the host room
  ActivationStash(const ActivationStash&) = delete;
  ActivationStash& operator=(const ActivationStash&) = delete;

  // Host room for checkpoints of up to `bytes` in each of `slots` (x indices >= 0, repeats
  // ignored). Keeps the room it has when that covers it; otherwise waits for its copies and
  // allocates anew. The room counts against `host_budget` (0: no limit) beside `others` bytes
  // pinned elsewhere (an offloading optimizer's slab): OutOfMemory with OomInfo::host (its
  // requested_bytes: others + the room) over it, or when the host has no such memory; nothing
  // changes then. Only between micro-batches (no checkpoint stashed).
  void reserve(LayerContext& ctx, const std::vector<int>& slots, std::size_t bytes,
               std::size_t host_budget, std::size_t others);

  // Takes checkpoint x of slot i (x is null after) unless another holder shares it.
  // InvalidArgument for a slot with no room, one already stashed, or x over the room.
  void put(LayerContext& ctx, int i, Act& x);
  // Slot i's checkpoint on the device, with the same bits; fetches `next` (-1: none) ahead.
  // InvalidArgument unless slot i holds one.
  Act take(LayerContext& ctx, int i, int next);
  // Abandons what is in flight (an exception): the compute stream waits for every copy, every
  // device tensor is dropped, every slot is empty. The host room stays.
  void reset(LayerContext& ctx) noexcept;

  std::size_t host_bytes() const { return room_bytes_; }  // pinned bytes held (activation)
  bool idle() const;                                      // no slot holds a checkpoint
  std::int64_t puts() const { return puts_; }
  std::int64_t fetches() const { return fetches_; }  // host -> device copies

 private:
  enum class State : std::uint8_t { kEmpty, kOut, kHost, kFetched };
  struct Slot {
    int x = -1;                   // the x index, -1: no room
    State state = State::kEmpty;  // kOut: copy out queued, device tensor still held
    Act device;                   // kOut: the original; kFetched: the fetched copy
    Shape shape;                  // the checkpoint's
    DType dtype = DType::kF32;
    std::optional<EventHandle> copied;  // kOut: the copy out; kFetched: the fetch
  };
  Slot* find(int i);
  Slot& slot_of(int i, const char* what);
  Tensor host_view(const Slot& s) const;
  void fetch(LayerContext& ctx, Slot& s);
  void settle(LayerContext& ctx, Slot& s);  // the compute stream waits for its copy

  Backend* be_;
  MemoryProvider* host_;
  StreamId copy_ = kDefaultStream;
  std::vector<Slot> slots_;
  void* room_ = nullptr;
  std::size_t room_bytes_ = 0;
  HostRegion region_;           // the room, for the profiler (none over a NullProvider)
  std::size_t slot_bytes_ = 0;  // each slot's room
  int latest_ = -1;             // the slot in kOut, -1: none
  std::int64_t puts_ = 0, fetches_ = 0;
};

}  // namespace memfit
