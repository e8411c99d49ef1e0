#include "core/rng.h"

#include <cmath>
#include <string>

#include "memory/error.h"

namespace memfit {

namespace {

// splitmix64 (Steele, Lea & Flood; the seeding generator Blackman & Vigna recommend for
// xoshiro): a bijective mix, so every seed gives a distinct, well-spread state.
std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

constexpr double kTwoPi = 6.283185307179586476925286766559;

}  // namespace

Rng::Rng(std::uint64_t seed) {
  std::uint64_t x = seed;
  for (auto& w : st_.s) w = splitmix64(x);
  // splitmix64 is a bijection of a counter, so four consecutive outputs are never all zero.
}

// xoshiro256** 1.0 (Blackman & Vigna, https://prng.di.unimi.it/): period 2^256 - 1.
std::uint64_t Rng::next() {
  auto& s = st_.s;
  const std::uint64_t result = rotl(s[1] * 5, 7) * 9;
  const std::uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

float Rng::uniform() {
  // The top 24 bits are exactly representable in a float: values k / 2^24, never 1.
  return static_cast<float>(next() >> 40) * 0x1.0p-24f;
}

float Rng::normal() {
  if (st_.has_spare) {
    st_.has_spare = false;
    return st_.spare;
  }
  // u1 in (0, 1] (53-bit grid, shifted off zero) so the log is finite; u2 in [0, 1).
  const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double a = kTwoPi * u2;
  st_.spare = static_cast<float>(r * std::sin(a));
  st_.has_spare = true;
  return static_cast<float>(r * std::cos(a));
}

std::int64_t Rng::below(std::int64_t n) {
  if (n < 1) {
    throw InvalidArgument("Rng::below(" + std::to_string(n) + "): the bound must be >= 1");
  }
  const auto un = static_cast<std::uint64_t>(n);
  // Reject the lowest 2^64 mod n values so the rest is a whole number of copies of [0, n).
  const std::uint64_t threshold = (0 - un) % un;
  for (;;) {
    const std::uint64_t r = next();
    if (r >= threshold) return static_cast<std::int64_t>(r % un);
  }
}

void Rng::set_state(const RngState& s) {
  if (s.s[0] == 0 && s.s[1] == 0 && s.s[2] == 0 && s.s[3] == 0) {
    throw InvalidArgument(
        "Rng::set_state: the all-zero state is xoshiro256**'s fixed point; valid states have "
        "at least one non-zero word (take them from Rng::state())");
  }
  st_ = s;
}

}  // namespace memfit
