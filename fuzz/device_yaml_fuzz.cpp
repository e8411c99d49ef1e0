// Fuzz harness: device spec YAML (DeviceSpec::from_yaml_string, which --device FILE reads). An
// accepted device must round-trip through to_yaml.
#include "fuzz/fuzz_util.h"
#include "policies/device_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  memfit::fuzz::run([&] {
    const memfit::DeviceSpec d =
        memfit::DeviceSpec::from_yaml_string(memfit::fuzz::text(data, size), "fuzz.yaml");
    memfit::fuzz::property("device spec round trip", [&] {
      const memfit::DeviceSpec back = memfit::DeviceSpec::from_yaml_string(d.to_yaml(), "again");
      if (back.to_yaml() != d.to_yaml()) memfit::fuzz::broken("device spec round trip", "differs");
    });
  });
  return 0;
}
