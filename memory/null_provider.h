// NullProvider: hands out address ranges without touching memory, for dry runs and
// planning. The returned pointers must never be dereferenced.
//
//   NullProvider null(80 * kGiB);           // optional capacity: beyond it, nullptr
//   CachingAllocator alloc(null);           // the real allocator, no real memory
//
// Addresses start at a high, aligned base and grow; a freed range is not handed out again,
// so every segment of a run has a distinct address (what a trace reader wants). The counters
// tell how many calls the allocator made, which dry-run benchmarks report.
// Virtual memory (expandable segments) is modelled exactly: reserve hands out an address
// range that counts nothing, map and unmap count 2 MiB pages against the capacity, and every
// misuse (mapping a mapped page, unmapping an unmapped one, releasing a range with pages
// still mapped) is a CheckFailure, so dry runs check the allocator's book-keeping too.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <map>
#include <unordered_map>
#include <vector>

#include "memory/provider.h"

namespace memfit {

class NullProvider final : public MemoryProvider {
 public:
  explicit NullProvider(std::size_t capacity = 0 /* 0 = unlimited */);

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  const char* name() const override { return "null"; }
  MemoryKind kind() const override { return MemoryKind::kNone; }
  std::size_t alignment() const override { return 512; }
  std::size_t page_size() const override { return std::size_t{2} << 20; }
  void* reserve(std::size_t bytes) override;
  bool map(void* addr, std::size_t bytes) override;
  void unmap(void* addr, std::size_t bytes) override;
  void release(void* base, std::size_t bytes) override;

  std::size_t capacity() const { return capacity_; }
  std::size_t in_use() const;
  std::size_t peak_in_use() const;
  std::int64_t num_allocs() const;
  std::int64_t num_frees() const;
  std::int64_t num_maps() const;    // successful map() calls
  std::int64_t num_unmaps() const;
  std::size_t mapped() const;       // bytes mapped now (also part of in_use())
  std::size_t reservations() const; // address ranges reserved and not yet released

 private:
  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::uintptr_t next_;
  std::size_t in_use_ = 0;
  std::size_t peak_ = 0;
  std::int64_t allocs_ = 0;
  std::int64_t frees_ = 0;
  std::int64_t maps_ = 0;
  std::int64_t unmaps_ = 0;
  std::size_t mapped_ = 0;
  std::unordered_map<std::uintptr_t, std::size_t> live_;  // address -> bytes
  struct Reservation {
    std::size_t bytes;
    std::vector<bool> page_mapped;
  };
  std::map<std::uintptr_t, Reservation> reserved_;  // base -> its pages
  Reservation& reservation_of(std::uintptr_t addr, std::size_t bytes, const char* op,
                              std::size_t& first_page);
};

}  // namespace memfit
