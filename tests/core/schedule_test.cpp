// Schedule: the built-in schedules' ops, parsing, and validation of bad schedules.
#include "core/schedule.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "memory/error.h"
#include "tests/core/exec_testutil.h"

namespace memfit {
namespace {

using Op = ScheduleOp;

// validate(n) must throw InvalidArgument containing every needle.
void expect_invalid(const Schedule& s, int n, std::initializer_list<const char*> needles) {
  try {
    s.validate(n);
    ADD_FAILURE() << "accepted: " << s.str();
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    for (const char* needle : needles) {
      EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' missing: " << msg;
    }
  }
}

TEST(Schedule, BuiltInOps) {
  EXPECT_EQ(Schedule::none(3).str(), "F0:all F1:all F2:all B2 B1 B0");
  EXPECT_EQ(Schedule::all(2).str(), "F0:input F1:input R1:all B1 R0:all B0");
  // checkpoint_sequential: the last segment (here block 4) keeps all and is not recomputed.
  EXPECT_EQ(Schedule::every(5, 2).str(),
            "F0:input F1:nothing F2:input F3:nothing F4:all "
            "B4 R2:all R3:all B3 B2 R0:all R1:all B1 B0");
  EXPECT_EQ(Schedule::every(6, 2).str(),
            "F0:input F1:nothing F2:input F3:nothing F4:all F5:all "
            "B5 B4 R2:all R3:all B3 B2 R0:all R1:all B1 B0");
  EXPECT_EQ(Schedule::all(6).str(),
            "F0:input F1:input F2:input F3:input F4:input F5:input "
            "R5:all B5 R4:all B4 R3:all B3 R2:all B2 R1:all B1 R0:all B0");
  EXPECT_EQ(Schedule::every(7, 3).str(),
            "F0:input F1:nothing F2:nothing F3:input F4:nothing F5:nothing F6:all "
            "B6 R3:all R4:all R5:all B5 B4 B3 R0:all R1:all R2:all B2 B1 B0");
  EXPECT_EQ(Schedule::every(3, 1).str(), "F0:input F1:input F2:all B2 R1:all B1 R0:all B0");
  EXPECT_EQ(Schedule::none(4).name(), "none");
  EXPECT_EQ(Schedule::every(4, 3).name(), "every:3");
  EXPECT_EQ(Schedule::sqrt_n(4).name(), "sqrt");
  EXPECT_EQ(Schedule::all(4).name(), "all");
  for (int n = 1; n <= 12; ++n) {
    EXPECT_EQ(Schedule::none(n).recomputed_forwards(), 0);
    EXPECT_EQ(Schedule::all(n).recomputed_forwards(), n);
    // Every block but the last segment's: n - (the last segment's size).
    for (int k : {1, 2, 3}) {
      const int last = n - ((n - 1) / k) * k;
      EXPECT_EQ(Schedule::every(n, k).recomputed_forwards(), n - last) << n << " k=" << k;
    }
    // every:1 leaves the last block unrecomputed, unlike all.
    EXPECT_NE(Schedule::every(n, 1).ops(), Schedule::all(n).ops()) << n;
    // k >= n is one segment: none's ops, every:K's name.
    for (int k : {n, n + 1, 100}) {
      const Schedule one = Schedule::every(n, k);
      EXPECT_EQ(one.ops(), Schedule::none(n).ops()) << n << " k=" << k;
      EXPECT_EQ(one.name(), "every:" + std::to_string(k));
    }
  }
  // sqrt: every(n, round(sqrt n)).
  EXPECT_EQ(Schedule::sqrt_n(12).ops(), Schedule::every(12, 3).ops());
  EXPECT_EQ(Schedule::sqrt_n(6).ops(), Schedule::every(6, 2).ops());
  EXPECT_EQ(Schedule::sqrt_n(30).ops(), Schedule::every(30, 5).ops());
  EXPECT_EQ(Schedule::sqrt_n(1).ops(), Schedule::none(1).ops());
}

TEST(Schedule, BuiltInsAreValid) {
  for (int n = 1; n <= 24; ++n) {
    for (const char* spec : {"none", "all", "sqrt", "every:2", "every:3", "every:5", "every:100"}) {
      const Schedule s = Schedule::parse(spec, n);
      EXPECT_NO_THROW(s.validate(n)) << spec << " n=" << n;
    }
  }
}

TEST(Schedule, RandomSchedulesAreValid) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + trial % 9;
    const Schedule s = testing::random_schedule(n, rng);
    EXPECT_NO_THROW(s.validate(n)) << s.str();
  }
}

TEST(Schedule, Parse) {
  EXPECT_EQ(Schedule::parse("every:2", 6).ops(), Schedule::every(6, 2).ops());
  EXPECT_EQ(Schedule::parse("none", 6).ops(), Schedule::none(6).ops());
  EXPECT_EQ(Schedule::parse("all", 6).ops(), Schedule::all(6).ops());
  EXPECT_EQ(Schedule::parse("every:1", 6).ops(), Schedule::every(6, 1).ops());
  EXPECT_EQ(Schedule::parse("every:6", 6).name(), "every:6");
  // str() reads back as an op list with the same ops, for every built-in.
  for (int n = 1; n <= 9; ++n) {
    for (const char* spec : {"none", "all", "sqrt", "every:1", "every:2", "every:3", "every:50"}) {
      const Schedule s = Schedule::parse(spec, n);
      const Schedule back = Schedule::parse(s.str(), n);
      EXPECT_EQ(back.ops(), s.ops()) << spec << " n=" << n;
      EXPECT_EQ(back.name(), "ops");
      EXPECT_EQ(back.str(), s.str());
    }
  }
  for (const char* bad : {"every:0", "every:", "every:x", "every:2x", "every:-1", "some", "",
                          "None", "every:99999999999"}) {
    try {
      Schedule::parse(bad, 4);
      ADD_FAILURE() << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("none, all, sqrt, every:K"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(Schedule::parse("none", 0), InvalidArgument);
  EXPECT_THROW(Schedule::every(3, 0), InvalidArgument);
}

TEST(Schedule, RejectsMissingBackward) {
  Schedule s("x", {Op::forward(0, Keep::kAll), Op::forward(1, Keep::kAll), Op::backward(1)});
  expect_invalid(s, 2, {"schedule 'x' op 3 (end)", "missing backward of block 0"});
}

TEST(Schedule, RejectsBackwardBeforeHead) {
  Schedule s("x", {Op::forward(0, Keep::kAll), Op::backward(0), Op::forward(1, Keep::kAll),
                   Op::backward(1)});
  expect_invalid(s, 2, {"op 1 (B0)", "before the head"});
}

TEST(Schedule, RejectsForwardWithoutInput) {
  // F0 keeps nothing, so x[0] is gone when block 0 is recomputed.
  Schedule s("x", {Op::forward(0, Keep::kNothing), Op::forward(1, Keep::kAll), Op::backward(1),
                   Op::forward(0, Keep::kAll, true), Op::backward(0)});
  expect_invalid(s, 2, {"op 3 (R0:all)", "needs x[0]", "not held"});
  Schedule skip("y", {Op::forward(1, Keep::kAll)});
  expect_invalid(skip, 2, {"op 0 (F1:all)", "needs x[1]"});
}

TEST(Schedule, RejectsBackwardWithoutSaved) {
  Schedule s("x", {Op::forward(0, Keep::kInput), Op::forward(1, Keep::kAll), Op::backward(1),
                   Op::backward(0)});
  expect_invalid(s, 2, {"op 3 (B0)", "block 0 holds no saved state"});
}

TEST(Schedule, RejectsDuplicates) {
  Schedule dup_b("x", {Op::forward(0, Keep::kAll), Op::backward(0), Op::backward(0)});
  expect_invalid(dup_b, 1, {"op 2 (B0)", "duplicate backward of block 0"});
  Schedule dup_f("x", {Op::forward(0, Keep::kInput), Op::forward(1, Keep::kAll),
                       Op::forward(0, Keep::kInput), Op::forward(1, Keep::kAll), Op::backward(1),
                       Op::forward(0, Keep::kAll, true), Op::backward(0)});
  expect_invalid(dup_f, 2, {"op 3 (F1:all)", "still holds saved state"});
  // Any forward of a block holding saved state, keeping nothing too.
  Schedule again("x", {Op::forward(0, Keep::kInput), Op::forward(1, Keep::kAll),
                       Op::forward(0, Keep::kInput), Op::forward(1, Keep::kNothing),
                       Op::backward(1), Op::forward(0, Keep::kAll, true), Op::backward(0)});
  expect_invalid(again, 2, {"op 3 (F1:nothing)", "still holds saved state"});
  Schedule after("x", {Op::forward(0, Keep::kInput), Op::forward(1, Keep::kAll), Op::backward(1),
                       Op::forward(1, Keep::kAll), Op::forward(0, Keep::kAll), Op::backward(0)});
  expect_invalid(after, 2, {"op 3 (F1:all)", "after its backward"});
}

TEST(Schedule, RejectsOutOfOrderAndRange) {
  Schedule order(
      "x", {Op::forward(0, Keep::kAll), Op::forward(1, Keep::kAll), Op::forward(2, Keep::kAll),
            Op::backward(1), Op::backward(2), Op::backward(0)});
  expect_invalid(order, 3, {"op 3 (B1)", "out of order", "B2"});
  Schedule range("x", {Op::forward(0, Keep::kAll), Op::forward(5, Keep::kAll)});
  expect_invalid(range, 2, {"op 1 (F5:all)", "out of range", "0 to 1"});
  // A schedule for more blocks than the model has.
  expect_invalid(Schedule::none(3), 2, {"schedule 'none'", "out of range"});
  expect_invalid(Schedule::none(2), 3, {"op 2 (B1)", "before the head"});
}

}  // namespace
}  // namespace memfit
