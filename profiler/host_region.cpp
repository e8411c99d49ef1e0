#include "profiler/host_region.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <utility>
#include <vector>

#include "profiler/scoped_range.h"

namespace memfit {
namespace {

// One mutex for the totals and the listeners: a region's change and its notification happen
// together, so listeners hear changes in the order the totals took them. Regions are rare
// (a few per run), so the lock is never contended in practice.
struct Table {
  std::mutex mu;
  CategoryBytes live{};
  std::vector<std::pair<std::uint64_t, HostRegionListener>> listeners;
  std::uint64_t next_id = 1;
};

Table& table() {
  static Table* t = new Table();  // never destroyed: regions may outlive static destruction
  return *t;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void change(bool pinned, Category c, std::size_t bytes, std::uint32_t tag) noexcept {
  Table& t = table();
  std::lock_guard lock(t.mu);
  std::size_t& live = t.live[category_index(c)];
  live = pinned ? live + bytes : live - std::min(live, bytes);
  HostRegionEvent e{now_ns(), pinned, c, bytes, tag, t.live};
  for (auto& [id, listener] : t.listeners) {
    try {  // listeners must not throw; one that does loses only its own event
      listener(e);
    } catch (...) {
    }
  }
}

}  // namespace

std::uint64_t add_host_region_listener(HostRegionListener listener, CategoryBytes* live) {
  Table& t = table();
  std::lock_guard lock(t.mu);
  if (live != nullptr) *live = t.live;
  const std::uint64_t id = t.next_id++;
  t.listeners.emplace_back(id, std::move(listener));
  return id;
}

void remove_host_region_listener(std::uint64_t id) {
  Table& t = table();
  std::lock_guard lock(t.mu);
  auto it = std::find_if(t.listeners.begin(), t.listeners.end(),
                         [id](const auto& p) { return p.first == id; });
  if (it != t.listeners.end()) t.listeners.erase(it);
}

CategoryBytes host_region_bytes() {
  Table& t = table();
  std::lock_guard lock(t.mu);
  return t.live;
}

HostRegion::HostRegion(Category category, std::size_t bytes, std::string_view tag)
    : category_(category), bytes_(bytes), tag_(intern_name(tag)) {
  if (bytes_ > 0) change(true, category_, bytes_, tag_);
}

HostRegion::~HostRegion() { release(); }

HostRegion::HostRegion(HostRegion&& o) noexcept
    : category_(o.category_), bytes_(std::exchange(o.bytes_, 0)), tag_(o.tag_) {}

HostRegion& HostRegion::operator=(HostRegion&& o) noexcept {
  if (this != &o) {
    release();
    category_ = o.category_;
    bytes_ = std::exchange(o.bytes_, 0);
    tag_ = o.tag_;
  }
  return *this;
}

void HostRegion::release() noexcept {
  if (bytes_ > 0) change(false, category_, bytes_, tag_);
  bytes_ = 0;
}

}  // namespace memfit
