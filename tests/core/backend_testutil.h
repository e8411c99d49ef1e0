// Host buffers viewed as Tensors, for the backend tests.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <initializer_list>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "memory/error.h"

namespace memfit::testing {

// Owns host memory for `n` elements of `dt` (f32-aligned) and hands out a 1-D view.
class HostBuf {
 public:
  HostBuf(DType dt, std::int64_t n) : dt_(dt), n_(n), mem_(static_cast<std::size_t>(n) + 1) {}

  Tensor t() const { return Tensor(const_cast<float*>(mem_.data()), Shape{n_}, dt_, Device::kCpu); }
  Tensor t(Shape s) const { return Tensor(const_cast<float*>(mem_.data()), s, dt_, Device::kCpu); }
  // A view of elements [off, off + n).
  Tensor at(std::int64_t off, std::int64_t n) const {
    auto* p = reinterpret_cast<char*>(const_cast<float*>(mem_.data())) +
              static_cast<std::size_t>(off) * dtype_size(dt_);
    return Tensor(p, Shape{n}, dt_, Device::kCpu);
  }

  float get(std::int64_t i) const {
    float v;
    convert(raw(i), dt_, &v, DType::kF32, 1);
    return v;
  }
  // Stores v rounded to the dtype; returns the value actually stored.
  float set(std::int64_t i, float v) {
    convert(&v, DType::kF32, raw(i), dt_, 1);
    return get(i);
  }
  void fill(float v) {
    for (std::int64_t i = 0; i < n_; ++i) set(i, v);
  }
  void randomize(std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> u(lo, hi);
    for (std::int64_t i = 0; i < n_; ++i) set(i, u(rng));
  }
  std::int64_t size() const { return n_; }
  DType dtype() const { return dt_; }

 private:
  void* raw(std::int64_t i) const {
    return reinterpret_cast<char*>(const_cast<float*>(mem_.data())) +
           static_cast<std::size_t>(i) * dtype_size(dt_);
  }
  DType dt_;
  std::int64_t n_;
  std::vector<float> mem_;  // one spare element so n == 0 still has an address
};

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// Expects `what` to throw InvalidArgument whose message names each of `parts`.
template <typename F>
void expect_invalid(F&& what, std::initializer_list<const char*> parts) {
  try {
    what();
    ADD_FAILURE() << "no InvalidArgument thrown";
  } catch (const InvalidArgument& e) {
    for (const char* p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "': " << e.what();
    }
  }
}

}  // namespace memfit::testing
