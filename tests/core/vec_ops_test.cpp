// core/cpu/vec_ops.h: every vector build this CPU can run against double-precision GELU and its
// derivative (GPT-2's tanh form), over ordinary, extreme and non-finite inputs, every tail
// length, and in place.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu/vec_ops.h"
#include "memory/error.h"

namespace memfit {
namespace {

using cpu::VecIsa;

// In double, through sigma = (1 + tanh u) / 2 = 1 / (1 + exp(-2u)): unlike 1 + tanh u, no
// cancellation where the result is tiny (x below -5), so a reference to the last f32 bit there.
double gelu_ref(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return x / (1 + std::exp(-2 * u));
}

double gelu_grad_ref(double x) {
  const double s = std::sqrt(2.0 / M_PI), u = s * (x + 0.044715 * x * x * x);
  const double e = std::exp(-2 * u), sg = 1 / (1 + e);
  const double one_minus = std::isinf(e) ? 1.0 : e / (1 + e);
  return sg + 2 * x * sg * one_minus * s * (1 + 3 * 0.044715 * x * x);
}

// |sigma| + |the second term| of the derivative: the size of what cancels near x = -0.75,
// where the derivative crosses 0.
double gelu_grad_terms(double x) {
  const double s = std::sqrt(2.0 / M_PI), u = s * (x + 0.044715 * x * x * x);
  const double e = std::exp(-2 * u), sg = 1 / (1 + e);
  const double one_minus = std::isinf(e) ? 1.0 : e / (1 + e);
  return sg + std::fabs(2 * x * sg * one_minus * s * (1 + 3 * 0.044715 * x * x));
}

TEST(VecOps, ReferenceIsTheTanhForm) {
  for (double x = -5; x <= 5; x += 0.01) {
    const double s = std::sqrt(2.0 / M_PI), th = std::tanh(s * (x + 0.044715 * x * x * x));
    EXPECT_NEAR(gelu_ref(x), 0.5 * x * (1 + th), 1e-14) << x;
    const double g = 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * s * (1 + 3 * 0.044715 * x * x);
    EXPECT_NEAR(gelu_grad_ref(x), g, 1e-13) << x;
  }
}

// Within 8 f32 ulp of the reference times exp's condition number at -2u (an f32 u carries
// a relative error of an ulp or so, which exp(-2u) turns into |2u| ulp), plus an absolute 1e-30
// for results that underflow.
// `scale`: the size of the terms summed (|ref| unless they cancel).
void expect_ulps(float got, double ref, const char* what, float x, double scale = -1) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  const double size = scale < 0 ? std::fabs(ref) : scale;
  const double tol =
      8 * std::numeric_limits<float>::epsilon() * size * (1 + std::fabs(2 * u)) + 1e-30;
  EXPECT_NEAR(got, ref, tol) << what << " at x = " << x;
}

std::vector<VecIsa> available() {
  std::vector<VecIsa> out;
  for (VecIsa isa : {VecIsa::kGeneric, VecIsa::kAvx2, VecIsa::kAvx512}) {
    if (cpu::vec_isa_available(isa)) {
      out.push_back(isa);
    } else {
      std::printf("[ skipped ] vec build %s: this CPU lacks it\n", cpu::vec_isa_name(isa));
    }
  }
  return out;
}

std::vector<float> inputs() {
  std::vector<float> xs;
  for (float x = -12.0f; x <= 12.0f; x += 0.0137f) xs.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-7f, -1e-7f, 30.0f, -30.0f, 100.0f, -100.0f,
                  1e6f, -1e6f, std::numeric_limits<float>::max(), -5.7f})
    xs.push_back(x);
  return xs;
}

TEST(VecOps, GeluEveryBuildMatchesDoubleReference) {
  const std::vector<float> xs = inputs();
  const std::int64_t n = static_cast<std::int64_t>(xs.size());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> dy(xs.size());
  for (float& v : dy) v = u(rng);
  for (VecIsa isa : available()) {
    SCOPED_TRACE(cpu::vec_isa_name(isa));
    std::vector<float> y(xs.size()), dx(xs.size());
    cpu::gelu_forward(isa, xs.data(), y.data(), n);
    cpu::gelu_backward(isa, xs.data(), dy.data(), dx.data(), n);
    for (std::size_t i = 0; i < xs.size(); ++i) {
      if (std::fabs(xs[i]) > 1e30f) {  // x^3 overflows: the limits, not NaN
        EXPECT_EQ(y[i], xs[i] > 0 ? xs[i] : -0.0f) << xs[i];
        EXPECT_FALSE(std::isnan(dx[i])) << xs[i];
        continue;
      }
      expect_ulps(y[i], gelu_ref(xs[i]), "gelu", xs[i]);
      expect_ulps(dx[i], dy[i] * gelu_grad_ref(xs[i]), "dgelu", xs[i],
                  std::fabs(dy[i]) * gelu_grad_terms(xs[i]));
    }
  }
}

TEST(VecOps, GeluNonFiniteInputs) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float xs[3] = {inf, -inf, nan};
  const float dy[3] = {1.0f, 1.0f, 1.0f};
  for (VecIsa isa : available()) {
    SCOPED_TRACE(cpu::vec_isa_name(isa));
    float y[3], dx[3];
    cpu::gelu_forward(isa, xs, y, 3);
    cpu::gelu_backward(isa, xs, dy, dx, 3);
    // NaN stays NaN (the loss scaler's overflow check sees it); +inf passes the forward.
    // Infinite inputs give no meaningful gradient (inf * 0 in the formula), as with std::tanh.
    EXPECT_EQ(y[0], inf);
    EXPECT_TRUE(std::isnan(y[2]));
    EXPECT_TRUE(std::isnan(dx[2]));
  }
}

// Every tail length (0..2 vectors + 15), and in place (y = x, dx = dy): the same bits as out of
// place.
TEST(VecOps, GeluTailsAndInPlace) {
  for (VecIsa isa : available()) {
    SCOPED_TRACE(cpu::vec_isa_name(isa));
    for (std::int64_t n = 0; n <= 47; ++n) {
      std::vector<float> x(static_cast<std::size_t>(n) + 1), dy(x.size());
      for (std::int64_t i = 0; i <= n; ++i) {
        x[static_cast<std::size_t>(i)] = -4.0f + 0.3f * static_cast<float>(i);
        dy[static_cast<std::size_t>(i)] = 0.5f + 0.01f * static_cast<float>(i);
      }
      const float sentinel = x[static_cast<std::size_t>(n)];
      std::vector<float> y(x.size(), 7.0f), dx(x.size(), 7.0f);
      cpu::gelu_forward(isa, x.data(), y.data(), n);
      cpu::gelu_backward(isa, x.data(), dy.data(), dx.data(), n);
      EXPECT_EQ(y[static_cast<std::size_t>(n)], 7.0f) << "wrote past n = " << n;
      EXPECT_EQ(dx[static_cast<std::size_t>(n)], 7.0f) << "wrote past n = " << n;
      std::vector<float> yi = x, dxi = dy;
      cpu::gelu_forward(isa, yi.data(), yi.data(), n);
      cpu::gelu_backward(isa, x.data(), dxi.data(), dxi.data(), n);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::size_t k = static_cast<std::size_t>(i);
        ASSERT_EQ(yi[k], y[k]) << n << " " << i;
        ASSERT_EQ(dxi[k], dx[k]) << n << " " << i;
        expect_ulps(y[k], gelu_ref(x[k]), "gelu", x[k]);
      }
      EXPECT_EQ(yi[static_cast<std::size_t>(n)], sentinel);
    }
  }
}

TEST(VecOps, UnavailableBuildIsAnError) {
  for (VecIsa isa : {VecIsa::kAvx2, VecIsa::kAvx512}) {
    if (cpu::vec_isa_available(isa)) continue;
    float x = 1.0f;
    EXPECT_THROW(cpu::gelu_forward(isa, &x, &x, 1), InvalidArgument);
  }
  EXPECT_TRUE(cpu::vec_isa_available(VecIsa::kGeneric));
  EXPECT_TRUE(cpu::vec_isa_available(cpu::vec_isa_best()));
}

}  // namespace
}  // namespace memfit
