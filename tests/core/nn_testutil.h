// Helpers for the neural-network op tests: shaped host tensors of any dtype, double-precision
// views of what they hold, dtype-aware comparison and central finite differences.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "memory/error.h"
#include "tests/core/backend_testutil.h"

namespace memfit::testing {

using Vec = std::vector<double>;

inline constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();

// A host tensor of a given shape and dtype.
class HT {
 public:
  HT(Shape s, DType dt) : shape_(s), buf_(dt, s.numel()) {}
  Tensor t() const { return buf_.t(shape_); }
  operator Tensor() const { return t(); }  // NOLINT: tests pass these where views are taken
  std::int64_t n() const { return shape_.numel(); }
  DType dtype() const { return buf_.dtype(); }
  // The values as stored (rounded to the dtype), widened to double.
  Vec vals() const {
    Vec v(static_cast<std::size_t>(n()));
    for (std::int64_t i = 0; i < n(); ++i) v[static_cast<std::size_t>(i)] = buf_.get(i);
    return v;
  }
  float get(std::int64_t i) const { return buf_.get(i); }
  void set(std::int64_t i, float v) { buf_.set(i, v); }
  void fill(float v) { buf_.fill(v); }
  void poison() { buf_.fill(kNaNf); }
  HT& rand(std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    buf_.randomize(rng, lo, hi);
    return *this;
  }
  void assign(const Vec& v) {
    for (std::size_t i = 0; i < v.size(); ++i) buf_.set(static_cast<std::int64_t>(i), v[i]);
  }

 private:
  Shape shape_;
  HostBuf buf_;
};

// int32 indices with a shape, as IndexTensor views them.
struct Ids {
  Ids(Shape s, std::vector<std::int32_t> v) : shape(s), data(std::move(v)) {}
  IndexTensor view() const { return {data.data(), shape, Device::kCpu}; }
  Shape shape;
  std::vector<std::int32_t> data;
};

inline double dtype_eps(DType t) {
  return t == DType::kF32 ? 1e-5 : t == DType::kF16 ? 1e-3 : 1e-2;
}

// Every element finite and within abs + |ref| * eps of ref, with abs = k_abs * eps and
// eps = dtype_eps(dt) times k_rel: the dtype of the output (or of the roughest operand).
inline void expect_close(const HT& got, const Vec& ref, DType dt, const std::string& what,
                         double k_abs = 1.0, double k_rel = 1.0) {
  ASSERT_EQ(static_cast<std::size_t>(got.n()), ref.size()) << what;
  const double eps = dtype_eps(dt);
  int bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double g = got.get(static_cast<std::int64_t>(i));
    const double tol = k_abs * eps + std::fabs(ref[i]) * eps * k_rel;
    if (!std::isfinite(g) || std::fabs(g - ref[i]) > tol) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << " (" << dtype_name(dt) << ") [" << i << "]: got " << g
                      << ", reference " << ref[i] << ", tolerance " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " elements off";
}

// Plain double comparison (analytic f64 gradient against finite differences).
inline void expect_vec_near(const Vec& a, const Vec& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], tol * (1.0 + std::fabs(b[i]))) << what << " [" << i << "]";
  }
}

// Central differences of f at x: df/dx_i ~ (f(x + h e_i) - f(x - h e_i)) / 2h.
inline Vec fd_grad(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-6) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}


}  // namespace memfit::testing
