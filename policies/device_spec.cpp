#include "policies/device_spec.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>

#include "core/yaml_document.h"
#include "memory/error.h"
#include "memory/size.h"
#include "profiler/read_file.h"

namespace memfit {

namespace {

// The shipped presets: presets/devices/<name>.yaml, compiled in by CMakeLists.txt.
struct PresetText {
  const char* name;
  const char* file;  // relative to the source tree, for messages
  const char* text;
};
constexpr PresetText kPresets[] = {
#include "memfit_generated/device_presets.inc"
};

// The order the issue lists them in (the generated table is sorted by file name).
constexpr const char* kPresetOrder[] = {"h200",        "h100-80g", "a100-80g", "a100-40g", "l4-24g",
                                        "rtx4090-24g", "v100-32g", "t4-16g",   "cpu"};

constexpr const char* kValidKeys =
    "name, kind, memory, context, flops_f32, flops_f16, flops_bf16, mem_bandwidth, host_link, "
    "rank_link, cpu_adamw";
constexpr const char* kRequiredKeys =
    "kind, memory, flops_f32, flops_f16, flops_bf16, mem_bandwidth, host_link";

std::string joined_presets() {
  std::string s;
  for (const std::string& n : DeviceSpec::preset_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string mark_at(const std::string& source, const YAML::Mark& m) {
  if (m.is_null()) return source + ": ";
  return source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1) + ": ";
}

std::string node_kind(const YAML::Node& n) {
  if (n.IsMap()) return "a map";
  if (n.IsSequence()) return "a list";
  if (n.IsNull()) return "nothing (null)";
  return "'" + n.Scalar() + "'";
}

[[noreturn]] void fail(const std::string& source, const YAML::Node& n, const std::string& key,
                       const std::string& what) {
  throw ConfigError(mark_at(source, n.Mark()) + "device." + key + ": " + what);
}

std::size_t read_size(const std::string& source, const std::string& key, const YAML::Node& n) {
  if (!n.IsScalar())
    fail(source, n, key, "must be a size (24GiB, 512MiB, 4096), got " + node_kind(n));
  try {
    return parse_size(n.Scalar());
  } catch (const Error& e) {
    fail(source, n, key, e.what());
  }
}

// A rate: a plain number ("989e12") or a number with an SI prefix (k, M, G, T, P: powers of
// 1000) and an optional unit ("3.35 TB/s", "989 TFLOP/s", "55G", "1.5e9/s").
double read_rate(const std::string& source, const std::string& key, const YAML::Node& n,
                 bool allow_zero) {
  // Bounded so every time computed from it is finite: 1e-300 FLOP/s made a layer take +inf s.
  const std::string valid =
      std::string("valid: ") + (allow_zero ? "0 or " : "") +
      "a number from 1 to 1e21, optionally with an SI prefix and unit (989e12, 989T, 3.35 TB/s, "
      "989 TFLOP/s)";
  if (!n.IsScalar() || n.Scalar().empty())
    fail(source, n, key, "got " + node_kind(n) + "; " + valid);
  const std::string& t = n.Scalar();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(t.c_str(), &end);
  std::string rest(end);
  while (!rest.empty() && rest.front() == ' ') rest.erase(rest.begin());
  static const std::map<char, double> kPrefix = {{'k', 1e3}, {'K', 1e3},  {'M', 1e6},
                                                 {'G', 1e9}, {'T', 1e12}, {'P', 1e15}};
  if (!rest.empty() && kPrefix.count(rest.front())) {
    v *= kPrefix.at(rest.front());
    rest.erase(rest.begin());
  }
  static const char* kUnits[] = {"", "B/s", "/s", "FLOP/s", "FLOPS", "flop/s", "flops", "params/s"};
  bool unit_ok = false;
  for (const char* u : kUnits) unit_ok = unit_ok || rest == u;
  if (end == t.c_str() || !unit_ok) fail(source, n, key, "'" + t + "' is not a rate; " + valid);
  if (!std::isfinite(v) || v < 0 || (!allow_zero && v == 0) || (v != 0 && (v < 1 || v > 1e21))) {
    fail(source, n, key, "'" + t + "' is out of range; " + valid);
  }
  return v;
}

std::string name_from_path(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  const auto dot = base.find_last_of('.');
  return dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
}

DeviceSpec parse(std::string_view text, const std::string& source,
                 const std::string& default_name) {
  YAML::Node root;
  try {
    const YamlDocument d = load_yaml_document(text);
    if (d.more) {
      throw ConfigError(mark_at(source, d.second) +
                        "a second YAML document; valid: one document (the device: map)");
    }
    root = d.root;
  } catch (const YAML::Exception& e) {
    throw ConfigError(mark_at(source, e.mark) + "not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) {
    throw ConfigError(mark_at(source, root.Mark()) +
                      "expected a map with one key 'device' (device: {memory: 80GiB, ...}), got " +
                      node_kind(root));
  }
  YAML::Node dev;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : std::string("?");
    if (key != "device") {
      throw ConfigError(mark_at(source, it->first.Mark()) + key +
                        ": unknown top-level key; valid: device (one map)");
    }
    dev = it->second;
  }
  if (!dev.IsDefined() || !dev.IsMap()) {
    throw ConfigError(mark_at(source, dev.IsDefined() ? dev.Mark() : root.Mark()) +
                      "device: must be a map of " + kValidKeys + ", got " +
                      (dev.IsDefined() ? node_kind(dev) : std::string("nothing")));
  }
  std::map<std::string, YAML::Node> values;
  for (auto it = dev.begin(); it != dev.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : std::string();
    static const char* kKeys[] = {"name",      "kind",      "memory",     "context",
                                  "flops_f32", "flops_f16", "flops_bf16", "mem_bandwidth",
                                  "host_link", "rank_link", "cpu_adamw"};
    bool known = false;
    for (const char* k : kKeys) known = known || key == k;
    if (!known) {
      throw ConfigError(mark_at(source, it->first.Mark()) + "device." +
                        (key.empty() ? node_kind(it->first) : key) +
                        ": unknown key; valid keys: " + kValidKeys);
    }
    if (values.count(key)) {
      throw ConfigError(mark_at(source, it->first.Mark()) + "device." + key + ": duplicate key");
    }
    values[key] = it->second;
  }
  const auto need = [&](const char* key) -> const YAML::Node& {
    const auto it = values.find(key);
    if (it == values.end()) {
      throw ConfigError(mark_at(source, dev.Mark()) + "device." + key +
                        ": missing; required keys: " + kRequiredKeys);
    }
    return it->second;
  };
  DeviceSpec d;
  d.name = default_name;
  if (values.count("name")) {
    const YAML::Node& n = values["name"];
    if (!n.IsScalar() || n.Scalar().empty()) fail(source, n, "name", "must be a non-empty string");
    d.name = n.Scalar();
  }
  d.memory_bytes = read_size(source, "memory", need("memory"));
  if (d.memory_bytes == 0) fail(source, need("memory"), "memory", "must be > 0");
  if (values.count("context")) {
    const YAML::Node& n = values["context"];
    d.context_bytes = read_size(source, "context", n);
    if (d.context_bytes >= d.memory_bytes) {
      fail(source, n, "context",
           format_bytes(d.context_bytes) + " leaves nothing of memory " +
               format_bytes(d.memory_bytes) + "; valid: below memory");
    }
  }
  d.flops_f32 = read_rate(source, "flops_f32", need("flops_f32"), false);
  d.flops_f16 = read_rate(source, "flops_f16", need("flops_f16"), false);
  d.flops_bf16 = read_rate(source, "flops_bf16", need("flops_bf16"), false);
  d.mem_bandwidth = read_rate(source, "mem_bandwidth", need("mem_bandwidth"), false);
  d.host_link = read_rate(source, "host_link", need("host_link"), false);
  if (values.count("rank_link"))
    d.rank_link = read_rate(source, "rank_link", values["rank_link"], true);
  if (values.count("cpu_adamw"))
    d.cpu_adamw = read_rate(source, "cpu_adamw", values["cpu_adamw"], true);
  // What runs the step, never guessed from the name (a file named "laptop" may be either).
  {
    const YAML::Node& n = need("kind");
    const std::string k = n.IsScalar() ? n.Scalar() : std::string();
    if (k == "cpu") {
      d.kind = DeviceKind::kCpu;
    } else if (k == "cuda") {
      d.kind = DeviceKind::kCuda;
    } else {
      fail(source, n, "kind",
           "got " + node_kind(n) +
               "; valid: cpu (memfit's CPU backend: host memory, GEMM scratch from the budget) "
               "or cuda (an NVIDIA GPU: cuBLASLt workspace per GEMM)");
    }
  }
  return d;
}

std::string rate_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);  // exact for a double
  return buf;
}

}  // namespace

const char* device_kind_name(DeviceKind k) { return k == DeviceKind::kCpu ? "cpu" : "cuda"; }

std::size_t DeviceSpec::usable_bytes() const {
  return context_bytes >= memory_bytes ? 0 : memory_bytes - context_bytes;
}

double DeviceSpec::flops(DType dt) const {
  switch (dt) {
    case DType::kF32:
      return flops_f32;
    case DType::kF16:
      return flops_f16;
    case DType::kBF16:
      return flops_bf16;
  }
  return flops_f32;
}

DeviceSpec DeviceSpec::from_yaml_string(std::string_view text, std::string_view source) {
  return parse(text, std::string(source), "custom");
}

DeviceSpec DeviceSpec::from_yaml_file(const std::string& path) {
  const BoundedRead r = try_read_file_bounded(path, kMaxConfigFileBytes, "device spec");
  if (!r.error.empty()) {
    throw ConfigError(r.error + " (a YAML file), or a preset name (" + joined_presets() + ")");
  }
  return parse(r.bytes, path, name_from_path(path));
}

DeviceSpec DeviceSpec::preset(std::string_view name) {
  for (const PresetText& p : kPresets) {
    if (name == p.name) return parse(p.text, p.file, p.name);
  }
  throw ConfigError("device preset '" + std::string(name) +
                    "': unknown; valid: " + joined_presets());
}

std::vector<std::string> DeviceSpec::preset_names() {
  std::vector<std::string> out;
  for (const char* n : kPresetOrder) {
    for (const PresetText& p : kPresets) {
      if (std::string_view(n) == p.name) out.emplace_back(n);
    }
  }
  // A file added under presets/devices/ without an entry above still ships, listed last.
  for (const PresetText& p : kPresets) {
    bool listed = false;
    for (const std::string& n : out) listed = listed || n == p.name;
    if (!listed) out.emplace_back(p.name);
  }
  return out;
}

DeviceSpec DeviceSpec::load(const std::string& name_or_path) {
  for (const PresetText& p : kPresets) {
    if (name_or_path == p.name) return preset(name_or_path);
  }
  std::error_code ec;  // exists(), not an open: opening a FIFO would block
  if (!std::filesystem::exists(name_or_path, ec)) {
    throw ConfigError("device '" + name_or_path +
                      "': not a preset and no such file; valid: a preset name (" +
                      joined_presets() + ") or a YAML file path");
  }
  return from_yaml_file(name_or_path);
}

std::string DeviceSpec::to_yaml() const {
  // Sizes as exact byte counts and rates with every digit, so the text round-trips.
  std::string s = "device:\n";
  YAML::Emitter n;
  n << YAML::DoubleQuoted << name;
  s += "  name: " + std::string(n.c_str()) + "\n";
  s += std::string("  kind: ") + device_kind_name(kind) + "\n";
  s += "  memory: " + std::to_string(memory_bytes) + "\n";
  s += "  context: " + std::to_string(context_bytes) + "\n";
  s += "  flops_f32: " + rate_text(flops_f32) + "\n";
  s += "  flops_f16: " + rate_text(flops_f16) + "\n";
  s += "  flops_bf16: " + rate_text(flops_bf16) + "\n";
  s += "  mem_bandwidth: " + rate_text(mem_bandwidth) + "\n";
  s += "  host_link: " + rate_text(host_link) + "\n";
  s += "  rank_link: " + rate_text(rank_link) + "\n";
  s += "  cpu_adamw: " + rate_text(cpu_adamw) + "\n";
  return s;
}

}  // namespace memfit
