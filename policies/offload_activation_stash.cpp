#include "policies/offload_activation_stash.h"

#include <algorithm>
#include <string>
#include <utility>

#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"
#include "profiler/scoped_range.h"

namespace memfit {
namespace {

constexpr std::size_t kAlign = 64;  // each slot's room, as the optimizer's slab regions

[[noreturn]] void bad(const std::string& what) {
  throw InvalidArgument("ActivationStash: " + what);
}

std::uint32_t out_range_id() {
  static const std::uint32_t id = intern_name("acts_to_host");
  return id;
}

std::uint32_t in_range_id() {
  static const std::uint32_t id = intern_name("acts_to_device");
  return id;
}

std::size_t bytes_of(const Tensor& t) {
  return static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
}

}  // namespace

ActivationStash::ActivationStash(LayerContext& ctx, MemoryProvider& host)
    : be_(&ctx.backend), host_(&host) {
  copy_ = be_->create_stream();
}

ActivationStash::~ActivationStash() {
  try {
    be_->destroy_stream(copy_);  // drains: no copy reads or writes the room after this
    for (Slot& s : slots_) {
      if (s.copied) be_->release_event(*s.copied);
    }
  } catch (...) {  // a destructor reports nothing
  }
  slots_.clear();  // device tensors go back to the allocator
  region_ = HostRegion();
  if (room_ != nullptr) host_->deallocate(room_, room_bytes_);
}

bool ActivationStash::idle() const {
  return std::all_of(slots_.begin(), slots_.end(),
                     [](const Slot& s) { return s.state == State::kEmpty; });
}

void ActivationStash::reserve(LayerContext& ctx, const std::vector<int>& slots, std::size_t bytes,
                              std::size_t host_budget, std::size_t others) {
  (void)ctx;
  if (!idle()) bad("reserve() while checkpoints are stashed; valid: between micro-batches");
  std::vector<int> want;
  for (int i : slots) {
    if (i < 0) bad("slot " + std::to_string(i) + "; valid: an x index >= 0");
    if (std::find(want.begin(), want.end(), i) == want.end()) want.push_back(i);
  }
  std::sort(want.begin(), want.end());
  const std::size_t each = checked_align_up(bytes, kAlign, "ActivationStash slot");
  const bool covered =
      each <= slot_bytes_ && std::all_of(want.begin(), want.end(), [&](int i) { return find(i); });
  if (covered) return;
  const std::size_t total = checked_mul(each, want.size(), "ActivationStash room");
  if (total == 0) {  // no checkpoints (or empty ones): nothing to hold
    slots_.clear();
    for (int i : want) slots_.emplace_back().x = i;
    slot_bytes_ = each;
    return;
  }
  OomInfo info;
  info.requested_bytes = checked_add(others, total, "pinned host bytes");
  info.budget_bytes = host_budget;
  info.host = true;
  const std::string what = format_bytes(total) + " of " + host_->name() + " memory for " +
                           std::to_string(want.size()) + " checkpoints of " + format_bytes(bytes) +
                           " (activation offload)";
  if (host_budget > 0 && info.requested_bytes > host_budget) {
    throw OutOfMemory(
        "ActivationStash: " + what +
            (others > 0 ? " with " + format_bytes(others) + " pinned elsewhere" : "") +
            " exceed the host budget of " + format_bytes(host_budget),
        info);
  }
  be_->synchronize(copy_);  // nothing in flight reads or writes the old room
  void* room = host_->allocate(total);
  if (room == nullptr) throw OutOfMemory("ActivationStash: " + what + " are not available", info);
  // Everything that may throw comes before the old room goes; from here on nothing throws.
  HostRegion region;
  try {
    if (host_->kind() != MemoryKind::kNone) {
      region = HostRegion(Category::kActivation, total, "checkpoint_room");
    }
    slots_.reserve(want.size());
  } catch (...) {
    host_->deallocate(room, total);
    throw;
  }
  region_ = HostRegion();  // the old room's region goes with it (both were pinned a moment)
  if (room_ != nullptr) host_->deallocate(room_, room_bytes_);
  room_ = room;
  room_bytes_ = total;
  region_ = std::move(region);
  slot_bytes_ = each;
  slots_.clear();
  for (int i : want) slots_.emplace_back().x = i;
}

ActivationStash::Slot* ActivationStash::find(int i) {
  for (Slot& s : slots_) {
    if (s.x == i) return &s;
  }
  return nullptr;
}

ActivationStash::Slot& ActivationStash::slot_of(int i, const char* what) {
  Slot* s = find(i);
  if (s == nullptr) {
    std::string have;
    for (const Slot& t : slots_) have += (have.empty() ? "" : ", ") + std::to_string(t.x);
    bad(std::string(what) + "(" + std::to_string(i) +
        "): no room for that slot; valid: " + (have.empty() ? std::string("none reserved") : have));
  }
  return *s;
}

Tensor ActivationStash::host_view(const Slot& s) const {
  const auto k = static_cast<std::size_t>(&s - slots_.data());
  void* at = room_ == nullptr ? nullptr : static_cast<unsigned char*>(room_) + k * slot_bytes_;
  return Tensor(at, s.shape, s.dtype, Device::kCpu);
}

void ActivationStash::settle(LayerContext& ctx, Slot& s) {
  if (!s.copied) return;
  be_->wait_event(ctx.stream, *s.copied);
  be_->release_event(*s.copied);
  s.copied.reset();
}

void ActivationStash::put(LayerContext& ctx, int i, Act& x) {
  Slot& s = slot_of(i, "put");
  if (x == nullptr) bad("put(" + std::to_string(i) + ") of nothing");
  if (s.state != State::kEmpty) bad("put(" + std::to_string(i) + ") of a slot already stashed");
  const Tensor& t = x->view();
  if (bytes_of(t) > slot_bytes_) {
    bad("put(" + std::to_string(i) + "): " + t.shape().str() + " " + dtype_name(t.dtype()) +
        " is " + format_bytes(bytes_of(t)) + ", over the slot's room of " +
        format_bytes(slot_bytes_) + "; valid: reserve() it first");
  }
  if (x.use_count() != 1) return;  // freeing our handle would free nothing
  // The latest checkpoint's copy has had this forward to finish: its device memory goes now.
  if (latest_ >= 0) {
    Slot& prev = slots_[static_cast<std::size_t>(latest_)];
    settle(ctx, prev);
    prev.device.reset();
    prev.state = State::kHost;
    latest_ = -1;
  }
  s.shape = t.shape();
  s.dtype = t.dtype();
  {
    const ScopedRange r(RangeKind::kOffload, out_range_id());
    const EventHandle written = be_->record_event(ctx.stream);  // the compute that wrote x
    be_->wait_event(copy_, written);
    be_->release_event(written);
    if (t.numel() > 0) be_->copy(copy_, t, host_view(s));
    s.copied = be_->record_event(copy_);
  }
  s.device = std::move(x);
  s.state = State::kOut;
  latest_ = static_cast<int>(&s - slots_.data());
  ++puts_;
}

void ActivationStash::fetch(LayerContext& ctx, Slot& s) {
  const ScopedRange r(RangeKind::kOffload, in_range_id());
  s.device = ctx.make(s.shape, s.dtype, Category::kActivation, "checkpoint_fetch");
  // The new block may be memory the compute stream used before: the fetch waits for it.
  const EventHandle freed = be_->record_event(ctx.stream);
  be_->wait_event(copy_, freed);
  be_->release_event(freed);
  if (s.shape.numel() > 0) be_->copy(copy_, host_view(s), s.device->view());
  s.copied = be_->record_event(copy_);
  s.state = State::kFetched;
  ++fetches_;
}

Act ActivationStash::take(LayerContext& ctx, int i, int next) {
  Slot& s = slot_of(i, "take");
  if (s.state == State::kEmpty) bad("take(" + std::to_string(i) + ") of a slot not stashed");
  if (s.state == State::kHost) fetch(ctx, s);
  // kOut: the compute may free the tensor once it is read, so its copy out must be done first.
  settle(ctx, s);
  if (latest_ == static_cast<int>(&s - slots_.data())) latest_ = -1;
  Act out = std::move(s.device);
  s.state = State::kEmpty;
  if (next >= 0) {
    Slot* n = find(next);
    if (n != nullptr && n->state == State::kHost) fetch(ctx, *n);
  }
  return out;
}

void ActivationStash::reset(LayerContext& ctx) noexcept {
  for (Slot& s : slots_) {
    try {
      settle(ctx, s);
    } catch (...) {  // an abandoned step: the error already on its way is the one to report
    }
    s.device.reset();
    s.state = State::kEmpty;
  }
  latest_ = -1;
}

}  // namespace memfit
