#include "policies/offload_grad_ring.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/size.h"
#include "profiler/scoped_range.h"

namespace memfit {
namespace {

constexpr std::size_t kSliceAlign = 256;  // each slice starts as a fresh allocation would

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("GradRing: " + what); }

struct RingRangeIds {
  std::uint32_t grads_to_host = intern_name("grads_to_host");
  std::uint32_t grads_to_device = intern_name("grads_to_device");
};
const RingRangeIds& range_ids() {
  static const RingRangeIds ids;
  return ids;
}

// Where each parameter's gradient lives: written by one stage, a slice of that stage's bucket
// at byte[h]; written by several (first != last), a buffer of its own. One function for the
// ring and for the planner's estimate (GradRing::sizes), so the two cannot disagree.
struct Layout {
  std::vector<int> first, last;
  std::vector<std::size_t> byte;
  std::size_t bucket_bytes = 0;  // the largest stage's slices
  std::size_t own_bytes = 0;     // the multi-stage parameters' buffers
};

template <typename HomeOf, typename ParamOf>
Layout lay_out(std::size_t n, const std::vector<Model::BackwardStage>& stages, HomeOf home_of,
               ParamOf param_of) {
  Layout l;
  l.first.assign(n, -1);
  l.last.assign(n, -1);
  l.byte.assign(n, 0);
  std::vector<int> finals(n, 0);
  for (std::size_t s = 0; s < stages.size(); ++s) {
    for (const Parameter* p : stages[s].writes) {
      const std::size_t h = home_of(p);
      if (l.first[h] < 0) l.first[h] = static_cast<int>(s);
      l.last[h] = static_cast<int>(s);
    }
    for (const Parameter* p : stages[s].final) ++finals[home_of(p)];
  }
  std::vector<std::size_t> used(stages.size(), 0);  // per stage: bytes of its slices so far
  for (std::size_t h = 0; h < n; ++h) {
    const Parameter* p = param_of(h);
    if (finals[h] != 1 || l.first[h] < 0) {
      bad("parameter '" + p->name + "' is final in " + std::to_string(finals[h]) +
          " stages and written by " + (l.first[h] < 0 ? "none" : "some") +
          "; valid: written by a stage and final in exactly one");
    }
    const std::size_t bytes =
        checked_mul(static_cast<std::size_t>(p->numel()), sizeof(float), "GradRing gradient");
    if (l.first[h] == l.last[h]) {
      std::size_t& u = used[static_cast<std::size_t>(l.first[h])];
      u = checked_align_up(u, kSliceAlign, "GradRing bucket");
      l.byte[h] = u;
      u = checked_add(u, bytes, "GradRing bucket");
      l.bucket_bytes = std::max(l.bucket_bytes, u);
    } else {
      l.own_bytes = checked_add(l.own_bytes, bytes, "GradRing buffers");
    }
  }
  return l;
}

}  // namespace

GradRing::Sizes GradRing::sizes(const std::vector<Model::BackwardStage>& stages) {
  std::vector<const Parameter*> params;
  std::unordered_map<const Parameter*, std::size_t> index;
  for (const Model::BackwardStage& st : stages) {
    for (const Parameter* p : st.writes) {
      if (index.emplace(p, params.size()).second) params.push_back(p);
    }
  }
  const Layout l = lay_out(
      params.size(), stages,
      [&](const Parameter* p) {
        auto it = index.find(p);
        if (it == index.end()) bad("parameter '" + p->name + "' is final but never written");
        return it->second;
      },
      [&](std::size_t h) { return params[h]; });
  return Sizes{l.bucket_bytes, l.own_bytes};
}

GradRing::GradRing(LayerContext& ctx, StreamId copy, std::vector<Home> homes,
                   const std::vector<Model::BackwardStage>& stages, int buckets)
    : be_(&ctx.backend), copy_(copy), device_(ctx.device()), homes_(std::move(homes)) {
  if (buckets < 1) bad("buckets = " + std::to_string(buckets) + "; valid: >= 1");
  std::unordered_map<const Parameter*, std::size_t> index;
  for (std::size_t h = 0; h < homes_.size(); ++h) index.emplace(homes_[h].p, h);
  const auto home_of = [&](const Parameter* p) {
    auto it = index.find(p);
    if (it == index.end()) {
      bad("stage parameter '" + (p ? p->name : std::string("(null)")) +
          "' is not one the optimizer holds");
    }
    return it->second;
  };
  const Layout lay =
      lay_out(homes_.size(), stages, home_of, [&](std::size_t h) { return homes_[h].p; });
  stages_.resize(stages.size());
  byte_ = lay.byte;
  own_.assign(homes_.size(), -1);
  bucket_bytes_ = lay.bucket_bytes;
  for (std::size_t h = 0; h < homes_.size(); ++h) {
    if (lay.first[h] == lay.last[h]) {
      stages_[static_cast<std::size_t>(lay.first[h])].ring.push_back(h);
    } else {
      const std::size_t bytes = static_cast<std::size_t>(homes_[h].p->numel()) * sizeof(float);
      own_[h] = static_cast<int>(own_blocks_.size());
      own_blocks_.push_back(bytes == 0 ? Block()
                                       : ctx.alloc.allocate(bytes, Category::kGradient, ctx.stream,
                                                            homes_[h].p->name));
      own_free_.emplace_back();
      stages_[static_cast<std::size_t>(lay.first[h])].opens.push_back(h);
      stages_[static_cast<std::size_t>(lay.last[h])].closes.push_back(h);
    }
  }
  for (Stage& st : stages_) {
    st.sent = st.ring;
    st.sent.insert(st.sent.end(), st.closes.begin(), st.closes.end());
  }
  if (bucket_bytes_ > 0) {
    for (int b = 0; b < buckets; ++b) {
      buckets_.push_back(
          ctx.alloc.allocate(bucket_bytes_, Category::kGradient, ctx.stream, "grad_bucket"));
    }
  }
  bucket_free_.resize(static_cast<std::size_t>(buckets));
}

GradRing::~GradRing() {
  try {
    for (auto& e : bucket_free_) {
      if (e) be_->release_event(*e);
    }
    for (auto& e : own_free_) {
      if (e) be_->release_event(*e);
    }
    for (Stage& st : stages_) {
      if (st.ready) be_->release_event(*st.ready);
    }
  } catch (...) {  // a destructor reports nothing
  }
  for (Home& h : homes_) {
    if (!h.p->grad_on_device()) continue;
    h.p->grad.reset();  // a lent slice of a bucket about to go
  }
}

std::size_t GradRing::device_bytes() const {
  std::size_t n = bucket_bytes_ * buckets_.size();
  for (const Block& b : own_blocks_) n += b.size();
  return n;
}

Tensor GradRing::slice(int s, std::size_t home) const {
  const Parameter& p = *homes_[home].p;
  void* at = nullptr;
  if (own_[home] >= 0) {
    at = own_blocks_[static_cast<std::size_t>(own_[home])].data();
  } else if (!buckets_.empty()) {
    const Block& b = buckets_[bucket_of(s)];
    at = static_cast<unsigned char*>(b.data()) + byte_[home];
  }
  return Tensor(at, p.shape, DType::kF32, device_);
}

// The compute stream waits for the copy that last read this memory, then forgets it.
void GradRing::wait_free(LayerContext& ctx, std::optional<EventHandle>& free_event) {
  if (!free_event) return;
  be_->wait_event(ctx.stream, *free_event);
  be_->release_event(*free_event);
  free_event.reset();
}

void GradRing::prepare(LayerContext& ctx, int s, bool first) {
  Stage& st = stages_[static_cast<std::size_t>(s)];
  if (st.prepared) return;
  st.prepared = true;
  const auto homes_here = [&](auto&& f) {
    for (std::size_t h : st.ring) f(h);
    for (std::size_t h : st.opens) f(h);
  };
  if (first) {
    // A fresh step: zeros, as Model::zero_grad gives resident gradients.
    if (!st.ring.empty()) wait_free(ctx, bucket_free_[bucket_of(s)]);
    for (std::size_t h : st.opens) wait_free(ctx, own_free_[static_cast<std::size_t>(own_[h])]);
    homes_here([&](std::size_t h) {
      if (homes_[h].p->numel() > 0) be_->fill(ctx.stream, slice(s, h), 0.0f);
    });
    return;
  }
  // The host's running sum back into the bucket, behind the copy that emptied it (FIFO).
  const ScopedRange r(RangeKind::kOffload, range_ids().grads_to_device);
  homes_here([&](std::size_t h) {
    const Parameter& p = *homes_[h].p;
    if (p.numel() > 0) {
      be_->copy(copy_, Tensor(homes_[h].host, p.shape, DType::kF32, Device::kCpu), slice(s, h));
    }
  });
  st.ready = be_->record_event(copy_);
}

void GradRing::before_stage(LayerContext& ctx, int s, bool first_micro_batch) {
  if (s < 0 || s >= stages()) {
    bad("before_stage(" + std::to_string(s) + "); valid: 0 to " + std::to_string(stages() - 1));
  }
  prepare(ctx, s, first_micro_batch);
  Stage& st = stages_[static_cast<std::size_t>(s)];
  if (st.ready) {
    be_->wait_event(ctx.stream, *st.ready);
    be_->release_event(*st.ready);
    st.ready.reset();
  }
  for (std::size_t h : st.ring) homes_[h].p->grad = OwnedTensor::borrow(slice(s, h));
  for (std::size_t h : st.opens) homes_[h].p->grad = OwnedTensor::borrow(slice(s, h));
  // Refill the next stage's bucket while this one runs (it was emptied a stage or more ago).
  if (!first_micro_batch && bucket_free_.size() >= 2 && s + 1 < stages()) {
    prepare(ctx, s + 1, false);
  }
}

const std::vector<std::size_t>& GradRing::after_stage(LayerContext& ctx, int s) {
  if (s < 0 || s >= stages()) {
    bad("after_stage(" + std::to_string(s) + "); valid: 0 to " + std::to_string(stages() - 1));
  }
  Stage& st = stages_[static_cast<std::size_t>(s)];
  if (!st.prepared) bad("after_stage(" + std::to_string(s) + ") without before_stage");
  st.prepared = false;
  const ScopedRange r(RangeKind::kOffload, range_ids().grads_to_host);
  const EventHandle produced = be_->record_event(ctx.stream);
  be_->wait_event(copy_, produced);
  be_->release_event(produced);
  for (std::size_t h : st.sent) {
    Parameter& p = *homes_[h].p;
    if (p.numel() > 0) {
      be_->copy(copy_, slice(s, h), Tensor(homes_[h].host, p.shape, DType::kF32, Device::kCpu));
    }
    p.grad.reset();
  }
  if (!st.ring.empty()) {
    auto& e = bucket_free_[bucket_of(s)];
    if (e) be_->release_event(*e);
    e = be_->record_event(copy_);
  }
  for (std::size_t h : st.closes) {
    auto& e = own_free_[static_cast<std::size_t>(own_[h])];
    if (e) be_->release_event(*e);
    e = be_->record_event(copy_);
  }
  return st.sent;
}

void GradRing::reset(LayerContext& ctx) {
  for (Stage& st : stages_) {
    if (st.ready) {
      be_->wait_event(ctx.stream, *st.ready);
      be_->release_event(*st.ready);
      st.ready.reset();
    }
    st.prepared = false;
  }
  for (Home& h : homes_) h.p->grad.reset();
}

}  // namespace memfit
