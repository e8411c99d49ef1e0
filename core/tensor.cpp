#include "core/tensor.h"

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/provider.h"
#include "memory/size.h"

namespace memfit {

namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// Enum values cast from integers (a config, a file) must be checked before they are used.
void check_enums(DType dtype, Device device) {
  if (static_cast<int>(dtype) > static_cast<int>(DType::kBF16)) {
    throw InvalidArgument("tensor dtype value " + std::to_string(static_cast<int>(dtype)) +
                          " is invalid; valid: f32, f16, bf16");
  }
  if (static_cast<int>(device) > static_cast<int>(Device::kMeta)) {
    throw InvalidArgument("tensor device value " + std::to_string(static_cast<int>(device)) +
                          " is invalid; valid: cpu, cuda, meta");
  }
}

std::string dims_str(const std::int64_t* dims, int ndim) {
  std::string s = "(";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + ")";
}

// numel * dtype size, which must fit an int64 like every size a Tensor reports.
std::size_t checked_nbytes(const Shape& shape, DType dtype, const char* where) {
  const std::size_t n =
      checked_mul(static_cast<std::size_t>(shape.numel()), dtype_size(dtype), where);
  if (n > static_cast<std::size_t>(kInt64Max)) {
    throw InvalidArgument(std::string(where) + ": shape " + shape.str() + " of " +
                          dtype_name(dtype) + " is " + std::to_string(n) +
                          " bytes; the limit is 2^63-1");
  }
  return n;
}

// The allocator's memory must be what the device can use: a CPU tensor on a null provider's
// addresses would be dereferenced by the CPU backend, a CUDA tensor on host memory would
// fault in a kernel, and a meta tensor from a real provider would make a dry run allocate
// (at full model scale) the memory it exists to avoid.
bool provider_serves(const MemoryProvider& provider, Device device) {
  const MemoryKind kind = provider.kind();
  switch (device) {
    case Device::kCpu:
      return kind == MemoryKind::kHost || kind == MemoryKind::kPinnedHost;
    case Device::kCuda:
      return kind == MemoryKind::kDevice;
    case Device::kMeta:
      return kind == MemoryKind::kNone;
  }
  return false;
}

}  // namespace

const char* device_name(Device d) {
  switch (d) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
    case Device::kMeta:
      return "meta";
  }
  return "invalid";
}

void tensor_dtype_mismatch(DType have, std::size_t want_bytes) {
  throw InvalidArgument("tensor data access with a " + std::to_string(want_bytes) +
                        "-byte element type, but the tensor's dtype is " + dtype_name(have) + " (" +
                        std::to_string(dtype_size(have)) +
                        " bytes): use float for f32, std::uint16_t for f16/bf16");
}

void shape_index_out_of_range(int i, int ndim) {
  throw InvalidArgument("dimension " + std::to_string(i) + " of a " + std::to_string(ndim) +
                        "-dimensional shape; valid: 0 to " + std::to_string(ndim - 1) +
                        (ndim == 0 ? " (none: a scalar has no dimensions)" : ""));
}

// ---- Shape ----------------------------------------------------------------------------------

Shape::Shape(std::initializer_list<std::int64_t> dims) {
  if (dims.size() > static_cast<std::size_t>(kMaxDims)) {
    throw InvalidArgument("shape has " + std::to_string(dims.size()) + " dimensions; at most " +
                          std::to_string(kMaxDims) + " are allowed");
  }
  init(dims.begin(), static_cast<int>(dims.size()));
}

Shape Shape::of(const std::int64_t* dims, int ndim) {
  if (ndim < 0 || ndim > kMaxDims) {
    throw InvalidArgument("shape has " + std::to_string(ndim) + " dimensions; valid: 0 to " +
                          std::to_string(kMaxDims));
  }
  if (ndim > 0 && dims == nullptr) {
    throw InvalidArgument("Shape::of: null dims pointer with ndim = " + std::to_string(ndim));
  }
  Shape s;
  s.init(dims, ndim);
  return s;
}

void Shape::init(const std::int64_t* dims, int ndim) {
  bool empty = false;
  for (int i = 0; i < ndim; ++i) {
    if (dims[i] < 0) {
      throw InvalidArgument("shape " + dims_str(dims, ndim) + ": dimension " + std::to_string(i) +
                            " is " + std::to_string(dims[i]) + "; dimensions must be >= 0");
    }
    empty = empty || dims[i] == 0;
  }
  // A zero anywhere makes the product 0, even when the dimensions before it overflow.
  std::size_t numel = empty ? 0 : 1;
  for (int i = 0; i < ndim && !empty; ++i) {
    numel = checked_mul(numel, static_cast<std::size_t>(dims[i]), "shape numel");
  }
  // Products are checked in size_t; numel is reported as int64 and scaled by at most
  // 4 bytes (f32), so keep it where nbytes cannot overflow for any dtype either.
  if (numel > static_cast<std::size_t>(kInt64Max) / 4) {
    throw InvalidArgument("shape " + dims_str(dims, ndim) + " has " + std::to_string(numel) +
                          " elements; the limit is 2^61-1 (so bytes fit an int64)");
  }
  ndim_ = ndim;
  for (int i = 0; i < ndim; ++i) dims_[static_cast<std::size_t>(i)] = dims[i];
  for (int i = ndim; i < kMaxDims; ++i) dims_[static_cast<std::size_t>(i)] = 0;
  numel_ = static_cast<std::int64_t>(numel);
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i) {
    if (dims_[static_cast<std::size_t>(i)] != o.dims_[static_cast<std::size_t>(i)]) return false;
  }
  return true;
}

std::string Shape::str() const { return dims_str(dims_.data(), ndim_); }

// ---- Tensor ---------------------------------------------------------------------------------

Tensor::Tensor(void* data, Shape shape, DType dtype, Device device)
    : data_(data), shape_(shape), dtype_(dtype), device_(device) {
  check_enums(dtype, device);
  checked_nbytes(shape_, dtype_, "tensor bytes");
  // Backends access elements through typed pointers (float*, half*), and a misaligned one is
  // undefined behaviour on the CPU and a fault in a CUDA kernel; views made by slice0 and
  // reshape stay aligned, so only a hand-made pointer can get this wrong.
  const auto addr = reinterpret_cast<std::uintptr_t>(data_);
  if (addr % dtype_size(dtype_) != 0) {
    std::ostringstream os;
    os << "tensor data pointer 0x" << std::hex << addr << std::dec << " is not aligned to its "
       << dtype_name(dtype_) << " element size (" << dtype_size(dtype_)
       << " bytes); valid: a pointer that is a multiple of the element size";
    throw InvalidArgument(os.str());
  }
  // A null pointer is only meaningful for an empty tensor; anything else is an undefined
  // tensor pretending to have storage.
  if (data_ == nullptr && shape_.numel() != 0) {
    throw InvalidArgument("tensor of shape " + shape_.str() + " (" +
                          std::to_string(shape_.numel()) +
                          " elements) has a null data pointer; only empty tensors may");
  }
}

Tensor Tensor::reshape(Shape s) const {
  if (s.numel() != numel()) {
    throw InvalidArgument("reshape " + shape_.str() + " (" + std::to_string(numel()) +
                          " elements) to " + s.str() + " (" + std::to_string(s.numel()) +
                          " elements): the element counts must match");
  }
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::slice0(std::int64_t begin, std::int64_t end) const {
  if (ndim() == 0) {
    throw InvalidArgument("slice0 of a 0-dimensional tensor: it has no dimension 0");
  }
  const std::int64_t rows = size(0);
  if (begin < 0 || begin > end || end > rows) {
    throw InvalidArgument("slice0 [" + std::to_string(begin) + ", " + std::to_string(end) +
                          ") of shape " + shape_.str() +
                          ": valid is 0 <= begin <= end <= " + std::to_string(rows));
  }
  std::int64_t dims[kMaxDims];
  for (int i = 0; i < ndim(); ++i) dims[i] = size(i);
  dims[0] = end - begin;
  Tensor t = *this;
  t.shape_ = Shape::of(dims, ndim());
  // rows > 0 here unless begin == end == 0; numel / rows is the exact row length then.
  const std::int64_t row_elems = rows > 0 ? numel() / rows : 0;
  const std::size_t offset =
      static_cast<std::size_t>(begin) * static_cast<std::size_t>(row_elems) * dtype_size(dtype_);
  // Cannot overflow: offset <= nbytes, checked at construction.
  if (data_ != nullptr) t.data_ = static_cast<char*>(data_) + offset;
  return t;
}

// ---- OwnedTensor ----------------------------------------------------------------------------

OwnedTensor OwnedTensor::empty(CachingAllocator& alloc, Shape shape, DType dtype, Device device,
                               Category category, StreamId stream, std::string_view tag) {
  check_enums(dtype, device);
  if (!provider_serves(alloc.provider(), device)) {
    throw InvalidArgument(std::string("OwnedTensor::empty: a ") + device_name(device) +
                          " tensor from an allocator over the '" + alloc.provider().name() +
                          "' provider; valid: cpu from host or pinned_host memory, cuda from "
                          "device memory, meta from a null provider");
  }
  OwnedTensor t;
  const std::size_t bytes = checked_nbytes(shape, dtype, "OwnedTensor::empty bytes");
  // The allocator rejects 0 bytes; an empty tensor needs no storage, so it gets no block.
  if (bytes != 0) t.block_ = alloc.allocate(bytes, category, stream, tag);
  t.view_ = Tensor(t.block_.data(), shape, dtype, device);
  return t;
}

}  // namespace memfit
