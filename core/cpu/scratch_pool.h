// ScratchPool: reusable host f32 buffers for the CPU backend's GEMM operand widening.
//
//   ScratchPool pool;
//   {
//     ScratchPool::Lease s = pool.take(m * k);   // at least m*k floats, contents undefined
//     widen(A, s.data());
//   }                                            // back to the pool, memory kept
//
// Why a pool: a fresh multi-MiB buffer per call is page-faulted in again on every GEMM, which
// on a 1024^3 bf16 GEMM cost more than the conversion itself (bench/gemm_bench.cpp). Idle
// buffers are kept (at most kMaxIdle, the largest) until release_idle(); held_bytes() reports
// them so the memory is visible rather than hidden. Thread-safe; concurrent takers get
// distinct buffers.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace memfit::cpu {

class ScratchPool {
 public:
  static constexpr std::size_t kMaxIdle = 4;

  class Lease {
   public:
    Lease(Lease&& o) noexcept : pool_(o.pool_), buf_(std::move(o.buf_)), size_(o.size_) {
      o.pool_ = nullptr;
    }
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    float* data() const { return buf_.get(); }
    std::size_t capacity() const { return size_; }

   private:
    friend class ScratchPool;
    Lease(ScratchPool* pool, std::unique_ptr<float[]> buf, std::size_t size)
        : pool_(pool), buf_(std::move(buf)), size_(size) {}
    ScratchPool* pool_;
    std::unique_ptr<float[]> buf_;
    std::size_t size_;
  };

  ScratchPool() = default;
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  Lease take(std::size_t floats);  // std::bad_alloc when the host has no memory for it
  std::size_t held_bytes() const;  // idle and leased buffers together
  void release_idle();

 private:
  struct Idle {
    std::unique_ptr<float[]> buf;
    std::size_t size;
  };
  void give_back(std::unique_ptr<float[]> buf, std::size_t size);

  mutable std::mutex mu_;
  std::vector<Idle> idle_;
  std::size_t held_floats_ = 0;
};

}  // namespace memfit::cpu
