// CpuRates' key, cache file and YAML form (cpu_rates.h).
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/cpu/gemm_engine.h"
#include "core/yaml_document.h"
#include "memory/error.h"
#include "policies/cpu_rates.h"
#include "profiler/atomic_file.h"
#include "profiler/read_file.h"

namespace memfit {
namespace {

constexpr const char* kVersion = "0.1.0";  // memfit --version
constexpr int kFormat = 2;  // 2: scale, per_op, contention

const char* const kDTypeNames[OpRates::kDTypes] = {"f32", "f16", "bf16"};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string v = line.substr(colon + 1);
        while (!v.empty() && v.front() == ' ') v.erase(v.begin());
        return v;
      }
    }
  }
  return "unknown cpu";
}

// FNV-1a, 64 bits: a stable file name for a key.
std::string hash_hex(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

[[noreturn]] void bad(std::string_view source, const YAML::Node& n, const std::string& what) {
  throw ConfigError(std::string(source) + ":" + std::to_string(n.Mark().line + 1) + ": " + what);
}

double positive(std::string_view source, const YAML::Node& n, const std::string& key) {
  double v = 0;
  try {
    v = n.as<double>();
  } catch (const YAML::Exception&) {
    bad(source, n, key + ": not a number; valid: a number > 0");
  }
  if (!(v > 0) || v > 1e30) bad(source, n, key + ": " + std::to_string(v) + "; valid: 0 < x <= 1e30");
  return v;
}

double non_negative(std::string_view source, const YAML::Node& n, const std::string& key) {
  double v = -1;
  try {
    v = n.as<double>();
  } catch (const YAML::Exception&) {
    bad(source, n, key + ": not a number; valid: a number >= 0");
  }
  if (!(v >= 0) || v > 1e30) bad(source, n, key + ": " + std::to_string(v) + "; valid: 0 <= x <= 1e30");
  return v;
}

// What the note adds when `r` was measured while other processes held the cores.
std::string contention_warning(const CpuRates& r) {
  if (!(r.contention > CpuRates::kContended)) return "";
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.0f%%", 100 * r.contention);
  return std::string("; WARNING: measured while other processes held the CPU (its threads "
                     "waited for a core ") +
         pct + " of the time), so predicted times are too slow: run `memfit plan --measure` "
               "on a quiet machine";
}

}  // namespace

std::string CpuRates::this_key() {
  std::ostringstream k;
  k << cpu_model() << "; " << omp_get_max_threads() << " threads; memfit " << kVersion
    << " built " << __DATE__ << " " << __TIME__ << "; gemm "
    << cpu::gemm_engine_name(cpu::gemm_engine_from_env());
  return k.str();
}

std::string CpuRates::cache_path() {
  std::string dir;
  if (const char* d = std::getenv("MEMFIT_CACHE_DIR"); d != nullptr && *d != '\0') {
    dir = d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    dir = std::string(x) + "/memfit";
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    dir = std::string(h) + "/.cache/memfit";
  } else {
    dir = "/tmp/memfit-cache";
  }
  return dir + "/cpu-rates-" + hash_hex(this_key()) + ".yaml";
}

std::shared_ptr<const CpuRates> CpuRates::cached(std::string* note, bool remeasure,
                                                 CpuRates (*measure_fn)()) {
  const std::string path = cache_path();
  const std::string key = this_key();
  std::string why = "none cached";
  if (!remeasure) {
    BoundedRead in = try_read_file_bounded(path, kMaxYamlBytes, "cpu rates");
    if (in.error.empty()) {
      try {
        CpuRates r = from_yaml(in.bytes, path);
        if (r.key == key) {
          if (note != nullptr) *note = "from " + path + contention_warning(r);
          return std::make_shared<const CpuRates>(std::move(r));
        }
        why = "the cached file is for another machine or build";
      } catch (const ConfigError& e) {
        why = std::string("the cached file is unreadable (") + e.what() + ")";
      }
    }
  } else {
    why = "asked to measure again";
  }
  auto r = std::make_shared<CpuRates>(measure_fn());
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", r->measure_seconds);
  std::string msg = "measured in " + std::string(secs) + " s (" + why + ")";
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    write_file_atomic(path, r->to_yaml());
    msg += ", saved to " + path;
  } catch (const std::exception& e) {
    msg += std::string(", not saved: ") + e.what();
  }
  if (note != nullptr) *note = msg + contention_warning(*r);
  return r;
}

DeviceSpec CpuRates::apply(DeviceSpec d) const {
  if (d.kind != DeviceKind::kCpu) {
    throw InvalidArgument("CpuRates::apply: device '" + d.name + "' is kind " +
                          device_kind_name(d.kind) + "; valid: a kind-cpu device");
  }
  constexpr double kTypicalGemm = 537e6;  // flops of the 256 point: a mid-size linear layer
  d.flops_f32 = ops.gemm_rate(DType::kF32, kTypicalGemm);
  d.flops_f16 = ops.gemm_rate(DType::kF16, kTypicalGemm);
  d.flops_bf16 = ops.gemm_rate(DType::kBF16, kTypicalGemm);
  d.mem_bandwidth = copy;
  d.host_link = copy / 2;  // a transfer reads and writes: copy counts both
  d.cpu_adamw = adamw;
  return d;
}

double CpuRates::step_seconds(const RunSpec& run, const DryRunResult& dry) const {
  const double host_adamw =
      run.trainer.policy.offload.optimizer && adamw > 0
          ? static_cast<double>(  // ZeRO-1/2: this rank's chunks (rank 0's, the largest)
                (run.model.parameter_count() + (run.trainer.zero_stage > 0 ? run.ranks - 1 : 0)) /
                (run.trainer.zero_stage > 0 ? run.ranks : 1)) /
                adamw
          : 0.0;
  return dry.compute_seconds + host_adamw;
}

double CpuRates::step_seconds(RunSpec run) const {
  run.op_rates = op_rates();
  return step_seconds(run, dry_run(run, 1));
}

std::string CpuRates::to_yaml() const {
  YAML::Emitter e;
  e.SetDoublePrecision(6);
  e << YAML::Comment(
      "memfit: this machine's CPU backend rates, measured (policies/cpu_rates.h); delete to "
      "measure again");
  e << YAML::BeginMap;
  e << YAML::Key << "memfit_cpu_rates" << YAML::Value << kFormat;
  e << YAML::Key << "key" << YAML::Value << key;
  e << YAML::Key << "copy" << YAML::Value << copy;
  e << YAML::Key << "adamw" << YAML::Value << adamw;
  e << YAML::Key << "measure_seconds" << YAML::Value << measure_seconds;
  e << YAML::Key << "contention" << YAML::Value << contention;
  e << YAML::Key << "scale" << YAML::Value << ops.scale;
  e << YAML::Key << "per_op" << YAML::Value << ops.per_op;
  e << YAML::Key << "gemm" << YAML::Value << YAML::BeginMap;
  for (std::size_t d = 0; d < OpRates::kDTypes; ++d) {
    e << YAML::Key << kDTypeNames[d] << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const OpRates::GemmPoint& p : ops.gemm[d]) {
      e << YAML::Flow << YAML::BeginSeq << p.flops << p.rate << YAML::EndSeq;
    }
    e << YAML::EndSeq;
  }
  e << YAML::EndMap;
  e << YAML::Key << "ops" << YAML::Value << YAML::BeginMap;
  for (std::size_t o = 0; o < ops.ops.size(); ++o) {
    bool any = false;
    for (const OpRates::Rate& r : ops.ops[o]) any = any || r.rate > 0;
    if (!any) continue;
    e << YAML::Key << meta_op_name(static_cast<MetaOp>(o)) << YAML::Value << YAML::BeginMap;
    for (std::size_t d = 0; d < OpRates::kDTypes; ++d) {
      e << YAML::Key << kDTypeNames[d] << YAML::Value << YAML::Flow << YAML::BeginSeq
        << ops.ops[o][d].per_call << ops.ops[o][d].rate << YAML::EndSeq;
    }
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

CpuRates CpuRates::from_yaml(std::string_view text, std::string_view source) {
  YAML::Node root;
  try {
    const YamlDocument d = load_yaml_document(text);
    if (d.more) bad(source, YAML::Node(), "a second YAML document; valid: one");
    root = d.root;
  } catch (const YAML::Exception& e) {
    throw ConfigError(std::string(source) + ":" + std::to_string(e.mark.line + 1) +
                      ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap() || !root["memfit_cpu_rates"]) {
    bad(source, root, "not a memfit CPU rates file (no memfit_cpu_rates key)");
  }
  if (root["memfit_cpu_rates"].as<std::string>() != std::to_string(kFormat)) {
    bad(source, root["memfit_cpu_rates"],
        "memfit_cpu_rates: format " + root["memfit_cpu_rates"].as<std::string>() +
            "; valid: " + std::to_string(kFormat));
  }
  CpuRates r;
  for (const char* k : {"key", "copy", "adamw", "gemm", "ops"}) {
    if (!root[k]) bad(source, root, std::string("missing key '") + k + "'");
  }
  r.key = root["key"].as<std::string>();
  r.copy = positive(source, root["copy"], "copy");
  r.adamw = positive(source, root["adamw"], "adamw");
  if (root["measure_seconds"]) {
    r.measure_seconds = non_negative(source, root["measure_seconds"], "measure_seconds");
  }
  if (root["contention"]) {  // -1: unknown; absent in files written before it was measured
    const YAML::Node c = root["contention"];
    r.contention = c.IsScalar() && c.Scalar() == "-1" ? -1.0 : non_negative(source, c, "contention");
  }
  if (root["scale"]) r.ops.scale = positive(source, root["scale"], "scale");
  if (root["per_op"]) r.ops.per_op = non_negative(source, root["per_op"], "per_op");
  r.ops.bandwidth = r.copy;
  const YAML::Node gemm = root["gemm"];
  if (!gemm.IsMap()) bad(source, gemm, "gemm: expected a map of dtype -> [[flops, rate], ...]");
  for (std::size_t d = 0; d < OpRates::kDTypes; ++d) {
    const YAML::Node pts = gemm[kDTypeNames[d]];
    if (!pts || !pts.IsSequence() || pts.size() == 0) {
      bad(source, gemm, std::string("gemm.") + kDTypeNames[d] + ": missing or empty");
    }
    double last = 0;
    for (const YAML::Node& p : pts) {
      if (!p.IsSequence() || p.size() != 2) bad(source, p, "gemm point: valid: [flops, rate]");
      const OpRates::GemmPoint g{positive(source, p[0], "gemm flops"),
                                 positive(source, p[1], "gemm rate")};
      if (g.flops <= last) bad(source, p, "gemm points: valid: increasing flops");
      last = g.flops;
      r.ops.gemm[d].push_back(g);
    }
  }
  const YAML::Node ops = root["ops"];
  if (!ops.IsMap()) bad(source, ops, "ops: expected a map of op -> dtype -> [per_call, rate]");
  for (auto it = ops.begin(); it != ops.end(); ++it) {
    const std::string name = it->first.as<std::string>();
    std::size_t o = 0;
    while (o < static_cast<std::size_t>(MetaOp::kCount) &&
           name != meta_op_name(static_cast<MetaOp>(o))) {
      ++o;
    }
    if (o >= static_cast<std::size_t>(MetaOp::kCount) ||
        name != meta_op_name(static_cast<MetaOp>(o))) {
      bad(source, it->first, "ops: unknown op '" + name + "'");
    }
    for (std::size_t d = 0; d < OpRates::kDTypes; ++d) {
      const YAML::Node v = it->second[kDTypeNames[d]];
      if (!v || !v.IsSequence() || v.size() != 2) {
        bad(source, it->second, "ops." + name + "." + kDTypeNames[d] + ": valid: [per_call, rate]");
      }
      r.ops.ops[o][d] = {non_negative(source, v[0], "per_call"),
                         non_negative(source, v[1], "rate")};  // 0: not measured
    }
  }
  return r;
}

}  // namespace memfit
