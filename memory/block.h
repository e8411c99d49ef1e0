// Block: an owning handle on one allocation from a CachingAllocator (move-only RAII).
//
//   Block b = allocator.allocate(4096, Category::kActivation, stream, "block3.attn");
//   float* x = b.as<float>();
//   b.record_stream(copy_stream);   // used on another stream too: see memory/stream.h
//   b.reset();                      // or let it go out of scope
//
// The allocator must outlive its blocks. A Block is not thread-safe by itself; the
// allocator it points to is.
#pragma once

#include <cstddef>
#include <utility>

#include "memory/category.h"
#include "memory/stream.h"

namespace memfit {

class CachingAllocator;

class Block {
 public:
  Block() = default;
  ~Block() { reset(); }
  Block(Block&& o) noexcept { swap(o); }
  Block& operator=(Block&& o) noexcept {
    if (this != &o) {
      reset();
      swap(o);
    }
    return *this;
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t size() const { return size_; }  // requested bytes
  explicit operator bool() const { return ptr_ != nullptr; }
  CachingAllocator* allocator() const { return alloc_; }

  void record_stream(StreamId stream);  // defined in caching_allocator.cpp
  void reset();                          // frees now; no-op when empty

  // Gives up ownership without freeing; the caller frees with CachingAllocator::free(ptr).
  void* release() {
    void* p = ptr_;
    alloc_ = nullptr;
    ptr_ = nullptr;
    size_ = 0;
    node_ = nullptr;
    return p;
  }

 private:
  friend class CachingAllocator;
  Block(CachingAllocator* a, void* p, std::size_t n, void* node)
      : alloc_(a), ptr_(p), size_(n), node_(node) {}
  void swap(Block& o) noexcept {
    std::swap(alloc_, o.alloc_);
    std::swap(ptr_, o.ptr_);
    std::swap(size_, o.size_);
    std::swap(node_, o.node_);
  }

  CachingAllocator* alloc_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t size_ = 0;
  void* node_ = nullptr;  // the allocator's internal block, for an O(1) free
};

}  // namespace memfit
