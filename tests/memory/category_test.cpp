#include "memory/category.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "memory/check.h"
#include "memory/error.h"

namespace memfit {
namespace {

TEST(Category, NamesRoundTripAndAreDistinct) {
  std::set<std::string> names;
  for (std::size_t i = 0; i < kCategoryCount; ++i) {
    const Category c = static_cast<Category>(i);
    const std::string name = category_name(c);
    EXPECT_EQ(parse_category(name), c);
    names.insert(name);
  }
  EXPECT_EQ(names.size(), kCategoryCount);
  EXPECT_STREQ(category_name(Category::kOptimizerState), "optimizer_state");
  EXPECT_STREQ(category_name(Category::kUnknown), "unknown");
}

TEST(Category, UnknownNameListsValidOnes) {
  try {
    parse_category("weights");
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'weights'"), std::string::npos);
    EXPECT_NE(msg.find("parameter"), std::string::npos);
    EXPECT_NE(msg.find("workspace"), std::string::npos);
  }
}

TEST(Check, FailureCarriesFileLineConditionAndContext) {
  try {
    const int live = 3;
    MEMFIT_CHECK(live == 0) << "live blocks: " << live;
    FAIL();
  } catch (const CheckFailure& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("category_test.cpp:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("live == 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("live blocks: 3"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(MEMFIT_CHECK(1 + 1 == 2));
}

}  // namespace
}  // namespace memfit
