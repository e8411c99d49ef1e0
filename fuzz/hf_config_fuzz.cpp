// Fuzz harness: HuggingFace config.json (ModelSpec::from_hf_config_string, which --model
// FILE.json reads). An accepted config gives a spec that round-trips through memfit's YAML.
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  memfit::fuzz::run([&] {
    std::vector<std::string> notes;
    const memfit::ModelSpec s = memfit::ModelSpec::from_hf_config_string(
        memfit::fuzz::text(data, size), "fuzz/config.json", &notes);
    memfit::fuzz::property("hf config -> yaml round trip", [&] {
      (void)memfit::ModelSpec::from_yaml_string(s.to_yaml(), "again");
    });
  });
  return 0;
}
