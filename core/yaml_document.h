// The one YAML document of a config file (a model spec, a device, a plan). yaml-cpp's
// YAML::Load reads the first document of a stream and silently drops the rest; these files are
// one map each, so a second document ("---" and more) is an error their readers report with
// its position, not something to ignore.
//
//   const YamlDocument d = load_yaml_document(text);   // YAML::Exception on malformed text
//   if (d.more) throw ConfigError(at(d.second) + "a second YAML document; valid: one");
#pragma once

#include <yaml-cpp/yaml.h>

#include <string_view>

namespace memfit {

struct YamlDocument {
  YAML::Node root;    // the first document (a null node for empty text)
  bool more = false;  // the text holds a second document
  YAML::Mark second;  // where it starts, when more
};

YamlDocument load_yaml_document(std::string_view text);

}  // namespace memfit
