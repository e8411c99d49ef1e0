#include "policies/offload_weight_ring.h"

#include <algorithm>
#include <string>
#include <utility>

#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/size.h"
#include "profiler/scoped_range.h"

namespace memfit {
namespace {

constexpr std::size_t kSliceAlign = 256;  // each slice starts as a fresh allocation would

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("WeightRing: " + what); }

std::uint32_t fetch_range_id() {
  static const std::uint32_t id = intern_name("weights_to_device");
  return id;
}

// Byte offsets of each unit's parameters in one buffer, and the largest unit's end: one
// function for the ring and for the planner (buffer_bytes), so the two cannot disagree.
std::size_t lay_out(const std::vector<std::vector<Parameter*>>& units, DType dt,
                    std::vector<std::vector<std::size_t>>* offsets) {
  std::size_t most = 0;
  if (offsets != nullptr) offsets->assign(units.size(), {});
  for (std::size_t u = 0; u < units.size(); ++u) {
    std::size_t used = 0;
    for (const Parameter* p : units[u]) {
      if (p == nullptr) bad("unit " + std::to_string(u) + " holds a null Parameter");
      used = checked_align_up(used, kSliceAlign, "WeightRing buffer");
      if (offsets != nullptr) (*offsets)[u].push_back(used);
      used = checked_add(
          used, checked_mul(static_cast<std::size_t>(p->numel()), dtype_size(dt), "weights"),
          "WeightRing buffer");
    }
    most = std::max(most, used);
  }
  return most;
}

}  // namespace

std::size_t WeightRing::buffer_bytes(const std::vector<std::vector<Parameter*>>& units, DType dt) {
  return lay_out(units, dt, nullptr);
}

WeightRing::WeightRing(LayerContext& ctx, std::vector<std::vector<Parameter*>> units, int buffers)
    : be_(&ctx.backend), copy_(kDefaultStream), device_(ctx.device()), units_(std::move(units)) {
  if (buffers < 1) bad("buffers = " + std::to_string(buffers) + "; valid: >= 1");
  if (units_.empty()) bad("no units; valid: Model::weight_units()");
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (const Parameter* p : units_[u]) {
      if (p == nullptr) bad("unit " + std::to_string(u) + " holds a null Parameter");
      const Tensor& h = p->host_weight;
      if (h.device() != Device::kCpu || h.shape() != p->shape || h.dtype() != ctx.dtype ||
          (p->numel() > 0 && h.raw() == nullptr)) {
        bad("parameter '" + p->name + "' has no host weight of its shape " + p->shape.str() +
            " in " + dtype_name(ctx.dtype) +
            "; valid: an offloading optimizer binds Parameter::host_weight first");
      }
    }
  }
  buffer_bytes_ = lay_out(units_, ctx.dtype, &offset_);
  buffers_.resize(static_cast<std::size_t>(buffers));
  if (buffer_bytes_ > 0) {
    for (Buffer& b : buffers_) {
      b.block =
          ctx.alloc.allocate(buffer_bytes_, Category::kParameter, ctx.stream, "weight_buffer");
    }
  }
  copy_ = be_->create_stream();
}

WeightRing::~WeightRing() {
  try {
    be_->destroy_stream(copy_);  // drains
    for (Buffer& b : buffers_) {
      if (b.ready) be_->release_event(*b.ready);
      if (b.free) be_->release_event(*b.free);
    }
  } catch (...) {  // a destructor reports nothing
  }
  for (const auto& unit : units_) {
    for (Parameter* p : unit) p->weight.reset();  // a lent slice of a buffer about to go
  }
}

std::size_t WeightRing::device_bytes() const { return buffer_bytes_ * buffers_.size(); }

void WeightRing::bad_unit(const char* what, int u) const {
  bad(std::string(what) + "(" + std::to_string(u) + "); valid: 0 to " +
      std::to_string(units() - 1));
}

int WeightRing::find(int unit) const {
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    if (buffers_[b].unit == unit) return static_cast<int>(b);
  }
  return -1;
}

int WeightRing::pick(int except) const {
  int best = -1;
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    if (static_cast<int>(b) == except) continue;
    if (best < 0 || buffers_[b].used < buffers_[static_cast<std::size_t>(best)].used) {
      best = static_cast<int>(b);
    }
  }
  return best;
}

Tensor WeightRing::slice(int b, int unit, std::size_t j) const {
  const Parameter& p = *units_[static_cast<std::size_t>(unit)][j];
  void* at = nullptr;
  const Block& blk = buffers_[static_cast<std::size_t>(b)].block;
  if (blk.data() != nullptr) {
    at = static_cast<unsigned char*>(blk.data()) + offset_[static_cast<std::size_t>(unit)][j];
  }
  return Tensor(at, p.shape, p.host_weight.dtype(), device_);
}

void WeightRing::fetch(int b, int unit) {
  Buffer& buf = buffers_[static_cast<std::size_t>(b)];
  const ScopedRange r(RangeKind::kOffload, fetch_range_id());
  if (buf.free) {  // the compute that last read this buffer comes first
    be_->wait_event(copy_, *buf.free);
    be_->release_event(*buf.free);
    buf.free.reset();
  }
  if (buf.ready) {
    be_->release_event(*buf.ready);
    buf.ready.reset();
  }
  const auto& params = units_[static_cast<std::size_t>(unit)];
  for (std::size_t j = 0; j < params.size(); ++j) {
    if (params[j]->numel() > 0) be_->copy(copy_, params[j]->host_weight, slice(b, unit, j));
  }
  buf.unit = unit;
  buf.ready = be_->record_event(copy_);
  ++fetches_;
}

void WeightRing::before_use(LayerContext& ctx, int u, int next) {
  if (u < 0 || u >= units()) bad_unit("before_use", u);
  if (next < -1 || next >= units()) bad_unit("before_use's next", next);
  if (open_ >= 0) {
    bad("before_use(" + std::to_string(u) + ") while unit " + std::to_string(open_unit_) +
        " is in use; valid: after_use() first");
  }
  int b = find(u);
  if (b < 0) {
    b = pick(-1);
    fetch(b, u);
  }
  Buffer& buf = buffers_[static_cast<std::size_t>(b)];
  if (buf.ready) {
    be_->wait_event(ctx.stream, *buf.ready);
    be_->release_event(*buf.ready);
    buf.ready.reset();
  }
  buf.used = ++clock_;
  const auto& params = units_[static_cast<std::size_t>(u)];
  for (std::size_t j = 0; j < params.size(); ++j) {
    params[j]->weight = OwnedTensor::borrow(slice(b, u, j));
  }
  open_ = b;
  open_unit_ = u;
  if (next >= 0 && next != u && buffers_.size() >= 2 && find(next) < 0) fetch(pick(b), next);
}

void WeightRing::after_use(LayerContext& ctx, int u) {
  if (open_ < 0 || u != open_unit_) {
    bad("after_use(" + std::to_string(u) + ") but the use in progress is " +
        (open_ < 0 ? std::string("none") : "unit " + std::to_string(open_unit_)));
  }
  Buffer& buf = buffers_[static_cast<std::size_t>(open_)];
  if (buf.free) be_->release_event(*buf.free);
  buf.free = be_->record_event(ctx.stream);
  for (Parameter* p : units_[static_cast<std::size_t>(u)]) p->weight.reset();
  open_ = -1;
  open_unit_ = -1;
}

void WeightRing::drain() { be_->synchronize(copy_); }

void WeightRing::invalidate() {
  for (Buffer& b : buffers_) b.unit = -1;
}

void WeightRing::reset(LayerContext& ctx) {
  for (Buffer& b : buffers_) {
    if (b.ready) {
      be_->wait_event(ctx.stream, *b.ready);
      be_->release_event(*b.ready);
      b.ready.reset();
    }
  }
  for (const auto& unit : units_) {
    for (Parameter* p : unit) p->weight.reset();
  }
  open_ = -1;
  open_unit_ = -1;
  invalidate();
}

}  // namespace memfit
