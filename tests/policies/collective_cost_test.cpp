// collective_cost (policies/collective_cost.h): the bytes a data-parallel rank sends per step
// under each ZeRO stage, and their seconds at the device's rank_link; every preset has one.
#include "policies/collective_cost.h"

#include <gtest/gtest.h>

#include "tests/core/exec_testutil.h"

namespace memfit {
namespace {

RunSpec run(int ranks, int zero, DType dt, std::int64_t accum) {
  RunSpec r;
  r.model = testing::tiny_gpt_spec(2);
  r.trainer.policy.dtype = dt;
  r.trainer.policy.accum = accum;
  r.trainer.zero_stage = zero;
  r.batch = 12;
  r.ranks = ranks;
  return r;
}

TEST(CollectiveCost, BytesPerZeroStageAndSecondsAtTheRankLink) {
  DeviceSpec d = DeviceSpec::preset("h100-80g");
  const double p = static_cast<double>(testing::tiny_gpt_spec(2).parameter_count());
  EXPECT_EQ(collective_cost(run(1, 0, DType::kF32, 0), d).bytes, 0.0);  // one rank: none
  // ZeRO-0: all-reduce of the FP32 gradients, 2 (N-1)/N of them.
  Collectives c = collective_cost(run(2, 0, DType::kF32, 0), d);
  EXPECT_DOUBLE_EQ(c.bytes, 2 * 0.5 * 4 * p);
  EXPECT_DOUBLE_EQ(c.seconds, c.bytes / 360e9);
  // ZeRO-1: one reduce-scatter, and the bf16 weights' all-gather.
  EXPECT_DOUBLE_EQ(collective_cost(run(4, 1, DType::kBF16, 3), d).bytes,
                   0.75 * 4 * p + 0.75 * 2 * p);
  // ZeRO-2: a reduce-scatter per micro-batch (3 of 1 sample each per rank).
  EXPECT_DOUBLE_EQ(collective_cost(run(4, 2, DType::kBF16, 3), d).bytes,
                   3 * 0.75 * 4 * p + 0.75 * 2 * p);
  d.rank_link = 0;  // unknown: no time
  EXPECT_EQ(collective_cost(run(2, 0, DType::kF32, 0), d).seconds, 0.0);
}

TEST(CollectiveCost, EveryPresetHasARankLink) {
  for (const std::string& name : DeviceSpec::preset_names()) {
    const DeviceSpec d = DeviceSpec::preset(name);
    EXPECT_GT(d.rank_link, 0.0) << name;
    EXPECT_EQ(DeviceSpec::from_yaml_string(d.to_yaml()).rank_link, d.rank_link) << name;
  }
}

}  // namespace
}  // namespace memfit
