// StepSeries: a per-step figure (loss, grad norm) for `memfit train`'s summary.
//
//   StepSeries losses;
//   for (...) losses.add(r.loss);
//   j["losses"] = losses.kept();  j["losses_stride"] = losses.stride();
//
// Per-step figures for the summary, in bounded memory however many steps run: every step's
// until kMaxKept, then every other one of those kept (and every 2^k-th step after), so a run of
// 10^8 steps holds at most kMaxKept values per series. `stride` says which steps are kept
// (steps 1, 1 + stride, 1 + 2 stride, ...); first() and last() are always the real ones.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace memfit::cli {

class StepSeries {
 public:
  static constexpr std::size_t kMaxKept = std::size_t{1} << 16;

  void add(double v) {
    if (seen_ == 0) first_ = v;
    last_ = v;
    if (seen_ % stride_ == 0) {
      if (kept_.size() == kMaxKept) {
        for (std::size_t i = 0; i < kMaxKept / 2; ++i) kept_[i] = kept_[2 * i];
        kept_.resize(kMaxKept / 2);
        stride_ *= 2;
      }
      if (seen_ % stride_ == 0) kept_.push_back(v);
    }
    ++seen_;
  }
  double first() const { return first_; }
  double last() const { return last_; }
  const std::vector<double>& kept() const { return kept_; }
  std::int64_t stride() const { return stride_; }

 private:
  std::vector<double> kept_;
  std::int64_t stride_ = 1;
  std::int64_t seen_ = 0;
  double first_ = 0, last_ = 0;
};

// The median of the kept values after the first (a run's first step warms up); 0 with fewer
// than two.
inline double steady_step_seconds(const StepSeries& s) {
  if (s.kept().size() < 2) return 0;
  std::vector<double> v(s.kept().begin() + 1, s.kept().end());
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace memfit::cli
