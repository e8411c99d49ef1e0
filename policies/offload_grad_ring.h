// GradRing: gradient offload's device side (ZeRO-Offload's split). The parameters' FP32
// gradients live on the host; during each backward stage (Model::backward_stages()) the
// gradients it writes get device memory lent from a small ring of buckets, and after the stage
// they go device -> host on the copy stream, so the device never holds more than the ring.
//
//   GradRing ring(ctx, copy, homes, model.backward_stages(), /*buckets=*/2);
//   ... in every micro-batch, around stage s's backward (ExecutorHooks) ...
//   ring.before_stage(ctx, s, first);          // p.grad = a zeroed (first) or refilled slice
//   const auto& sent = ring.after_stage(ctx, s);  // D2H queued; p.grad given back
//
// Accumulation sums exactly as on the device: the first micro-batch of a step starts each
// stage's bucket at zero (as Model::zero_grad would), a later one copies the host's running sum
// back into the bucket (host -> device) before the stage runs, so the backward's kernels add
// into the same FP32 values in the same order as with resident gradients: gradient offload is
// bit-identical to no offload, with and without accumulation, at the cost of one extra
// host -> device copy of the gradients per micro-batch after the first. With two or more
// buckets that refill is issued one stage ahead (during the previous stage's backward).
// A parameter written by more than one stage (a tied wte: the head's backward and the
// embedding's) keeps a buffer of its own from its first stage to its last instead of a bucket
// slice. Device memory: buckets x the largest stage's gradients + those buffers, allocated here
// (Category::kGradient, tags "grad_bucket" and the parameter's name), so dry runs count them.
// Ordering: every copy is on the one copy stream (FIFO): a bucket's refill queues behind the
// copy that emptied it; the compute stream waits on the copy's event before it zeroes a bucket
// or writes a refilled one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/layer.h"
#include "core/model.h"
#include "memory/block.h"

namespace memfit {

// Buckets in the ring unless an option says otherwise: one stage's copies out overlap the next
// stage's backward (and its refill).
inline constexpr int kDefaultGradBuckets = 2;

class GradRing {
 public:
  struct Home {
    Parameter* p;
    float* host;  // its FP32 gradient on the host (pinned; an address only in dry runs)
  };
  // Every parameter a stage writes must be in `homes`, and each in exactly one stage's `final`.
  // InvalidArgument otherwise, or for buckets < 1.
  GradRing(LayerContext& ctx, StreamId copy, std::vector<Home> homes,
           const std::vector<Model::BackwardStage>& stages, int buckets);
  ~GradRing();  // waits for nothing: the owner drains the copy stream first
  GradRing(const GradRing&) = delete;
  GradRing& operator=(const GradRing&) = delete;

  // Lends stage s's gradients their device memory, zeroed (first micro-batch of the step) or
  // holding the host's sum so far. The compute stream waits for it.
  void before_stage(LayerContext& ctx, int s, bool first_micro_batch);
  // Queues the D2H copies of the gradients complete after stage s (after the compute stream's
  // work so far) and takes their memory back. Returns the indices into `homes` just sent.
  const std::vector<std::size_t>& after_stage(LayerContext& ctx, int s);
  // Abandons a step in progress (an exception, a skip): the compute stream waits for refills in
  // flight, every lent gradient is taken back.
  void reset(LayerContext& ctx);

  // What a ring over these stages allocates (before the allocator's rounding): each bucket,
  // and the buffers of the parameters written by several stages. For the planner.
  struct Sizes {
    std::size_t bucket_bytes = 0, own_bytes = 0;
  };
  static Sizes sizes(const std::vector<Model::BackwardStage>& stages);

  int stages() const { return static_cast<int>(stages_.size()); }
  std::size_t bucket_bytes() const { return bucket_bytes_; }
  std::size_t device_bytes() const;  // buckets + the buffers of multi-stage parameters

 private:
  struct Stage {
    std::vector<std::size_t> ring;     // homes whose gradient is a slice of this stage's bucket
    std::vector<std::size_t> opens;    // multi-stage homes first written here
    std::vector<std::size_t> closes;   // multi-stage homes last written here
    std::vector<std::size_t> sent;     // ring + closes: what after_stage() sends
    std::optional<EventHandle> ready;  // the refill's copy event, when prefetched
    bool prepared = false;
  };
  std::size_t bucket_of(int s) const { return static_cast<std::size_t>(s) % bucket_free_.size(); }
  Tensor slice(int s, std::size_t home) const;  // home's device memory while stage s runs
  void prepare(LayerContext& ctx, int s, bool first);
  void wait_free(LayerContext& ctx, std::optional<EventHandle>& free_event);

  Backend* be_;
  StreamId copy_;
  Device device_;
  std::vector<Home> homes_;
  std::vector<std::size_t> byte_;  // per home: offset in its bucket (ring homes)
  std::vector<int> own_;           // per home: index into own_blocks_, -1 for ring homes
  std::vector<Stage> stages_;
  std::vector<Block> buckets_;
  std::vector<std::optional<EventHandle>> bucket_free_;  // the D2H that last emptied it
  std::vector<Block> own_blocks_;
  std::vector<std::optional<EventHandle>> own_free_;
  std::size_t bucket_bytes_ = 0;
};

}  // namespace memfit
