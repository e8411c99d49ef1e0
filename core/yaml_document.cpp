#include "core/yaml_document.h"

#include <string>
#include <vector>

namespace memfit {

YamlDocument load_yaml_document(std::string_view text) {
  const std::vector<YAML::Node> docs = YAML::LoadAll(std::string(text));
  YamlDocument d;
  if (!docs.empty()) d.root = docs.front();
  if (docs.size() > 1) {
    d.more = true;
    d.second = docs[1].Mark();
  }
  return d;
}

}  // namespace memfit
