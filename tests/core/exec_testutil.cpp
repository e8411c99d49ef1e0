#include "tests/core/exec_testutil.h"

#include <string>
#include <vector>

namespace memfit::testing {

Schedule random_schedule(int n, std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 2);
  const Keep keeps[] = {Keep::kAll, Keep::kInput, Keep::kNothing};
  for (int attempt = 0;; ++attempt) {
    std::vector<ScheduleOp> ops;
    std::vector<char> held(static_cast<std::size_t>(n) + 1, 0), saved(static_cast<std::size_t>(n), 0);
    held[0] = 1;
    const auto fwd = [&](int i, Keep k, bool recompute) {
      const auto u = static_cast<std::size_t>(i);
      ops.push_back(ScheduleOp::forward(i, k, recompute));
      held[u + 1] = 1;
      if (k == Keep::kAll) saved[u] = 1;
      if (k != Keep::kInput) held[u] = 0;
    };
    for (int i = 0; i < n; ++i) fwd(i, keeps[pick(rng)], false);
    bool ok = true;
    for (int i = n - 1; i >= 0 && ok; --i) {
      const auto u = static_cast<std::size_t>(i);
      if (!saved[u]) {
        int j = i;
        while (j >= 0 && !held[static_cast<std::size_t>(j)]) --j;
        if (j < 0) {
          ok = false;  // nothing to recompute from (x[0] dropped): draw again
          break;
        }
        for (int l = j; l < i; ++l) {
          Keep k = keeps[pick(rng)];
          if (k == Keep::kAll && saved[static_cast<std::size_t>(l)]) k = Keep::kInput;
          fwd(l, k, true);
        }
        fwd(i, Keep::kAll, true);
      }
      ops.push_back(ScheduleOp::backward(i));
      saved[u] = 0;
      held[u] = 0;
      held[u + 1] = 0;
    }
    if (ok) return Schedule("random", std::move(ops));
  }
}

}  // namespace memfit::testing
