#include "core/comm/rank_failure.h"

#include <atomic>

#include "core/comm/communicator.h"

namespace memfit {
namespace {
std::atomic<StopAllRanks> g_stop{nullptr};
}  // namespace

void set_stop_all_ranks(StopAllRanks stop) { g_stop.store(stop); }

void stop_all_ranks(int code) {
  if (StopAllRanks stop = g_stop.load(); stop != nullptr) stop(code);
}

std::string rank_label() {
  const LaunchInfo l = launch_info();
  if (l.world_size <= 1) return "";
  return "rank " + std::to_string(l.rank) + " of " + std::to_string(l.world_size);
}

}  // namespace memfit
