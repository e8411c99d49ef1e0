// The one YAML document of a config file (a model spec, a device, a plan): every YAML text
// memfit reads goes through load_yaml_document. yaml-cpp's YAML::Load reads the first document
// of a stream and silently drops the rest; these files are one map each, so a second document
// ("---" and more) is an error their readers report with its position, not something to ignore.
//
//   const YamlDocument d = load_yaml_document(text);   // YAML::Exception on malformed text
//   if (d.more) throw ConfigError(at(d.second) + "a second YAML document; valid: one");
//
// Hostile text is refused before yaml-cpp builds anything, with a YAML::ParserException whose
// mark is where the limit was passed (readers print "file:line:col: not valid YAML: <msg>"):
//   - text over kMaxYamlBytes (4 MiB, profiler/read_file.h's kMaxConfigFileBytes; yaml-cpp
//     holds ~75 bytes per byte of input: a 55 MB file took 4 GB before failing);
//   - nesting deeper than kMaxYamlDepth (64) levels, counting block indentation, "- " entries
//     and flow brackets [ { (memfit's files nest 4 deep; yaml-cpp itself recurses per level
//     and gives up at 2000 with "bad file"). The pre-scan is one pass over the bytes; it skips
//     comments, quoted scalars and block scalars (| >).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <string_view>

namespace memfit {

inline constexpr std::size_t kMaxYamlBytes = std::size_t{4} << 20;
inline constexpr int kMaxYamlDepth = 64;

struct YamlDocument {
  YAML::Node root;    // the first document (a null node for empty text)
  bool more = false;  // the text holds a second document
  YAML::Mark second;  // where it starts, when more
};

YamlDocument load_yaml_document(std::string_view text);

}  // namespace memfit
