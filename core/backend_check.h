// Argument-check helpers shared by backend.cpp (streams, GEMM, elementwise) and backend_nn.cpp
// (the neural-network ops). Internal to libmemfit: every message they build names the
// backend, the op and the operand, and says what would be valid (core/backend.h's contract).
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "core/tensor.h"

namespace memfit::backend_check {

inline constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// a * b for non-negative a, b; -1 when it does not fit in int64.
inline std::int64_t mul_or_neg(std::int64_t a, std::int64_t b) {
  if (a == 0 || b == 0) return 0;
  if (a > kInt64Max / b) return -1;
  return a * b;
}

std::string tensor_desc(const Tensor& t);  // "bf16 (2, 3) on cpu"

// "Backend::gemm (cpu)", built only when a message needs it: checks run on every op.
struct Where {
  const char* backend;
  const char* op;
};
std::string operator+(const Where& w, const char* s);
inline std::string operator+(const Where& w, const std::string& s) { return w + s.c_str(); }

// Byte range [begin, end) an operand touches; empty when it touches nothing.
struct Span {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  bool empty() const { return begin == end; }
};

inline Span span_of(const Tensor& t, std::int64_t elements) {
  auto p = reinterpret_cast<std::uintptr_t>(t.raw());
  return {p, p + static_cast<std::uintptr_t>(elements) * dtype_size(t.dtype())};
}
inline Span span_of(const Tensor& t) { return span_of(t, t.numel()); }

inline bool overlaps(Span x, Span y) {
  return !x.empty() && !y.empty() && x.begin < y.end && y.begin < x.end;
}

// Operand on an allowed device, with memory behind any elements.
void check_operand(const Where& where, const char* role, const Tensor& t, Device dev, bool host_ok);
void check_same_numel(const Where& where, const char* ra, const Tensor& a, const char* rb,
                      const Tensor& b);
void check_no_overlap(const Where& where, const char* ra, Span a, const char* rb, Span b);

}  // namespace memfit::backend_check
