#include "policies/device_spec.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "memory/error.h"
#include "memory/size.h"

namespace memfit {
namespace {

const std::vector<std::string> kIssuePresets = {"h200",     "h100-80g", "a100-80g",
                                                "a100-40g", "l4-24g",   "rtx4090-24g",
                                                "v100-32g", "t4-16g",   "cpu"};

std::string preset_file(const std::string& name) {
  return std::string(MEMFIT_TEST_SOURCE_DIR) + "/presets/devices/" + name + ".yaml";
}

// The ConfigError message of parsing `text`, or "" when it parses.
std::string error_of(const std::string& text) {
  try {
    DeviceSpec::from_yaml_string(text, "dev.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

void expect_same(const DeviceSpec& a, const DeviceSpec& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.memory_bytes, b.memory_bytes);
  EXPECT_EQ(a.context_bytes, b.context_bytes);
  EXPECT_EQ(a.flops_f32, b.flops_f32);
  EXPECT_EQ(a.flops_f16, b.flops_f16);
  EXPECT_EQ(a.flops_bf16, b.flops_bf16);
  EXPECT_EQ(a.mem_bandwidth, b.mem_bandwidth);
  EXPECT_EQ(a.host_link, b.host_link);
  EXPECT_EQ(a.cpu_adamw, b.cpu_adamw);
  EXPECT_EQ(a.kind, b.kind);
}

const char* kMinimal =
    "device:\n"
    "  kind: cuda\n"
    "  memory: 24GiB\n"
    "  flops_f32: 82.6e12\n"
    "  flops_f16: 165.2 TFLOP/s\n"
    "  flops_bf16: 165.2T\n"
    "  mem_bandwidth: 1008 GB/s\n"
    "  host_link: 25e9\n";

TEST(DeviceSpec, PresetsAreTheIssuesNinePlusOnlyShippedFiles) {
  const std::vector<std::string> names = DeviceSpec::preset_names();
  ASSERT_GE(names.size(), kIssuePresets.size());
  for (std::size_t i = 0; i < kIssuePresets.size(); ++i) EXPECT_EQ(names[i], kIssuePresets[i]);
  // Every compiled-in preset is a file under presets/devices/ and vice versa.
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(MEMFIT_TEST_SOURCE_DIR) +
                                                           "/presets/devices")) {
    if (e.path().extension() == ".yaml") ++files;
  }
  EXPECT_EQ(files, names.size());
}

TEST(DeviceSpec, CompiledPresetsEqualTheirYamlFiles) {
  for (const std::string& n : DeviceSpec::preset_names()) {
    SCOPED_TRACE(n);
    const DeviceSpec compiled = DeviceSpec::preset(n);
    const DeviceSpec file = DeviceSpec::from_yaml_file(preset_file(n));
    expect_same(compiled, file);
    EXPECT_EQ(compiled.name, n);  // the file's name key matches its file name
    expect_same(DeviceSpec::load(n), compiled);
  }
}

TEST(DeviceSpec, PresetFiguresAreConsistent) {
  for (const std::string& n : DeviceSpec::preset_names()) {
    SCOPED_TRACE(n);
    const DeviceSpec d = DeviceSpec::preset(n);
    EXPECT_GT(d.memory_bytes, d.context_bytes);
    EXPECT_EQ(d.usable_bytes(), d.memory_bytes - d.context_bytes);
    // Low precision is never slower than f32 (a device without bf16 units gets the f32 rate).
    EXPECT_GE(d.flops_f16, d.flops_f32);
    EXPECT_GE(d.flops_bf16, d.flops_f32);
    EXPECT_LT(d.host_link, d.mem_bandwidth);
    EXPECT_EQ(d.flops(DType::kF32), d.flops_f32);
    EXPECT_EQ(d.flops(DType::kF16), d.flops_f16);
    EXPECT_EQ(d.flops(DType::kBF16), d.flops_bf16);
    if (n != "cpu") {
      EXPECT_GT(d.context_bytes, 0u) << "a GPU's context takes memory";
      EXPECT_GE(d.flops_f16, 2 * d.flops_f32) << "tensor cores";
    }
  }
  // The two A100s differ in memory and bandwidth only.
  const DeviceSpec a80 = DeviceSpec::preset("a100-80g"), a40 = DeviceSpec::preset("a100-40g");
  EXPECT_EQ(a80.memory_bytes, 2 * a40.memory_bytes);
  EXPECT_EQ(a80.flops_bf16, a40.flops_bf16);
  EXPECT_GT(a80.mem_bandwidth, a40.mem_bandwidth);
}

TEST(DeviceSpec, YamlRoundTrip) {
  for (const std::string& n : DeviceSpec::preset_names()) {
    SCOPED_TRACE(n);
    const DeviceSpec d = DeviceSpec::preset(n);
    expect_same(DeviceSpec::from_yaml_string(d.to_yaml()), d);
  }
  DeviceSpec odd = DeviceSpec::from_yaml_string(kMinimal);
  odd.name = "my gpu: \"quoted\"";
  odd.cpu_adamw = 1.0 / 3.0 * 1e9;
  odd.context_bytes = 12345;
  expect_same(DeviceSpec::from_yaml_string(odd.to_yaml()), odd);
}

TEST(DeviceSpec, UnitsForSizesAndRates) {
  const DeviceSpec d = DeviceSpec::from_yaml_string(kMinimal);
  EXPECT_EQ(d.name, "custom");
  EXPECT_EQ(d.memory_bytes, parse_size("24GiB"));
  EXPECT_EQ(d.context_bytes, 0u);
  EXPECT_EQ(d.cpu_adamw, 0.0);
  EXPECT_DOUBLE_EQ(d.flops_f16, 165.2e12);
  EXPECT_DOUBLE_EQ(d.flops_bf16, 165.2e12);
  EXPECT_DOUBLE_EQ(d.mem_bandwidth, 1008e9);
  const DeviceSpec e = DeviceSpec::from_yaml_string(std::string(kMinimal) +
                                                    "  context: 512MiB\n  cpu_adamw: 1.5G/s\n");
  EXPECT_EQ(e.context_bytes, 512 * kMiB);
  EXPECT_DOUBLE_EQ(e.cpu_adamw, 1.5e9);
  EXPECT_EQ(e.usable_bytes(), parse_size("24GiB") - 512 * kMiB);
}

TEST(DeviceSpec, TheKindIsAFieldNeverGuessedFromTheName) {
  for (const std::string& n : DeviceSpec::preset_names()) {
    EXPECT_EQ(DeviceSpec::preset(n).kind, n == "cpu" ? DeviceKind::kCpu : DeviceKind::kCuda) << n;
  }
  // A file named like a laptop, describing the CPU backend, is the CPU backend; named "cpu"
  // but saying cuda, it is a GPU.
  std::string cpu_text = kMinimal;
  cpu_text.replace(cpu_text.find("kind: cuda"), 10, "kind: cpu");
  const std::string laptop = ::testing::TempDir() + "/laptop.yaml";
  std::ofstream(laptop) << cpu_text;
  EXPECT_EQ(DeviceSpec::load(laptop).kind, DeviceKind::kCpu);
  std::remove(laptop.c_str());
  DeviceSpec named_cpu = DeviceSpec::from_yaml_string(kMinimal);
  named_cpu.name = "cpu";
  EXPECT_EQ(DeviceSpec::from_yaml_string(named_cpu.to_yaml()).kind, DeviceKind::kCuda);
  std::string missing = kMinimal;
  missing.erase(missing.find("  kind: cuda\n"), 13);
  try {
    (void)DeviceSpec::from_yaml_string(missing, "dev.yaml");
    ADD_FAILURE() << "no error for a device without a kind";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device.kind: missing"), std::string::npos) << e.what();
  }
  std::string bad = kMinimal;
  bad.replace(bad.find("kind: cuda"), 10, "kind: tpu");
  try {
    (void)DeviceSpec::from_yaml_string(bad, "dev.yaml");
    ADD_FAILURE() << "no error for kind: tpu";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dev.yaml:2:9: device.kind: got 'tpu'; valid: cpu"),
              std::string::npos)
        << e.what();
  }
}

TEST(DeviceSpec, FileNameIsTheDefaultName) {
  const std::string path = ::testing::TempDir() + "/my-card.yaml";
  {
    std::ofstream f(path);
    f << kMinimal;
  }
  EXPECT_EQ(DeviceSpec::load(path).name, "my-card");
  std::remove(path.c_str());
}

TEST(DeviceSpec, ErrorsNameFileLineKeyAndWhatIsValid) {
  std::string m = error_of(std::string(kMinimal) + "  flops_fp8: 1e15\n");
  EXPECT_NE(m.find("dev.yaml:9:"), std::string::npos) << m;  // kMinimal has 8 lines
  EXPECT_NE(m.find("device.flops_fp8: unknown key"), std::string::npos) << m;
  EXPECT_NE(m.find("mem_bandwidth, host_link"), std::string::npos) << m;

  m = error_of("device:\n  memory: 24 gigs\n  flops_f32: 1\n");
  EXPECT_NE(m.find("dev.yaml:2:"), std::string::npos) << m;
  EXPECT_NE(m.find("device.memory"), std::string::npos) << m;
  EXPECT_NE(m.find("GiB"), std::string::npos) << m;  // parse_size lists the units

  m = error_of("device:\n  memory: 24GiB\n  flops_f32: fast\n");
  EXPECT_NE(m.find("dev.yaml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("device.flops_f32: 'fast' is not a rate"), std::string::npos) << m;

  m = error_of("device:\n  memory: 24GiB\n  flops_f32: -1\n");
  EXPECT_NE(m.find("out of range"), std::string::npos) << m;

  m = error_of("device:\n  memory: 24GiB\n");
  EXPECT_NE(m.find("device.flops_f32: missing"), std::string::npos) << m;

  m = error_of(std::string(kMinimal) + "  context: 30GiB\n");
  EXPECT_NE(m.find("device.context"), std::string::npos) << m;
  EXPECT_NE(m.find("below memory"), std::string::npos) << m;

  m = error_of(std::string(kMinimal) + "  memory: 1GiB\n");
  EXPECT_NE(m.find("duplicate key"), std::string::npos) << m;

  m = error_of("device:\n  memory: [1, 2\n");
  EXPECT_NE(m.find("dev.yaml:"), std::string::npos) << m;
  EXPECT_NE(m.find("not valid YAML"), std::string::npos) << m;

  m = error_of("gpu:\n  memory: 1GiB\n");
  EXPECT_NE(m.find("dev.yaml:1:1: gpu: unknown top-level key; valid: device"), std::string::npos)
      << m;
  m = error_of("- 1\n");
  EXPECT_NE(m.find("expected a map"), std::string::npos) << m;
}

TEST(DeviceSpec, UnknownPresetOrFileListsThePresets) {
  for (const std::string& what : {std::string("h300"), std::string("/no/such/device.yaml")}) {
    try {
      DeviceSpec::load(what);
      FAIL() << what;
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(what), std::string::npos) << m;
      for (const std::string& n : kIssuePresets) EXPECT_NE(m.find(n), std::string::npos) << m;
    }
  }
  EXPECT_THROW(DeviceSpec::preset("H100"), ConfigError);
  EXPECT_THROW(DeviceSpec::from_yaml_file("/no/such/file.yaml"), ConfigError);
}

// A second YAML document is an error naming where it starts, not silently dropped.
TEST(DeviceSpec, ASecondYamlDocumentIsAnError) {
  const std::string e = error_of(std::string(kMinimal) + "---\n" + kMinimal);
  EXPECT_NE(e.find("dev.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("a second YAML document"), std::string::npos) << e;
}

}  // namespace
}  // namespace memfit
