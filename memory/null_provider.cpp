#include "memory/null_provider.h"

#include "memory/check.h"

namespace memfit {

namespace {
// Far above anything a real heap maps on x86-64 Linux and below the 47-bit user limit, so a
// dry-run address is recognizable in traces and cannot alias real memory.
constexpr std::uintptr_t kBase = std::uintptr_t{0x7e00} << 32;
}  // namespace

NullProvider::NullProvider(std::size_t capacity) : capacity_(capacity), next_(kBase) {}

void* NullProvider::allocate(std::size_t bytes) {
  MEMFIT_CHECK(bytes > 0);
  std::lock_guard<std::mutex> lock(mu_);
  if (capacity_ != 0 && (bytes > capacity_ || in_use_ > capacity_ - bytes)) return nullptr;
  const std::size_t span = (bytes + alignment() - 1) / alignment() * alignment();
  if (span < bytes || next_ + span < next_) return nullptr;  // wrapped: absurd request
  const std::uintptr_t addr = next_;
  next_ += span;
  live_.emplace(addr, bytes);
  in_use_ += bytes;
  if (in_use_ > peak_) peak_ = in_use_;
  ++allocs_;
  return reinterpret_cast<void*>(addr);
}

void NullProvider::deallocate(void* ptr, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  MEMFIT_CHECK(it != live_.end()) << "NullProvider: deallocate of an address it did not hand out";
  MEMFIT_CHECK(it->second == bytes) << "NullProvider: deallocate size " << bytes
                                    << " != allocated " << it->second;
  in_use_ -= bytes;
  live_.erase(it);
  ++frees_;
}

std::size_t NullProvider::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}
std::size_t NullProvider::peak_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}
std::int64_t NullProvider::num_allocs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocs_;
}
std::int64_t NullProvider::num_frees() const {
  std::lock_guard<std::mutex> lock(mu_);
  return frees_;
}

}  // namespace memfit
