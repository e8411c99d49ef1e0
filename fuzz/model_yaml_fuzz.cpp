// Fuzz harness: memfit's model spec YAML (ModelSpec::from_yaml_string, which from_yaml_file and
// --model FILE.yaml call). An accepted spec must round-trip through to_yaml.
#include "core/model_spec.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  memfit::fuzz::run([&] {
    const memfit::ModelSpec s =
        memfit::ModelSpec::from_yaml_string(memfit::fuzz::text(data, size), "fuzz.yaml");
    memfit::fuzz::property("model spec round trip", [&] {
      const memfit::ModelSpec back = memfit::ModelSpec::from_yaml_string(s.to_yaml(), "again");
      if (back.to_yaml() != s.to_yaml()) memfit::fuzz::broken("model spec round trip", "differs");
    });
  });
  return 0;
}
