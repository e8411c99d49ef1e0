// MEMFIT_ALLOC_CONF parsing: values, ranges, malformed text, the environment variable.
#include "memory/alloc_conf.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "memory/error.h"
#include "memory/size.h"

namespace memfit {
namespace {

// Runs parse_alloc_conf(text), expecting a ConfigError whose message contains every needle.
void expect_error(const std::string& text, std::initializer_list<const char*> needles) {
  try {
    parse_alloc_conf(text);
    ADD_FAILURE() << "no error for '" << text << "'";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    for (const char* n : needles) {
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' missing from: " << msg;
    }
  }
}

TEST(AllocConf, EmptyGivesDefaults) {
  for (const char* text : {"", "  "}) {
    const AllocatorConfig c = parse_alloc_conf(text);
    EXPECT_EQ(c.max_split_size, 0u);
    EXPECT_EQ(c.roundup_power2_divisions, 0);
    EXPECT_EQ(c.garbage_collection_threshold, 0.0);
    EXPECT_EQ(c.budget, 0u);
    EXPECT_TRUE(c.separate_persistent_pools);
    EXPECT_TRUE(c.release_before_growth);
    EXPECT_EQ(c.to_string(), "");
  }
}

TEST(AllocConf, ParsesEveryKey) {
  const AllocatorConfig c = parse_alloc_conf(
      "max_split_size_mb:128, roundup_power2_divisions:4,garbage_collection_threshold:0.8,"
      "budget:24GiB");
  EXPECT_EQ(c.max_split_size, std::size_t{128} << 20);
  EXPECT_EQ(c.roundup_power2_divisions, 4);
  EXPECT_DOUBLE_EQ(c.garbage_collection_threshold, 0.8);
  EXPECT_EQ(c.budget, 24 * kGiB);
}

TEST(AllocConf, PolicySwitches) {
  const AllocatorConfig off =
      parse_alloc_conf("separate_persistent_pools:false,release_before_growth:False");
  EXPECT_FALSE(off.separate_persistent_pools);
  EXPECT_FALSE(off.release_before_growth);
  EXPECT_EQ(off.to_string(), "separate_persistent_pools:false,release_before_growth:false");
  const AllocatorConfig back = parse_alloc_conf(off.to_string());
  EXPECT_FALSE(back.separate_persistent_pools);
  EXPECT_FALSE(back.release_before_growth);
  const AllocatorConfig on = parse_alloc_conf("separate_persistent_pools:True");
  EXPECT_TRUE(on.separate_persistent_pools);
  EXPECT_EQ(on.to_string(), "");  // the default is omitted
  expect_error("release_before_growth:1", {"release_before_growth", "'1'", "true or false"});
  expect_error("separate_persistent_pools:yes", {"separate_persistent_pools", "true or false"});
  expect_error("release_before_growth:true,release_before_growth:true", {"given twice"});
}

TEST(AllocConf, ToStringRoundTrips) {
  AllocatorConfig c;
  c.max_split_size = std::size_t{300} << 20;
  c.roundup_power2_divisions = 8;
  c.garbage_collection_threshold = 0.65;
  c.budget = 3 * kGiB + 512;
  const std::string text = c.to_string();
  EXPECT_EQ(text,
            "max_split_size_mb:300,roundup_power2_divisions:8,garbage_collection_threshold:0.65,"
            "budget:3221225984");
  const AllocatorConfig back = parse_alloc_conf(text);
  EXPECT_EQ(back.max_split_size, c.max_split_size);
  EXPECT_EQ(back.roundup_power2_divisions, c.roundup_power2_divisions);
  EXPECT_EQ(back.garbage_collection_threshold, c.garbage_collection_threshold);
  EXPECT_EQ(back.budget, c.budget);
}

TEST(AllocConf, RangeErrorsNameKeyValueAndRange) {
  expect_error("max_split_size_mb:0", {"max_split_size_mb", "'0'", "[1, 1073741824]"});
  expect_error("max_split_size_mb:1073741825",
               {"max_split_size_mb", "1073741825", "[1, 1073741824]"});
  expect_error("max_split_size_mb:-5", {"max_split_size_mb", "'-5'", "[1, 1073741824]"});
  expect_error("max_split_size_mb:12.5", {"max_split_size_mb", "'12.5'"});
  expect_error("roundup_power2_divisions:3",
               {"roundup_power2_divisions", "'3'", "power of two in [1, 64]"});
  expect_error("roundup_power2_divisions:128", {"roundup_power2_divisions", "'128'", "[1, 64]"});
  expect_error("garbage_collection_threshold:1",
               {"garbage_collection_threshold", "'1'", "0 < F < 1"});
  expect_error("garbage_collection_threshold:0",
               {"garbage_collection_threshold", "'0'", "0 < F < 1"});
  expect_error("garbage_collection_threshold:nan", {"garbage_collection_threshold", "'nan'"});
  expect_error("garbage_collection_threshold:-0.5", {"garbage_collection_threshold", "'-0.5'"});
  expect_error("budget:12parsecs", {"budget", "'12parsecs'", "GiB"});
}

TEST(AllocConf, MalformedTextIsAnError) {
  expect_error("max_split_size_mb", {"max_split_size_mb", "no ':'"});
  expect_error("max_split_size_mb:", {"max_split_size_mb", "empty value"});
  expect_error("max_split_size_mb:128,", {"stray ','"});
  expect_error(",max_split_size_mb:128", {"stray ','"});
  expect_error("max_split_size_mb:128x", {"max_split_size_mb", "'128x'"});
  expect_error("max_split_size_mb:1:2", {"max_split_size_mb", "'1:2'"});
  expect_error("roundup_power2_divisions:4 4", {"roundup_power2_divisions", "'4 4'"});
  expect_error("budget:1GiB,budget:2GiB", {"budget", "twice"});
}

TEST(AllocConf, UnknownKeysAreErrors) {
  expect_error("max_split_size:128", {"unknown key 'max_split_size'", "max_split_size_mb"});
  expect_error("expandable_segment:True", {"unknown key 'expandable_segment'", "budget"});
  expect_error("budget:1GiB,Budget:1GiB", {"unknown key 'Budget'"});
}

TEST(AllocConf, ExpandableSegmentsInPyTorchsSpellingAndBack) {
  EXPECT_FALSE(parse_alloc_conf("").expandable_segments);
  EXPECT_TRUE(parse_alloc_conf("expandable_segments:True").expandable_segments);
  EXPECT_TRUE(parse_alloc_conf("expandable_segments:true").expandable_segments);
  EXPECT_FALSE(parse_alloc_conf("expandable_segments:False").expandable_segments);
  const AllocatorConfig c = parse_alloc_conf("budget:1GiB,expandable_segments:True");
  EXPECT_EQ(c.to_string(), "budget:1073741824,expandable_segments:True");
  EXPECT_TRUE(parse_alloc_conf(c.to_string()).expandable_segments);
  expect_error("expandable_segments:yes", {"'expandable_segments'", "'yes'", "true or false"});
}

TEST(AllocConf, FromEnvironment) {
  ASSERT_EQ(setenv("MEMFIT_ALLOC_CONF", "budget:512MiB,max_split_size_mb:64", 1), 0);
  AllocatorConfig c = alloc_conf_from_env();
  EXPECT_EQ(c.budget, 512 * kMiB);
  EXPECT_EQ(c.max_split_size, 64 * kMiB);

  ASSERT_EQ(setenv("MEMFIT_ALLOC_CONF", "budget:lots", 1), 0);
  try {
    alloc_conf_from_env();
    ADD_FAILURE() << "no error for budget:lots";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("MEMFIT_ALLOC_CONF"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'lots'"), std::string::npos) << msg;
  }

  ASSERT_EQ(unsetenv("MEMFIT_ALLOC_CONF"), 0);
  c = alloc_conf_from_env();
  EXPECT_EQ(c.budget, 0u);
  EXPECT_EQ(c.max_split_size, 0u);
}

}  // namespace
}  // namespace memfit
