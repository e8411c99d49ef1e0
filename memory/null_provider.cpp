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

void* NullProvider::reserve(std::size_t bytes) {
  const std::size_t page = page_size();
  MEMFIT_CHECK(bytes > 0 && bytes % page == 0) << "NullProvider: reserve(" << bytes << ")";
  std::lock_guard<std::mutex> lock(mu_);
  // Ranges start on a page boundary, as cuMemAddressReserve's do.
  const std::uintptr_t base = (next_ + page - 1) / page * page;
  if (base < next_ || base + bytes < base) return nullptr;
  next_ = base + bytes;
  reserved_.emplace(base, Reservation{bytes, std::vector<bool>(bytes / page, false)});
  return reinterpret_cast<void*>(base);
}

NullProvider::Reservation& NullProvider::reservation_of(std::uintptr_t addr, std::size_t bytes,
                                                       const char* op, std::size_t& first_page) {
  const std::size_t page = page_size();
  auto it = reserved_.upper_bound(addr);
  MEMFIT_CHECK(it != reserved_.begin()) << "NullProvider: " << op << " outside any reservation";
  --it;
  MEMFIT_CHECK(bytes > 0 && bytes % page == 0 && (addr - it->first) % page == 0 &&
               addr - it->first + bytes <= it->second.bytes)
      << "NullProvider: " << op << "(+" << (addr - it->first) << ", " << bytes
      << ") is not whole pages of the reservation";
  first_page = (addr - it->first) / page;
  return it->second;
}

bool NullProvider::map(void* addr, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  std::size_t first = 0;
  Reservation& r = reservation_of(a, bytes, "map", first);
  const std::size_t last = first + bytes / page_size();
  for (std::size_t i = first; i < last; ++i) {
    MEMFIT_CHECK(!r.page_mapped[i]) << "NullProvider: map of a mapped page";
  }
  if (capacity_ != 0 && (bytes > capacity_ || in_use_ > capacity_ - bytes)) return false;
  for (std::size_t i = first; i < last; ++i) r.page_mapped[i] = true;
  in_use_ += bytes;
  mapped_ += bytes;
  if (in_use_ > peak_) peak_ = in_use_;
  ++maps_;
  return true;
}

void NullProvider::unmap(void* addr, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  std::size_t first = 0;
  Reservation& r = reservation_of(a, bytes, "unmap", first);
  for (std::size_t i = first; i < first + bytes / page_size(); ++i) {
    MEMFIT_CHECK(r.page_mapped[i]) << "NullProvider: unmap of a page that is not mapped";
    r.page_mapped[i] = false;
  }
  in_use_ -= bytes;
  mapped_ -= bytes;
  ++unmaps_;
}

void NullProvider::release(void* base, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reserved_.find(reinterpret_cast<std::uintptr_t>(base));
  MEMFIT_CHECK(it != reserved_.end() && it->second.bytes == bytes)
      << "NullProvider: release of a range it did not reserve, or with another size";
  for (bool m : it->second.page_mapped) {
    MEMFIT_CHECK(!m) << "NullProvider: release of a range with pages still mapped";
  }
  reserved_.erase(it);
}

std::int64_t NullProvider::num_maps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return maps_;
}

std::int64_t NullProvider::num_unmaps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unmaps_;
}

std::size_t NullProvider::mapped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mapped_;
}

std::size_t NullProvider::reservations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_.size();
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
