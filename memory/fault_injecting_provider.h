// FaultInjectingProvider: wraps another provider and fails on purpose, for tests of the
// out-of-memory paths.
//
//   HostProvider host;
//   FaultInjectingProvider faulty(host);
//   faulty.fail_call(3);            // the 3rd allocate() from now returns nullptr
//   faulty.set_byte_limit(64 << 20) // any allocate() that would exceed 64 MiB in use fails
//
// It tracks what is live through it, so a test can assert that nothing leaked, and counts the
// calls, so a test can fail each allocate() of an operation in turn (calls() before and after
// one clean run of it gives the n to pass to fail_call).
// Virtual memory passes through to the inner provider; map() is a call like allocate(): it
// counts in calls(), fail_call and fail_every_call fail it, and mapped bytes count against
// the byte limit and in bytes_in_use() (live_allocations() counts allocate()s only).
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "memory/provider.h"

namespace memfit {

class FaultInjectingProvider final : public MemoryProvider {
 public:
  explicit FaultInjectingProvider(MemoryProvider& inner) : inner_(inner) {}

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  const char* name() const override { return "fault_injecting"; }
  MemoryKind kind() const override { return inner_.kind(); }
  std::size_t alignment() const override { return inner_.alignment(); }
  std::size_t page_size() const override { return inner_.page_size(); }
  void* reserve(std::size_t bytes) override { return inner_.reserve(bytes); }
  bool map(void* addr, std::size_t bytes) override;
  void unmap(void* addr, std::size_t bytes) override;
  void release(void* base, std::size_t bytes) override { inner_.release(base, bytes); }

  void fail_call(std::int64_t n);          // nth allocate() from now fails once; 0 = off
  void fail_every_call(bool on);           // every allocate() fails while on
  void set_byte_limit(std::size_t bytes);  // 0 = no limit

  std::size_t bytes_in_use() const;
  std::int64_t live_allocations() const;
  std::int64_t failures() const;  // allocate() calls that returned nullptr, map()s false
  std::int64_t calls() const;     // allocate() and map() calls, failed or not

 private:
  bool fails_now(std::size_t bytes);  // counts the call; the caller holds mu_
  MemoryProvider& inner_;
  mutable std::mutex mu_;
  std::int64_t countdown_ = 0;
  bool fail_all_ = false;
  std::size_t limit_ = 0;
  std::size_t in_use_ = 0;
  std::int64_t live_ = 0;
  std::int64_t failures_ = 0;
  std::int64_t calls_ = 0;
};

}  // namespace memfit
