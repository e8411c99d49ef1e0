#include "core/cpu/scratch_pool.h"

#include <algorithm>
#include <utility>

namespace memfit::cpu {

ScratchPool::Lease::~Lease() {
  if (pool_ != nullptr && buf_) pool_->give_back(std::move(buf_), size_);
}

ScratchPool::Lease ScratchPool::take(std::size_t floats) {
  floats = std::max<std::size_t>(floats, 1);
  std::lock_guard<std::mutex> lock(mu_);
  // Smallest idle buffer that fits, so a big one stays for big requests.
  auto best = idle_.end();
  for (auto it = idle_.begin(); it != idle_.end(); ++it) {
    if (it->size >= floats && (best == idle_.end() || it->size < best->size)) best = it;
  }
  if (best != idle_.end()) {
    Lease l(this, std::move(best->buf), best->size);
    idle_.erase(best);
    return l;
  }
  // Uninitialized on purpose: every element is written before it is read. Counted only once
  // the allocation succeeded, so a failed one (std::bad_alloc) leaves held_bytes() exact.
  std::unique_ptr<float[]> buf(new float[floats]);
  held_floats_ += floats;
  return Lease(this, std::move(buf), floats);
}

void ScratchPool::give_back(std::unique_ptr<float[]> buf, std::size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back({std::move(buf), size});
  if (idle_.size() > kMaxIdle) {
    // Drop the smallest: the largest serve every request they cover.
    auto smallest = std::min_element(idle_.begin(), idle_.end(),
                                     [](const Idle& x, const Idle& y) { return x.size < y.size; });
    held_floats_ -= smallest->size;
    idle_.erase(smallest);
  }
}

std::size_t ScratchPool::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_floats_ * sizeof(float);
}

void ScratchPool::release_idle() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Idle& i : idle_) held_floats_ -= i.size;
  idle_.clear();
}

}  // namespace memfit::cpu
