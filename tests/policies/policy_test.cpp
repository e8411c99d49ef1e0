// MemoryPolicy and Checkpointing: every text form parses to its typed value once, the value
// names itself and gives the Schedule the executor runs, an unsolved optimal has none, bad
// forms are clear errors, and the micro-batch split and validation are the policy's.
#include "policies/policy.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memory/error.h"

namespace memfit {
namespace {

std::string error_of(std::string_view text, int blocks) {
  try {
    (void)Checkpointing::parse(text, blocks);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpointing, EveryTextFormParsesToItsKindAndNamesItselfBack) {
  const int n = 6;
  struct Form {
    const char* text;
    Checkpointing::Kind kind;
    const char* name;
  };
  for (const Form& f : std::vector<Form>{{"none", Checkpointing::Kind::kNone, "none"},
                                         {"all", Checkpointing::Kind::kAll, "all"},
                                         {"sqrt", Checkpointing::Kind::kSqrt, "sqrt"},
                                         {"every:3", Checkpointing::Kind::kEvery, "every:3"},
                                         {"optimal", Checkpointing::Kind::kOptimal, "optimal"}}) {
    SCOPED_TRACE(f.text);
    const Checkpointing c = Checkpointing::parse(f.text, n);
    EXPECT_EQ(c.kind(), f.kind);
    EXPECT_EQ(c.name(), f.name);
    EXPECT_FALSE(c.has_ops());
    EXPECT_EQ(c, Checkpointing::parse(c.name(), n));  // the name is the text form
  }
  EXPECT_EQ(Checkpointing::parse("every:3", n).every_k(), 3);
  EXPECT_EQ(Checkpointing::parse("none", n).schedule(n).ops(), Schedule::none(n).ops());
  EXPECT_EQ(Checkpointing::parse("all", n).schedule(n).ops(), Schedule::all(n).ops());
  EXPECT_EQ(Checkpointing::parse("sqrt", n).schedule(n).ops(), Schedule::sqrt_n(n).ops());
  EXPECT_EQ(Checkpointing::every(2).schedule(n).ops(), Schedule::every(n, 2).ops());
  // A rule gives a schedule for any block count.
  EXPECT_EQ(Checkpointing::all().schedule(3).ops(), Schedule::all(3).ops());
}

TEST(Checkpointing, AnOpListIsAnExplicitScheduleAndASolvedOneKeepsTheNameOptimal) {
  const Schedule s = Schedule::every(4, 2);
  const Checkpointing ops = Checkpointing::parse(s.str(), 4);
  EXPECT_EQ(ops.kind(), Checkpointing::Kind::kOps);
  EXPECT_EQ(ops.name(), "ops");
  ASSERT_TRUE(ops.has_ops());
  EXPECT_EQ(ops.ops_text(), s.str());
  EXPECT_EQ(ops.schedule(4).ops(), s.ops());
  const Checkpointing solved = Checkpointing::solved(s);
  EXPECT_EQ(solved.name(), "optimal");
  EXPECT_FALSE(solved.needs_solving());
  EXPECT_EQ(solved.schedule(4).ops(), s.ops());
  EXPECT_NE(solved, ops);  // same ops, different provenance
  EXPECT_EQ(Checkpointing::from_parts("optimal", s.str(), 4), solved);
  EXPECT_EQ(Checkpointing::from_parts("ops", s.str(), 4), ops);
  EXPECT_EQ(Checkpointing::from_parts("all", "", 4), Checkpointing::all());
  EXPECT_THROW((void)Checkpointing::from_parts("sqrt", s.str(), 4), InvalidArgument);
  // Explicit schedules are for a block count: another one is refused when it runs.
  EXPECT_THROW((void)ops.schedule(5), InvalidArgument);
  EXPECT_NE(Checkpointing::solved(Schedule::all(4)), solved);
}

TEST(Checkpointing, AnUnsolvedOptimalHasNoSchedule) {
  const Checkpointing c = Checkpointing::optimal();
  EXPECT_TRUE(c.needs_solving());
  try {
    (void)c.schedule(4);
    ADD_FAILURE() << "an unsolved optimal gave a schedule";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("solved for each micro-batch by the planner"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpointing, BadFormsAreClearErrors) {
  for (const char* bad : {"every:0", "every:", "every:x", "sometimes", "", "ALL"}) {
    const std::string m = error_of(bad, 4);
    EXPECT_NE(m.find("valid: none, all, sqrt, every:K"), std::string::npos) << bad << ": " << m;
    EXPECT_NE(m.find("optimal"), std::string::npos) << bad << ": " << m;
  }
  // A bad op in an op list names that op.
  const std::string m = error_of("F0:all B1", 2);
  EXPECT_NE(m.find("op "), std::string::npos) << m;
  EXPECT_THROW((void)Checkpointing::every(0), InvalidArgument);
}

TEST(MemoryPolicy, ValidatesAndSplitsTheBatch) {
  MemoryPolicy p;
  EXPECT_NO_THROW(p.validate());
  EXPECT_EQ(p.micro_batches(10), (std::vector<std::int64_t>{10}));
  p.micro_batch = 4;
  EXPECT_EQ(p.micro_batches(10), (std::vector<std::int64_t>{4, 4, 2}));
  p.micro_batch = 0;
  p.accum = 4;
  EXPECT_EQ(p.micro_batches(10), (std::vector<std::int64_t>{3, 3, 3, 1}));
  EXPECT_THROW((void)p.micro_batches(3), InvalidArgument);  // 3 samples, 4 micro-batches
  p.micro_batch = 2;
  EXPECT_THROW(p.validate(), InvalidArgument);  // both
  p = MemoryPolicy{};
  p.micro_batch = -1;
  EXPECT_THROW(p.validate(), InvalidArgument);
  p = MemoryPolicy{};
  p.offload.delayed_update = true;
  EXPECT_THROW(p.validate(), InvalidArgument);
  p.offload.optimizer = true;
  EXPECT_NO_THROW(p.validate());
  EXPECT_TRUE(p.offload.any());
  EXPECT_EQ(p.offload.describe(), "optimizer (delayed update)");
  p.offload.weights = true;  // the update in flight would rewrite what the fetches read
  EXPECT_THROW(p.validate(), InvalidArgument);
  p.offload.delayed_update = false;
  EXPECT_NO_THROW(p.validate());
  p.offload.optimizer = false;  // the CPU AdamW writes the host weights
  EXPECT_THROW(p.validate(), InvalidArgument);
}

TEST(MemoryPolicy, DescribesItselfInOneLineAndComparesByValue) {
  MemoryPolicy p;
  p.dtype = DType::kBF16;
  p.checkpoint = Checkpointing::every(2);
  p.offload.optimizer = true;
  p.micro_batch = 4;
  EXPECT_EQ(p.describe(), "bf16, checkpoint every:2, offload optimizer, micro-batch 4");
  MemoryPolicy q = p;
  EXPECT_EQ(p, q);
  q.checkpoint = Checkpointing::every(3);
  EXPECT_NE(p, q);
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

TEST(OffloadSwitches, ParsesAListAndDescribesItBack) {
  EXPECT_EQ(OffloadSwitches::parse("optimizer"), (OffloadSwitches{.optimizer = true}));
  const OffloadSwitches og{.optimizer = true, .gradients = true};
  EXPECT_EQ(OffloadSwitches::parse("optimizer,gradients"), og);
  EXPECT_EQ(OffloadSwitches::parse("gradients"), og);  // they need the optimizer's
  const OffloadSwitches ow{.optimizer = true, .weights = true};
  EXPECT_EQ(OffloadSwitches::parse("weights"), ow);
  EXPECT_EQ(OffloadSwitches::parse("weights,optimizer"), ow);
  const OffloadSwitches ogw{.optimizer = true, .gradients = true, .weights = true};
  EXPECT_EQ(OffloadSwitches::parse("gradients,weights"), ogw);
  const OffloadSwitches all{
      .optimizer = true, .gradients = true, .weights = true, .activations = true};
  EXPECT_EQ(OffloadSwitches::parse("all"), all);
  EXPECT_EQ(OffloadSwitches::parse("gradients,weights,activations"), all);
  // Activation offload needs no other switch.
  const OffloadSwitches acts{.activations = true};
  EXPECT_EQ(OffloadSwitches::parse("activations"), acts);
  EXPECT_TRUE(acts.any());
  EXPECT_EQ(acts.describe(), "activations");
  EXPECT_NO_THROW((MemoryPolicy{.offload = acts}.validate()));
  EXPECT_EQ(OffloadSwitches::parse("off"), OffloadSwitches{});
  EXPECT_EQ(OffloadSwitches::parse("none"), OffloadSwitches{});
  EXPECT_EQ(og.describe(), "optimizer,gradients");
  EXPECT_EQ(ow.describe(), "optimizer,weights");
  EXPECT_EQ(ogw.describe(), "optimizer,gradients,weights");
  EXPECT_EQ(all.describe(), "optimizer,gradients,weights,activations");
  EXPECT_EQ(OffloadSwitches{}.describe(), "off");
  for (const char* bad : {"", "optimizer,", "wings", "off,optimizer", "Optimizer"}) {
    try {
      (void)OffloadSwitches::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(
          std::string(e.what()).find("valid: optimizer, gradients, weights, activations, all, off"),
          std::string::npos)
          << e.what();
    }
  }
  MemoryPolicy p;
  p.offload.gradients = true;  // without the optimizer's
  EXPECT_THROW(p.validate(), InvalidArgument);
  p.offload.optimizer = true;
  EXPECT_NO_THROW(p.validate());
}

}  // namespace
}  // namespace memfit
