// load_yaml_document: one document; hostile text (over the size limit, nested past
// kMaxYamlDepth) refused before yaml-cpp builds it, at the line that passes the limit, in time
// and memory linear in the text; memfit's own files and the YAML forms they use untouched.
#include "core/yaml_document.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "core/model_spec.h"
#include "memory/error.h"
#include "policies/device_spec.h"
#include "policies/plan.h"

namespace memfit {
namespace {

std::string refusal(const std::string& text) {
  try {
    load_yaml_document(text);
  } catch (const YAML::ParserException& e) {
    return std::to_string(e.mark.line + 1) + ": " + e.msg;
  }
  ADD_FAILURE() << "accepted";
  return "";
}

std::string block_nest(int levels) {  // a:\n b:\n  c: ... one level per line
  std::string s;
  for (int i = 0; i < levels; ++i) s += std::string(static_cast<std::size_t>(i), ' ') + "k:\n";
  return s;
}

TEST(YamlDocument, FlowNestingPastTheLimitIsRefusedAtItsLine) {
  // The root line is a level, then each bracket.
  EXPECT_NO_THROW(load_yaml_document("a: " + std::string(kMaxYamlDepth - 1, '[') +
                                     std::string(kMaxYamlDepth - 1, ']')));
  EXPECT_NE(refusal(std::string(kMaxYamlDepth, '[') + std::string(kMaxYamlDepth, ']'))
                .find("deeper than 64"),
            std::string::npos);
  const std::string deep = "a: 1\nb: " + std::string(100'000, '[');
  EXPECT_EQ(refusal(deep),
            "2: nested deeper than 64 levels (maps, lists, [ ] and { }); valid: "
            "at most 64 (memfit's files nest 4 deep)");
  EXPECT_NE(refusal("x: {a: {b: " + std::string(70, '{')).find("deeper than 64"),
            std::string::npos);
}

TEST(YamlDocument, BlockNestingPastTheLimitIsRefused) {
  EXPECT_NO_THROW(load_yaml_document(block_nest(kMaxYamlDepth)));
  EXPECT_EQ(refusal(block_nest(kMaxYamlDepth + 1)).substr(0, 27), "65: nested deeper than 64 l");
  std::string dashes = "list:\n";
  for (int i = 0; i < 80; ++i) dashes += "- ";
  dashes += "x\n";
  EXPECT_NE(refusal(dashes).find("2: nested deeper"), std::string::npos);
}

TEST(YamlDocument, BracketsInsideScalarsCommentsAndBlockScalarsAreText) {
  const std::string many(200, '[');
  const std::string text = "name: a" + many + "\nquoted: \"" + many + "\"\nsingle: '" + many +
                           "'\n# " + many + "\nlit: |\n  " + many + "\n  " + many +
                           "\nafter: {a: [1, 2]}\n";
  const YamlDocument d = load_yaml_document(text);
  EXPECT_EQ(d.root["name"].Scalar(), "a" + many);
  EXPECT_EQ(d.root["quoted"].Scalar(), many);
  EXPECT_EQ(d.root["after"]["a"][1].Scalar(), "2");
}

TEST(YamlDocument, OverTheSizeLimitIsRefusedBeforeParsing) {
  const std::string big(kMaxYamlBytes + 1, '#');
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(refusal(big).find("over the limit of 4 MiB"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

// The readers print the refusal with their file name and a line.
TEST(YamlDocument, EveryYamlReaderNamesTheNestingLimit) {
  const std::string deep = "model:\n  kind: " + std::string(5000, '[');
  const auto msg = [](auto&& read) -> std::string {
    try {
      read();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "accepted";
  };
  for (const std::string& m : {msg([&] { ModelSpec::from_yaml_string(deep, "m.yaml"); }),
                               msg([&] { DeviceSpec::from_yaml_string(deep, "d.yaml"); }),
                               msg([&] { Plan::from_yaml_string(deep, "p.yaml"); })}) {
    EXPECT_NE(m.find(".yaml:2:"), std::string::npos) << m;
    EXPECT_NE(m.find("nested deeper than 64 levels"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace memfit
