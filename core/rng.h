// Rng: a small, fast, seedable random generator whose whole state can be saved and restored,
// so a resumed run draws the same numbers (initialization, data sampling) as an unbroken one.
//
//   Rng rng(1337);
//   std::uint64_t r = rng.next();          // xoshiro256** (Blackman & Vigna)
//   float u = rng.uniform();               // [0, 1)
//   float z = rng.normal();                // N(0, 1), Box-Muller, both values used
//   std::int64_t i = rng.below(n);         // [0, n), unbiased (rejection), n >= 1
//   RngState s = rng.state(); ... rng.set_state(s);
//
// Seeding expands the 64-bit seed with splitmix64 (the generator's authors' recommendation), so
// nearby seeds give unrelated streams. Identical on every platform (integer arithmetic only;
// normal() uses std::log/std::sqrt/std::cos/std::sin in double and rounds to float once).
// Not thread-safe: one per user.
#pragma once

#include <array>
#include <cstdint>

namespace memfit {

struct RngState {
  std::array<std::uint64_t, 4> s{};
  bool has_spare = false;  // normal() keeps its second value
  float spare = 0.0f;
  bool operator==(const RngState&) const = default;
};

class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0);
  std::uint64_t next();
  float uniform();
  float normal();
  std::int64_t below(std::int64_t n);  // InvalidArgument when n < 1
  RngState state() const { return st_; }
  void set_state(const RngState& s);  // InvalidArgument for the all-zero state

 private:
  RngState st_;
};

}  // namespace memfit
