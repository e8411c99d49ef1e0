// Tensor: a non-owning view (data pointer, shape, dtype, device) of contiguous row-major
// memory; OwnedTensor: a Tensor whose memory is a Block from a CachingAllocator.
//
//   OwnedTensor x = OwnedTensor::empty(alloc, {B, T, C}, DType::kBF16, Device::kCpu,
//                                      Category::kActivation, stream, "block0.ln1");
//   Tensor v = x.view();            // cheap to copy; does not keep the memory alive
//   float* p = v.data<float>();     // checks the dtype
//
// OwnedTensor::empty checks that the allocator's provider serves the device: cpu takes host or
// pinned host memory, cuda device memory, meta a NullProvider's addresses (InvalidArgument
// otherwise), so a dry run never allocates real memory and no backend is handed addresses it
// cannot use.
//
// Shapes have at most kMaxDims dimensions; every dimension is >= 0 and numel/nbytes are
// overflow-checked when the shape is built (InvalidArgument). A Tensor's data pointer is
// aligned to its element size (InvalidArgument otherwise). A Tensor never owns memory; the
// code that made the view keeps the owner alive. Nothing here reads or writes the memory, so
// meta tensors (addresses only) go through the same code.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "core/dtype.h"
#include "memory/block.h"
#include "memory/category.h"
#include "memory/stream.h"

namespace memfit {

class CachingAllocator;

// kMeta: the dry-run device; its tensors have addresses from a NullProvider and must never
// be dereferenced.
enum class Device : std::uint8_t { kCpu = 0, kCuda = 1, kMeta = 2 };
const char* device_name(Device d);  // "cpu", "cuda", "meta"

inline constexpr int kMaxDims = 6;

// Throw InvalidArgument: a typed access whose element size does not match the dtype; a
// dimension index outside [0, ndim).
[[noreturn]] void tensor_dtype_mismatch(DType have, std::size_t want_bytes);
[[noreturn]] void shape_index_out_of_range(int i, int ndim);

class Shape {
 public:
  Shape() = default;  // a scalar: 0 dims, numel 1
  Shape(std::initializer_list<std::int64_t> dims);
  static Shape of(const std::int64_t* dims, int ndim);

  int ndim() const { return ndim_; }
  std::int64_t operator[](int i) const {  // 0 <= i < ndim()
    if (i < 0 || i >= ndim_) shape_index_out_of_range(i, ndim_);
    return dims_[static_cast<std::size_t>(i)];
  }
  std::int64_t numel() const { return numel_; }
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "(2, 3, 4)"

 private:
  void init(const std::int64_t* dims, int ndim);
  std::array<std::int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
  std::int64_t numel_ = 1;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, Shape shape, DType dtype, Device device);

  void* raw() const { return data_; }
  template <typename T>
  T* data() const;  // checks that sizeof(T) matches the dtype (float <-> f32, uint16 <-> 16-bit)

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return shape_.ndim(); }
  std::int64_t size(int i) const { return shape_[i]; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }

  // Same memory, new shape with the same numel (InvalidArgument otherwise).
  Tensor reshape(Shape s) const;
  // Rows [begin, end) along dimension 0.
  Tensor slice0(std::int64_t begin, std::int64_t end) const;

 private:
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
};

class OwnedTensor {
 public:
  OwnedTensor() = default;
  OwnedTensor(OwnedTensor&& o) noexcept : block_(std::move(o.block_)), view_(o.view_) {
    o.view_ = Tensor();
  }
  OwnedTensor& operator=(OwnedTensor&& o) noexcept {
    if (this != &o) {
      block_ = std::move(o.block_);
      view_ = o.view_;
      o.view_ = Tensor();
    }
    return *this;
  }
  static OwnedTensor empty(CachingAllocator& alloc, Shape shape, DType dtype, Device device,
                           Category category, StreamId stream = kDefaultStream,
                           std::string_view tag = {});
  // A view of memory someone else owns and keeps alive while this is in use (a slice of an
  // offload bucket lent to a parameter's gradient); reset() gives it back, freeing nothing.
  static OwnedTensor borrow(const Tensor& view) {
    OwnedTensor t;
    t.view_ = view;
    return t;
  }
  const Tensor& view() const { return view_; }
  operator const Tensor&() const { return view_; }  // NOLINT: a view is what callers want
  Block& block() { return block_; }
  void reset() {
    block_.reset();
    view_ = Tensor();
  }

 private:
  Block block_;
  Tensor view_;
};

template <typename T>
T* Tensor::data() const {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2, "f32 is 4 bytes, f16/bf16 are 2");
  if (sizeof(T) != dtype_size(dtype_)) tensor_dtype_mismatch(dtype_, sizeof(T));
  return static_cast<T*>(data_);
}

}  // namespace memfit
