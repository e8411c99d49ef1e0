// Fuzz harness: plan YAML (Plan::from_yaml_string, which Plan::load and --plan FILE.yaml call).
// An accepted plan must round-trip through to_yaml and to_json.
#include "fuzz/fuzz_util.h"
#include "policies/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  memfit::fuzz::run([&] {
    const memfit::Plan p =
        memfit::Plan::from_yaml_string(memfit::fuzz::text(data, size), "fuzz.yaml");
    memfit::fuzz::property("plan round trip", [&] {
      const memfit::Plan y = memfit::Plan::from_yaml_string(p.to_yaml(), "again.yaml");
      const memfit::Plan j = memfit::Plan::from_json_string(p.to_json(), "again.json");
      if (y.to_json() != p.to_json() || j.to_json() != p.to_json())
        memfit::fuzz::broken("plan round trip", "differs");
    });
  });
  return 0;
}
