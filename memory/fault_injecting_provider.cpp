#include "memory/fault_injecting_provider.h"

namespace memfit {

bool FaultInjectingProvider::fails_now(std::size_t bytes) {
  ++calls_;
  bool fail = fail_all_;
  if (countdown_ > 0 && --countdown_ == 0) fail = true;
  if (limit_ != 0 && (bytes > limit_ || in_use_ > limit_ - bytes)) fail = true;
  if (fail) ++failures_;
  return fail;
}

void* FaultInjectingProvider::allocate(std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fails_now(bytes)) return nullptr;
  }
  void* p = inner_.allocate(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (p == nullptr) {
    ++failures_;
  } else {
    in_use_ += bytes;
    ++live_;
  }
  return p;
}

void FaultInjectingProvider::deallocate(void* ptr, std::size_t bytes) {
  inner_.deallocate(ptr, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= bytes;
  --live_;
}

bool FaultInjectingProvider::map(void* addr, std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fails_now(bytes)) return false;
  }
  const bool ok = inner_.map(addr, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (ok) {
    in_use_ += bytes;
  } else {
    ++failures_;
  }
  return ok;
}

void FaultInjectingProvider::unmap(void* addr, std::size_t bytes) {
  inner_.unmap(addr, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= bytes;
}

void FaultInjectingProvider::fail_call(std::int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  countdown_ = n;
}
void FaultInjectingProvider::fail_every_call(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_all_ = on;
}
void FaultInjectingProvider::set_byte_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes;
}
std::size_t FaultInjectingProvider::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}
std::int64_t FaultInjectingProvider::live_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}
std::int64_t FaultInjectingProvider::failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

std::int64_t FaultInjectingProvider::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

}  // namespace memfit
