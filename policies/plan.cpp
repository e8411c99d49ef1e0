#include "policies/plan.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/schedule.h"
#include "core/yaml_document.h"
#include "memory/error.h"
#include "memory/size.h"
#include "profiler/atomic_file.h"
#include "profiler/read_file.h"

namespace memfit {

namespace {

constexpr const char* kValidKeys =
    "model, device, device_kind, budget_bytes, seq_len, global_batch, micro_batch, accum_steps, "
    "activation_dtype, loss, checkpoint, schedule, offload, ranks, zero_stage, overlap_comm, "
    "alloc_conf, "
    "predicted, why";
constexpr const char* kValidPredicted =
    "peak_reserved_bytes, peak_allocated_bytes, peak_by_category, cached_bytes_at_peak, "
    "category_peaks, host_pinned_bytes, host_pinned_by_category, step_seconds, tokens_per_second";
constexpr const char* kValidOffload = "optimizer, gradients, weights, activations, delayed_update";

std::string at(const std::string& source, const YAML::Mark& m) {
  if (m.is_null()) return source + ": ";
  return source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1) + ": ";
}

[[noreturn]] void fail(const std::string& source, const YAML::Node& n, const std::string& key,
                       const std::string& what) {
  throw ConfigError(at(source, n.Mark()) + "plan." + key + ": " + what);
}

// A map's key: a plain name. A list or map as a key (`? [a, b]: 1`, `{[x]: 1}`) is an error at
// it, naming the map and its valid keys.
std::string key_name(const std::string& src, const YAML::Node& k, const std::string& map,
                     const char* valid) {
  if (!k.IsScalar()) {
    throw ConfigError(at(src, k.Mark()) + map + ": a key that is " +
                      (k.IsMap()        ? "a map"
                       : k.IsSequence() ? "a list"
                                        : "empty (null)") +
                      "; valid keys: " + valid);
  }
  return k.Scalar();
}

std::string scalar(const std::string& src, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) fail(src, n, key, "expected a single value");
  return n.Scalar();
}

std::int64_t integer(const std::string& src, const YAML::Node& n, const std::string& key,
                     std::int64_t lo, std::int64_t hi) {
  const std::string s = scalar(src, n, key);
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size()) fail(src, n, key, "'" + s + "' is not an integer");
  if (v < lo || v > hi) {
    fail(src, n, key,
         std::to_string(v) + " is out of range; valid: " + std::to_string(lo) + " to " +
             std::to_string(hi));
  }
  return v;
}

// Bytes: a plain integer or a size with units (24GiB).
std::size_t bytes(const std::string& src, const YAML::Node& n, const std::string& key) {
  const std::string s = scalar(src, n, key);
  try {
    return parse_size(s);
  } catch (const Error& e) {
    fail(src, n, key, e.what());
  }
}

double number(const std::string& src, const YAML::Node& n, const std::string& key) {
  const std::string s = scalar(src, n, key);
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || !std::isfinite(v) || v < 0) {
    fail(src, n, key, "'" + s + "' is not a finite number >= 0");
  }
  return v;
}

bool boolean(const std::string& src, const YAML::Node& n, const std::string& key) {
  const std::string s = scalar(src, n, key);
  if (s == "true") return true;
  if (s == "false") return false;
  fail(src, n, key, "'" + s + "'; valid: true, false");
}

// A map of category: bytes (predicted.peak_by_category, predicted.category_peaks,
// predicted.host_pinned_by_category), whose bytes add up without overflow.
void read_categories(const std::string& src, const YAML::Node& v, const std::string& key,
                     std::array<std::size_t, kCategoryCount>& out) {
  if (!v.IsMap()) fail(src, v, key, "expected a map of category: bytes");
  std::size_t sum = 0;
  for (const auto& ck : v) {
    if (!ck.first.IsScalar()) fail(src, ck.first, key, "expected a category name as the key");
    const std::string c = ck.first.as<std::string>();
    Category cat{};
    try {
      cat = parse_category(c);
    } catch (const Error& e) {
      fail(src, ck.first, key + "." + c, e.what());
    }
    const std::size_t b = bytes(src, ck.second, key + "." + c);
    if (b > std::numeric_limits<std::size_t>::max() - sum) {
      fail(src, ck.second, key + "." + c,
           std::to_string(b) +
               " bytes: the map's total passes 2^64; valid: byte counts that add "
               "up");
    }
    sum += b;
    out[category_index(cat)] = b;
  }
}

// The plan's `model:` map read by ModelSpec itself, so its errors and rules are the same. For a
// block-style YAML document every other top-level entry is blanked out, keeping line numbers;
// otherwise (JSON, flow style) the map is re-emitted and its errors point at the model key.
ModelSpec read_model(std::string_view text, const std::string& src, const YAML::Node& model,
                     bool block_style) {
  if (!model.IsMap()) fail(src, model, "model", "expected a map (kind, vocab, seq_len, ...)");
  if (block_style) {
    std::string kept;
    bool in_model = false;
    std::istringstream in{std::string(text)};
    for (std::string line; std::getline(in, line);) {
      const bool top = !line.empty() && line[0] != ' ' && line[0] != '\t' && line[0] != '#';
      if (top) in_model = line.rfind("model:", 0) == 0;
      kept += (in_model ? line : std::string()) + "\n";
    }
    try {
      return ModelSpec::from_yaml_string(kept, src);
    } catch (const ConfigError&) {
      throw;
    } catch (const YAML::Exception&) {  // not the shape assumed: fall back below
    }
  }
  YAML::Emitter out;
  out << YAML::Flow << YAML::BeginMap << YAML::Key << "model" << YAML::Value << model
      << YAML::EndMap;
  return ModelSpec::from_yaml_string(out.c_str(), at(src, model.Mark()) + "model");
}

Plan parse(std::string_view text, const std::string& src, bool block_style) {
  YAML::Node root;
  try {
    const YamlDocument d = load_yaml_document(text);
    if (d.more) {
      throw ConfigError(at(src, d.second) + "a second YAML document; valid: one plan (one map)");
    }
    root = d.root;
  } catch (const YAML::Exception& e) {
    throw ConfigError(at(src, e.mark) + "malformed plan: " + e.msg);
  }
  if (!root.IsMap()) {
    throw ConfigError(src + ": a plan is one map; valid keys: " + std::string(kValidKeys));
  }
  Plan p;
  std::set<std::string> seen;
  YAML::Node micro_node, global_node, accum_node, delayed_node, gradients_node, weights_node,
      seq_node, checkpoint_node;
  std::string checkpoint_name, schedule_text;
  std::size_t cached = 0;
  bool have_cached = false;
  for (const auto& kv : root) {
    const std::string key = key_name(src, kv.first, "plan", kValidKeys);
    const YAML::Node& v = kv.second;
    if (!seen.insert(key).second) {
      fail(src, kv.first, key,
           "a duplicate key; valid: each key once (which one wins is not "
           "for a plan to guess)");
    }
    if (key == "model") {
      p.model = read_model(text, src, v, block_style && kv.first.Mark().column == 0);
    } else if (key == "device") {
      p.device = scalar(src, v, key);
      if (p.device.empty()) fail(src, v, key, "empty; valid: a device preset name or file");
    } else if (key == "device_kind") {
      const std::string k = scalar(src, v, key);
      if (k != "cpu" && k != "cuda") fail(src, v, key, "'" + k + "'; valid: cpu, cuda");
      p.device_kind = k == "cpu" ? DeviceKind::kCpu : DeviceKind::kCuda;
    } else if (key == "budget_bytes") {
      p.budget = bytes(src, v, key);
    } else if (key == "seq_len") {
      p.seq_len = integer(src, v, key, 0, std::numeric_limits<std::int32_t>::max());
      seq_node = v;
    } else if (key == "global_batch") {
      p.global_batch = integer(src, v, key, 0, std::int64_t{1} << 40);
      global_node = v;
    } else if (key == "micro_batch") {
      p.policy.micro_batch = integer(src, v, key, 1, std::int64_t{1} << 40);
      micro_node = v;
    } else if (key == "accum_steps") {
      p.accum_steps = integer(src, v, key, 1, std::int64_t{1} << 40);
      accum_node = v;
    } else if (key == "activation_dtype") {
      const std::string s = scalar(src, v, key);
      if (s != "f32" && s != "f16" && s != "bf16")
        fail(src, v, key, "'" + s + "'; valid: f32, f16, bf16");
      p.policy.dtype = parse_dtype(s);
    } else if (key == "loss") {
      const std::string s = scalar(src, v, key);
      if (!parse_loss_mode(s, &p.policy.loss)) {
        fail(src, v, key, "'" + s + "'; valid: chunked, whole");
      }
    } else if (key == "checkpoint") {
      checkpoint_name = scalar(src, v, key);
      checkpoint_node = v;
    } else if (key == "schedule") {
      schedule_text = scalar(src, v, key);
    } else if (key == "offload") {
      if (v.IsMap()) {
        for (const auto& ok : v) {
          const std::string k = key_name(src, ok.first, "plan.offload", kValidOffload);
          if (k == "optimizer") {
            p.policy.offload.optimizer = boolean(src, ok.second, "offload." + k);
          } else if (k == "gradients") {
            p.policy.offload.gradients = boolean(src, ok.second, "offload." + k);
            gradients_node = ok.second;
          } else if (k == "weights") {
            p.policy.offload.weights = boolean(src, ok.second, "offload." + k);
            weights_node = ok.second;
          } else if (k == "activations") {
            p.policy.offload.activations = boolean(src, ok.second, "offload." + k);
          } else if (k == "delayed_update") {
            p.policy.offload.delayed_update = boolean(src, ok.second, "offload." + k);
            delayed_node = ok.second;
          } else {
            fail(src, ok.first, "offload." + k,
                 "unknown key; valid: " + std::string(kValidOffload));
          }
        }
      } else {
        p.policy.offload.optimizer = boolean(src, v, key);  // earlier plans: the one switch
      }
    } else if (key == "delayed_update") {  // earlier plans wrote it at the top level
      p.policy.offload.delayed_update = boolean(src, v, key);
      delayed_node = v;
    } else if (key == "ranks") {
      p.ranks = static_cast<int>(integer(src, v, key, 1, 1 << 20));
    } else if (key == "zero_stage") {
      p.zero_stage = static_cast<int>(integer(src, v, key, 0, 2));
    } else if (key == "overlap_comm") {
      p.overlap_comm = boolean(src, v, key);
    } else if (key == "predicted") {
      if (!v.IsMap()) fail(src, v, key, "expected a map (" + std::string(kValidPredicted) + ")");
      PeakFigures& pk = p.predicted.peaks;
      for (const auto& entry : v) {
        const std::string k = key_name(src, entry.first, "plan.predicted", kValidPredicted);
        const YAML::Node& pv = entry.second;
        const std::string full = "predicted." + k;
        if (k == "peak_reserved_bytes") {
          pk.reserved = bytes(src, pv, full);
        } else if (k == "peak_allocated_bytes") {
          pk.allocated = bytes(src, pv, full);
        } else if (k == "cached_bytes_at_peak") {
          cached = bytes(src, pv, full);
          have_cached = true;
        } else if (k == "host_pinned_bytes") {
          pk.host_pinned = bytes(src, pv, full);
        } else if (k == "host_pinned_by_category") {
          read_categories(src, pv, full, pk.host_at_peak);
        } else if (k == "step_seconds") {
          p.predicted.step_seconds = number(src, pv, full);
        } else if (k == "tokens_per_second") {
          p.predicted.tokens_per_second = number(src, pv, full);
        } else if (k == "peak_by_category") {
          read_categories(src, pv, full, pk.at_peak);
        } else if (k == "category_peaks") {
          read_categories(src, pv, full, pk.category_peaks);
        } else {
          fail(src, entry.first, full, "unknown key; valid: " + std::string(kValidPredicted));
        }
      }
    } else if (key == "alloc_conf") {
      const std::string text = scalar(src, v, key);
      try {
        p.alloc = parse_alloc_conf(text);
      } catch (const ConfigError& e) {
        fail(src, v, key, std::string(e.what()) + " (MEMFIT_ALLOC_CONF syntax; \"\" = defaults)");
      }
      if (p.alloc.budget != 0) {
        fail(src, v, key, "a budget here; valid: the budget in budget_bytes only");
      }
    } else if (key == "why") {
      p.why = scalar(src, v, key);
    } else {
      fail(src, kv.first, key, "unknown key; valid: " + std::string(kValidKeys));
    }
  }
  for (const char* required : {"model", "micro_batch", "activation_dtype", "checkpoint"}) {
    if (!seen.count(required)) {
      throw ConfigError(src + ": plan." + required +
                        ": missing; a plan needs model, micro_batch, "
                        "activation_dtype and checkpoint (valid keys: " +
                        kValidKeys + ")");
    }
  }
  {
    PeakFigures& pk = p.predicted.peaks;
    for (std::size_t b : pk.at_peak) pk.allocated_at_peak += b;
    // Without cached_bytes_at_peak the breakdown must still fit the peak: the writer derives
    // cached as reserved - breakdown, and a plan that cannot be written back as read is not one
    // (the fuzzer's round trip found peak_by_category summing past peak_reserved_bytes).
    if (!have_cached && pk.allocated_at_peak > pk.reserved) {
      fail(src, root["predicted"], "predicted.peak_by_category",
           "its bytes add up to " + std::to_string(pk.allocated_at_peak) +
               ", more than peak_reserved_bytes (" + std::to_string(pk.reserved) +
               "); valid: at most that (the rest is cached_bytes_at_peak)");
    }
    if (have_cached &&
        (pk.allocated_at_peak > pk.reserved || pk.reserved - pk.allocated_at_peak != cached)) {
      fail(src, root["predicted"], "predicted.cached_bytes_at_peak",
           std::to_string(cached) + " + the peak_by_category bytes (" +
               std::to_string(pk.allocated_at_peak) + ") is not peak_reserved_bytes (" +
               std::to_string(pk.reserved) + "); valid: the two add up");
    }
    const std::size_t host = total_bytes(pk.host_at_peak);
    if (host != 0 && host != pk.host_pinned) {
      fail(src, root["predicted"], "predicted.host_pinned_by_category",
           "its bytes add up to " + std::to_string(host) + ", not host_pinned_bytes (" +
               std::to_string(pk.host_pinned) + "); valid: the same total");
    }
  }
  // Cross-checks, each pointing at the key that contradicts the others.
  if (p.seq_len > p.model.seq_len) {
    fail(src, seq_node, "seq_len",
         std::to_string(p.seq_len) + " exceeds the model's seq_len " +
             std::to_string(p.model.seq_len) + "; valid: 1 to " + std::to_string(p.model.seq_len) +
             " (0: the model's)");
  }
  // global_batch counts every rank's samples; each rank runs accum_steps micro-batches. The
  // products are of sizes from the file: one past int64 is an error, never a wrapped value.
  const std::int64_t ranks = p.ranks;
  const std::int64_t micro = p.policy.micro_batch;
  std::int64_t hi = 0;
  if (__builtin_mul_overflow(p.accum_steps, micro, &hi) || __builtin_mul_overflow(hi, ranks, &hi)) {
    fail(src, accum_node.IsDefined() ? accum_node : global_node, "accum_steps",
         std::to_string(p.accum_steps) + " micro-batches of " + std::to_string(micro) + " on " +
             std::to_string(ranks) +
             " ranks is more than 2^63-1 samples per step; valid: a "
             "product of accum_steps, micro_batch and ranks below that");
  }
  const std::int64_t lo = hi - (micro - 1) * ranks;  // the last micro-batch down to 1 sample
  if (p.global_batch == 0) p.global_batch = hi;
  if (p.global_batch < lo || p.global_batch > hi || p.global_batch % ranks != 0) {
    const YAML::Node& n = global_node.IsDefined() ? global_node : accum_node;
    const std::string per = ranks > 1 ? std::to_string(ranks) + " ranks x " : "";
    const std::string mult = ranks > 1 ? "multiples of " + std::to_string(ranks) + " from " : "";
    fail(src, n, "global_batch",
         std::to_string(p.global_batch) + " is not reached by " + per +
             std::to_string(p.accum_steps) + " micro-batches of " + std::to_string(micro) +
             "; valid: " + mult + std::to_string(lo) + " to " + std::to_string(hi) +
             " (the last micro-batch may be smaller)");
  }
  if (p.policy.offload.delayed_update && !p.policy.offload.optimizer) {
    fail(src, delayed_node, "offload.delayed_update",
         "true needs offload.optimizer: true (it delays the CPU update)");
  }
  if (p.policy.offload.gradients && !p.policy.offload.optimizer) {
    fail(src, gradients_node, "offload.gradients",
         "true needs offload.optimizer: true (the CPU AdamW reads the gradients on the host)");
  }
  if (p.policy.offload.weights && !p.policy.offload.optimizer) {
    fail(src, weights_node, "offload.weights",
         "true needs offload.optimizer: true (the CPU AdamW writes the weights on the host)");
  }
  if (p.policy.offload.weights && p.policy.offload.delayed_update) {
    fail(src, weights_node, "offload.weights",
         "true with offload.delayed_update: true; valid: one of the two (the update in flight "
         "would rewrite the weights the next step fetches)");
  }
  try {
    p.policy.checkpoint =
        Checkpointing::from_parts(checkpoint_name, schedule_text, static_cast<int>(p.model.layers));
  } catch (const InvalidArgument& e) {
    fail(src, checkpoint_node, schedule_text.empty() ? "checkpoint" : "schedule", e.what());
  }
  return p;
}

// The peak figures as every JSON document names them.
nlohmann::ordered_json peaks_value(const PeakFigures& pk) {
  auto cats = [](const std::array<std::size_t, kCategoryCount>& a) {
    nlohmann::ordered_json c = nlohmann::ordered_json::object();
    for (std::size_t k = 0; k < kCategoryCount; ++k) {
      if (a[k] != 0) c[category_name(static_cast<Category>(k))] = a[k];
    }
    return c;
  };
  nlohmann::ordered_json j;
  j["peak_reserved_bytes"] = pk.reserved;
  j["peak_allocated_bytes"] = pk.allocated;
  j["peak_by_category"] = cats(pk.at_peak);
  j["cached_bytes_at_peak"] = pk.cached();
  j["category_peaks"] = cats(pk.category_peaks);
  j["host_pinned_bytes"] = pk.host_pinned;
  j["host_pinned_by_category"] = cats(pk.host_at_peak);
  return j;
}

nlohmann::ordered_json to_json_value(const Plan& p) {
  nlohmann::ordered_json j;
  const YAML::Node m = YAML::Load(p.model.to_yaml())["model"];
  // ModelSpec::to_yaml's scalars by their key: names as strings, switches as booleans,
  // epsilons and rope factors as numbers, sizes as integers; rope_scaling a map of them.
  std::function<nlohmann::ordered_json(const YAML::Node&)> convert = [&](const YAML::Node& node) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (const auto& kv : node) {
      const std::string k = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      if (v.IsMap()) {
        out[k] = convert(v);
      } else if (k == "kind" || k == "name" || k == "attention" || k == "type") {
        out[k] = v.as<std::string>();
      } else if (k == "tied_head" || k == "qk_norm" || k.ends_with("_bias")) {
        out[k] = v.as<bool>();
      } else if (k == "ln_eps" || k == "rope_theta" || k.ends_with("factor")) {
        out[k] = v.as<double>();
      } else {
        out[k] = v.as<std::int64_t>();
      }
    }
    return out;
  };
  const nlohmann::ordered_json model = convert(m);
  j["model"] = model;
  j["device"] = p.device;
  j["device_kind"] = device_kind_name(p.device_kind);
  j["budget_bytes"] = p.budget;
  j["seq_len"] = p.seq_len;
  j["global_batch"] = p.global_batch;
  j["micro_batch"] = p.policy.micro_batch;
  j["accum_steps"] = p.accum_steps;
  j["activation_dtype"] = dtype_name(p.policy.dtype);
  j["loss"] = loss_mode_name(p.policy.loss);
  j["checkpoint"] = p.policy.checkpoint.name();
  if (p.policy.checkpoint.has_ops()) j["schedule"] = p.policy.checkpoint.ops_text();
  j["offload"] = {{"optimizer", p.policy.offload.optimizer},
                  {"gradients", p.policy.offload.gradients},
                  {"weights", p.policy.offload.weights},
                  {"activations", p.policy.offload.activations},
                  {"delayed_update", p.policy.offload.delayed_update}};
  j["ranks"] = p.ranks;
  j["zero_stage"] = p.zero_stage;
  j["overlap_comm"] = p.overlap_comm;
  AllocatorConfig alloc = p.alloc;
  alloc.budget = 0;  // budget_bytes says it
  j["alloc_conf"] = alloc.to_string();
  nlohmann::ordered_json pred = peaks_value(p.predicted.peaks);
  pred["step_seconds"] = p.predicted.step_seconds;
  pred["tokens_per_second"] = p.predicted.tokens_per_second;
  j["predicted"] = pred;
  j["why"] = p.why;
  return j;
}

bool is_json_path(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".json") return true;
  if (ext == ".yaml" || ext == ".yml") return false;
  throw InvalidArgument("plan file '" + path + "': unknown extension '" + ext +
                        "'; valid: .yaml, .yml, .json");
}

}  // namespace

std::string peaks_json(const PeakFigures& p) { return peaks_value(p).dump(); }

RunSpec Plan::run_spec() const {
  RunSpec r;
  r.ranks = ranks;
  r.rank = 0;  // each process of a multi-rank run sets its own
  r.trainer.zero_stage = ranks > 1 ? zero_stage : 0;
  r.trainer.overlap_comm = overlap_comm;
  r.model = model;
  // micro_batch_split(global_batch, micro_batch) gives accum_steps micro-batches, the last one
  // taking what is left: exactly this plan.
  r.trainer.policy = policy;
  r.trainer.policy.accum = 0;
  r.batch = global_batch;
  r.seq_len = seq_len;
  r.alloc = alloc;
  r.alloc.budget = budget;
  r.device = device_kind;
  return r;
}

std::string Plan::describe() const {
  MemoryPolicy p = policy;
  p.accum = 0;  // a plan's accumulation is accum_steps, said below
  std::string s = p.describe();
  if (accum_steps > 1) {
    s += " x " + std::to_string(accum_steps) + " accumulated (global batch " +
         std::to_string(global_batch) + ")";
  }
  if (ranks > 1) s += ", " + std::to_string(ranks) + " ranks ZeRO-" + std::to_string(zero_stage);
  return s;
}

std::string Plan::to_json() const { return to_json_value(*this).dump(2) + "\n"; }

std::string Plan::to_yaml() const {
  // The JSON value in block style: one writer for both formats, so they cannot drift.
  const nlohmann::ordered_json j = to_json_value(*this);
  std::function<void(YAML::Emitter&, const nlohmann::ordered_json&)> emit =
      [&](YAML::Emitter& out, const nlohmann::ordered_json& v) {
        if (v.is_object()) {
          out << YAML::BeginMap;
          for (auto it = v.begin(); it != v.end(); ++it) {
            out << YAML::Key << it.key() << YAML::Value;
            emit(out, it.value());
          }
          out << YAML::EndMap;
        } else if (v.is_string()) {
          out << YAML::DoubleQuoted << v.get<std::string>();
        } else if (v.is_boolean()) {
          out << (v.get<bool>() ? "true" : "false");
        } else if (v.is_number_float()) {
          char buf[40];
          std::snprintf(buf, sizeof buf, "%.17g", v.get<double>());
          out << buf;
        } else {
          out << v.dump();
        }
      };
  YAML::Emitter out;
  emit(out, j);
  return std::string(out.c_str()) + "\n";
}

Plan Plan::from_yaml_string(std::string_view text, std::string_view source) {
  return parse(text, std::string(source), /*block_style=*/true);
}

Plan Plan::from_json_string(std::string_view text, std::string_view source) {
  const std::string src(source);
  try {
    const nlohmann::json checked = nlohmann::json::parse(text);  // the parser's own message
    (void)checked;
  } catch (const nlohmann::json::exception& e) {  // parse_error; out_of_range: 1e999
    throw ConfigError(src + ": malformed JSON plan: " + e.what());
  }
  // JSON is YAML's flow style: the same reader gives line numbers for every key.
  return parse(text, src, /*block_style=*/false);
}

Plan Plan::load(const std::string& path) {
  const bool json = is_json_path(path);
  const std::string text = read_file_bounded<ConfigError>(path, kMaxConfigFileBytes, "plan file");
  return json ? from_json_string(text, path) : from_yaml_string(text, path);
}

void Plan::save(const std::string& path) const {
  const std::string text = is_json_path(path) ? to_json() : to_yaml();
  // Written beside the target and renamed over it: a reader sees the old file or the new one.
  try {
    write_file_atomic(path, text);
  } catch (const Error& e) {
    throw ConfigError(path + ": cannot write the plan: " + e.what());
  }
}

}  // namespace memfit
