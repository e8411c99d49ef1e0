// Rng: determinism, state save/restore (the normal() spare included), below()'s bounds and
// uniformity, the moments of uniform() and normal().
#include "core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "memory/error.h"

namespace memfit {
namespace {

TEST(RngTest, SameSeedSameStreamOtherSeedOther) {
  Rng a(1337), b(1337), c(1338), z(0);
  int same_c = 0;
  std::set<std::uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t x = a.next();
    EXPECT_EQ(x, b.next());
    same_c += x == c.next();
    seen.insert(z.next());  // seed 0 works (splitmix64 expands it to a non-zero state)
  }
  EXPECT_EQ(same_c, 0);
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(RngTest, StateRoundTripsIncludingTheNormalSpare) {
  Rng a(7);
  a.next();
  (void)a.normal();  // leaves a spare
  const RngState s = a.state();
  EXPECT_TRUE(s.has_spare);
  std::vector<float> first;
  for (int i = 0; i < 9; ++i) first.push_back(a.normal());
  const std::uint64_t after = a.next();
  Rng b(12345);
  b.set_state(s);
  EXPECT_EQ(b.state(), s);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(b.normal(), first[static_cast<std::size_t>(i)]) << i;
  EXPECT_EQ(b.next(), after);
  EXPECT_THROW(b.set_state(RngState{}), InvalidArgument);
}

TEST(RngTest, BelowStaysInRangeAndIsUniform) {
  Rng r(3);
  EXPECT_THROW(r.below(0), InvalidArgument);
  EXPECT_THROW(r.below(-5), InvalidArgument);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(r.below(1), 0);
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  const std::int64_t odd = (std::int64_t{1} << 62) + 1;  // rejects ~3/4 of the draws
  bool high_half = false;
  for (int i = 0; i < 1000; ++i) {
    const std::int64_t x = r.below(big), y = r.below(odd);
    ASSERT_GE(x, 0);
    ASSERT_LT(y, odd);
    ASSERT_GE(y, 0);
    high_half |= y > odd / 2;
  }
  EXPECT_TRUE(high_half);
  // Chi-square over 7 bins, 70000 draws: 6 degrees of freedom, p = 1e-6 at ~35.9.
  const int n = 7, draws = 70000;
  std::vector<int> counts(n, 0);
  for (int i = 0; i < draws; ++i) ++counts[static_cast<std::size_t>(r.below(n))];
  double chi2 = 0;
  const double e = static_cast<double>(draws) / n;
  for (int c : counts) chi2 += (c - e) * (c - e) / e;
  EXPECT_LT(chi2, 35.9);
}

TEST(RngTest, UniformAndNormalMoments) {
  Rng r(11);
  const int n = 200000;
  double su = 0, sn = 0, sn2 = 0;
  float umin = 1, umax = 0;
  for (int i = 0; i < n; ++i) {
    const float u = r.uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    umin = std::min(umin, u);
    umax = std::max(umax, u);
    su += u;
    const double z = r.normal();
    ASSERT_TRUE(std::isfinite(z));
    sn += z;
    sn2 += z * z;
  }
  // Five standard errors: uniform mean 1/sqrt(12n), normal mean 1/sqrt(n), variance
  // sqrt(2/n).
  EXPECT_NEAR(su / n, 0.5, 5 / std::sqrt(12.0 * n));
  EXPECT_NEAR(sn / n, 0.0, 5 / std::sqrt(1.0 * n));
  EXPECT_NEAR(sn2 / n - (sn / n) * (sn / n), 1.0, 5 * std::sqrt(2.0 / n));
  EXPECT_LT(umin, 1e-4f);
  EXPECT_GT(umax, 1 - 1e-4f);
}

}  // namespace
}  // namespace memfit
