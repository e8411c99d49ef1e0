// ModelSpec::from_hf_config_*: a HuggingFace transformers config.json as a ModelSpec of kind
// llama (the contract is in core/model_spec.h). The keys and their defaults follow
// transformers' LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config (configuration_*.py).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "core/model_spec.h"
#include "memory/error.h"
#include "profiler/read_file.h"

namespace memfit {

namespace {

using Json = nlohmann::json;

struct Family {
  const char* model_type;
  const char* architecture;  // the causal-LM class its `architectures` names
};
constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM"},
    {"mistral", "MistralForCausalLM"},
    {"qwen2", "Qwen2ForCausalLM"},
    {"qwen3", "Qwen3ForCausalLM"},
};
constexpr const char* kSupported = "llama, mistral, qwen2, qwen3";

// Keys read below; every other key is reported in the notes as ignored.
const std::set<std::string>& read_keys() {
  static const std::set<std::string> k = {"model_type",
                                          "architectures",
                                          "vocab_size",
                                          "hidden_size",
                                          "intermediate_size",
                                          "num_hidden_layers",
                                          "num_attention_heads",
                                          "num_key_value_heads",
                                          "head_dim",
                                          "rms_norm_eps",
                                          "rope_theta",
                                          "rope_scaling",
                                          "rope_parameters",
                                          "tie_word_embeddings",
                                          "attention_bias",
                                          "mlp_bias",
                                          "hidden_act",
                                          "max_position_embeddings",
                                          "sliding_window",
                                          "use_sliding_window",
                                          "max_window_layers",
                                          "layer_types",
                                          "torch_dtype",
                                          "dtype",
                                          "_name_or_path",
                                          "name_or_path"};
  return k;
}

// Where in the text a byte offset is, as "line:col".
std::string line_col(std::string_view text, std::size_t byte) {
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return std::to_string(line) + ":" + std::to_string(col);
}

std::string kind_of(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number()) return v.dump();
  if (v.is_string()) return "\"" + v.get<std::string>() + "\"";
  if (v.is_array()) return "a list";
  return "an object";
}

class Reader {
 public:
  // `prefix` names a nested object's keys ("rope_scaling.").
  Reader(const Json& j, std::string source, std::string prefix = "")
      : j_(j), src_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(src_ + ": " + prefix_ + key + ": " + what);
  }
  const std::string& source() const { return src_; }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const Json& at(const char* key) const { return j_.at(key); }

  std::int64_t integer(const char* key, bool required, std::int64_t fallback) const {
    if (!has(key)) {
      if (required) fail(key, "missing; a Llama-family config.json has it (an integer >= 1)");
      return fallback;
    }
    const Json& v = at(key);
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(INT64_MAX))) {
      fail(key, "must be an integer >= 1, got " + kind_of(v));
    }
    const auto n = v.get<std::int64_t>();
    if (n < 1) fail(key, "must be an integer >= 1, got " + std::to_string(n));
    return n;
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const Json& v = at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      fail(key, "must be a number, got " + kind_of(v));
    }
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const Json& v = at(key);
    if (!v.is_boolean()) fail(key, "must be true or false, got " + kind_of(v));
    return v.get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const Json& v = at(key);
    if (!v.is_string()) fail(key, "must be a string, got " + kind_of(v));
    return v.get<std::string>();
  }

 private:
  const Json& j_;
  std::string src_;
  std::string prefix_;
};

float to_float(const Reader& r, const char* key, double v) {
  if (std::fabs(v) > double(std::numeric_limits<float>::max()) ||
      (v != 0.0 && std::fabs(v) < double(std::numeric_limits<float>::min()))) {
    r.fail(key, "out of f32 range (a normal f32: magnitude 1.2e-38 to 3.4e38)");
  }
  return static_cast<float>(v);
}

RopeScaling read_rope_scaling(const Reader& r, const Json& j) {
  RopeScaling s;
  if (j.is_null()) return s;
  if (!j.is_object()) r.fail("rope_scaling", "must be null or an object, got " + kind_of(j));
  // transformers writes rope_type (newer) or type (older); both present must agree.
  const Json* type = j.contains("rope_type") ? &j.at("rope_type")
                     : j.contains("type")    ? &j.at("type")
                                             : nullptr;
  if (j.contains("rope_type") && j.contains("type") && j.at("rope_type") != j.at("type")) {
    r.fail("rope_scaling", "rope_type " + kind_of(j.at("rope_type")) + " and type " +
                               kind_of(j.at("type")) + " disagree; valid: one of them");
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    static const std::set<std::string> known = {
        "rope_type",        "type",
        "factor",           "low_freq_factor",
        "high_freq_factor", "original_max_position_embeddings",
        "rope_theta"};
    if (!known.count(it.key())) {
      r.fail("rope_scaling", "unknown key \"" + it.key() +
                                 "\"; valid: rope_type, factor, low_freq_factor, "
                                 "high_freq_factor, original_max_position_embeddings");
    }
  }
  if (type == nullptr || !type->is_string()) {
    r.fail("rope_scaling", "rope_type: missing or not a string; valid: \"default\" or \"llama3\"");
  }
  const std::string t = type->get<std::string>();
  if (t == "default") return s;
  if (t != "llama3") {
    r.fail("rope_scaling",
           "rope_type \"" + t +
               "\" is not supported; valid: \"default\" or \"llama3\" (linear, dynamic, yarn, "
               "longrope and su are not implemented)");
  }
  s.kind = RopeScaling::Kind::kLlama3;
  // transformers' llama3 rule requires all four parameters (no defaults).
  for (const char* k :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    if (!j.contains(k)) r.fail(std::string("rope_scaling.") + k, "missing; llama3 needs it");
  }
  const Reader sub(j, r.source(), "rope_scaling.");
  s.factor = to_float(r, "rope_scaling.factor", sub.number("factor", s.factor));
  s.low_freq_factor =
      to_float(r, "rope_scaling.low_freq_factor", sub.number("low_freq_factor", s.low_freq_factor));
  s.high_freq_factor = to_float(r, "rope_scaling.high_freq_factor",
                                sub.number("high_freq_factor", s.high_freq_factor));
  if (j.contains("original_max_position_embeddings")) {
    const Json& o = j.at("original_max_position_embeddings");
    if (!o.is_number_integer() || o.get<std::int64_t>() < 1) {
      r.fail("rope_scaling.original_max_position_embeddings",
             "must be an integer >= 1, got " + kind_of(o));
    }
    s.original_max_position_embeddings = o.get<std::int64_t>();
  }
  return s;
}

// The model's name: _name_or_path's last component, else the directory holding config.json
// (models/Llama-3.1-8B/config.json -> Llama-3.1-8B), else the file's stem.
std::string default_name(std::string_view source) {
  std::string p(source);
  const auto slash = p.find_last_of('/');
  std::string file = slash == std::string::npos ? p : p.substr(slash + 1);
  if (file == "config.json" && slash != std::string::npos && slash > 0) {
    const std::string dir = p.substr(0, slash);
    const auto s2 = dir.find_last_of('/');
    return s2 == std::string::npos ? dir : dir.substr(s2 + 1);
  }
  if (file.size() > 5 && file.substr(file.size() - 5) == ".json") file.resize(file.size() - 5);
  return file.empty() ? "hf-model" : file;
}

}  // namespace

ModelSpec ModelSpec::from_hf_config_string(std::string_view text, std::string_view source,
                                           std::vector<std::string>* notes) {
  const std::string src(source);
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    throw ConfigError(src + ":" + line_col(text, e.byte > 0 ? e.byte - 1 : 0) +
                      ": not valid JSON (" + e.what() + ")");
  } catch (const Json::exception& e) {  // a number past double's range (out_of_range.406)
    throw ConfigError(src + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) {
    throw ConfigError(src + ": a HuggingFace config.json is one JSON object, got " + kind_of(j));
  }
  const Reader r(j, src);
  if (!r.has("model_type")) {
    r.fail("model_type", std::string("missing; valid: ") + kSupported);
  }
  const std::string type = r.string("model_type", "");
  const Family* fam = nullptr;
  for (const Family& f : kFamilies) {
    if (type == f.model_type) fam = &f;
  }
  if (fam == nullptr) {
    std::string why;
    if (type == "mixtral" || type == "qwen2_moe" || type == "qwen3_moe" || type == "deepseek_v3" ||
        type == "dbrx") {
      why = " (a mixture of experts: not supported)";
    }
    r.fail("model_type", "\"" + type + "\"" + why + " is not supported; valid: " + kSupported);
  }
  if (r.has("architectures")) {
    const Json& a = r.at("architectures");
    bool found = false;
    if (!a.is_array()) r.fail("architectures", "must be a list of class names, got " + kind_of(a));
    std::string listed;
    for (const Json& x : a) {
      if (!x.is_string()) r.fail("architectures", "must be a list of strings");
      listed += (listed.empty() ? "" : ", ") + x.get<std::string>();
      found = found || x.get<std::string>() == fam->architecture;
    }
    if (!found) {
      r.fail("architectures", "[" + listed + "] does not name " + fam->architecture +
                                  ", the causal language model of model_type \"" + type +
                                  "\"; memfit trains that one");
    }
  }
  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu") {
    r.fail("hidden_act", "\"" + act + "\"; valid: \"silu\" (SwiGLU, the only MLP memfit builds)");
  }

  ModelSpec s;
  s.kind = Kind::kLlama;
  s.name = default_name(source);
  for (const char* k : {"_name_or_path", "name_or_path"}) {
    std::string n = r.string(k, "");
    while (!n.empty() && n.back() == '/') n.pop_back();
    const auto slash = n.find_last_of('/');
    if (slash != std::string::npos) n = n.substr(slash + 1);
    if (!n.empty()) s.name = n;
  }
  s.vocab = r.integer("vocab_size", true, 0);
  s.hidden = r.integer("hidden_size", true, 0);
  s.intermediate = r.integer("intermediate_size", true, 0);
  s.layers = r.integer("num_hidden_layers", true, 0);
  s.heads = r.integer("num_attention_heads", true, 0);
  // Absent: the family's default (MistralConfig 8, Qwen2Config and Qwen3Config 32;
  // LlamaConfig: heads); null means heads everywhere.
  const bool qwen3 = type == "qwen3";
  const bool kv_absent = !j.contains("num_key_value_heads");
  const std::int64_t kv_default = !kv_absent                 ? 0
                                  : type == "mistral"        ? 8
                                  : type == "qwen2" || qwen3 ? 32
                                                             : 0;
  s.kv_heads = r.integer("num_key_value_heads", false, kv_default);
  // Qwen3Config's head_dim defaults to 128, not hidden / heads.
  s.head_dim = r.integer("head_dim", false, qwen3 && !j.contains("head_dim") ? 128 : 0);
  s.seq_len = r.integer("max_position_embeddings", true, 0);
  s.ln_eps = to_float(r, "rms_norm_eps", r.number("rms_norm_eps", 1e-6));
  s.rope_theta = to_float(r, "rope_theta", r.number("rope_theta", 10000.0));
  if (r.has("rope_scaling")) s.rope_scaling = read_rope_scaling(r, r.at("rope_scaling"));
  // transformers 5 writes rope_parameters: rope_theta and the scaling in one object.
  if (r.has("rope_parameters")) {
    if (r.has("rope_scaling")) {
      r.fail("rope_parameters", "given with rope_scaling; valid: one of them");
    }
    const Json& p = r.at("rope_parameters");
    s.rope_scaling = read_rope_scaling(r, p);
    if (p.is_object() && p.contains("rope_theta")) {
      const Reader sub(p, src, "rope_parameters.");
      s.rope_theta = to_float(r, "rope_parameters.rope_theta", sub.number("rope_theta", 0));
    }
  }
  s.tied_head = r.boolean("tie_word_embeddings", false);
  if (type == "qwen2") {
    s.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o_proj without
  } else {
    // LlamaAttention and Qwen3Attention: all four
    const bool bias = r.boolean("attention_bias", false);
    s.qkv_bias = bias;
    s.proj_bias = bias;
  }
  s.mlp_bias = r.boolean("mlp_bias", false);
  s.qk_norm = qwen3;  // Qwen3Attention's q_norm, k_norm (RMSNorm over head_dim, rms_norm_eps)

  std::vector<std::string> said;
  // A sliding window narrower than the context: memfit's attention is full causal, which is
  // the same function for sequences up to the window, so the window is the longest sequence.
  // Mistral's window applies to every layer; Qwen2's and Qwen3's only with use_sliding_window,
  // and then only to the layers `layer_types` names "sliding_attention", or without it to
  // layers i >= max_window_layers (default 28), as transformers' Qwen2Config / Qwen3Config
  // build layer_types. The window: sliding_window, 4096 when the key is absent (all three
  // configs' default), none when null. Llama has none.
  bool sliding = type == "mistral";
  if ((type == "qwen2" || qwen3) && r.boolean("use_sliding_window", false)) {
    if (r.has("layer_types")) {
      const Json& lt = r.at("layer_types");
      if (!lt.is_array()) r.fail("layer_types", "must be a list of strings, got " + kind_of(lt));
      for (const Json& x : lt) {
        if (!x.is_string()) r.fail("layer_types", "must be a list of strings, got " + kind_of(x));
        sliding = sliding || x.get<std::string>() == "sliding_attention";
      }
    } else {
      std::int64_t first = 28;  // max_window_layers: the first layer that slides
      if (r.has("max_window_layers")) {
        const Json& v = r.at("max_window_layers");
        if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<std::int64_t>() < 0)) {
          r.fail("max_window_layers", "must be an integer >= 0, got " + kind_of(v));
        }
        first = v.is_number_unsigned() ? static_cast<std::int64_t>(std::min<std::uint64_t>(
                                             v.get<std::uint64_t>(), std::uint64_t{INT64_MAX}))
                                       : v.get<std::int64_t>();
      }
      sliding = first < s.layers;
    }
    if (!sliding) {
      said.push_back(
          "use_sliding_window is true, but no layer slides (max_window_layers >= "
          "num_hidden_layers, or no \"sliding_attention\" in layer_types): full attention");
    }
  }
  const bool absent = !j.contains("sliding_window");
  if (sliding && (r.has("sliding_window") || absent)) {
    const std::int64_t w = absent ? 4096 : r.integer("sliding_window", false, 0);
    if (w < s.seq_len) {
      said.push_back("sliding_window " + std::to_string(w) + " < max_position_embeddings " +
                     std::to_string(s.seq_len) + ": seq_len is " + std::to_string(w) +
                     " (memfit's attention is full causal, the same up to the window)");
      s.seq_len = w;
    }
  }
  const std::string dt = r.string("torch_dtype", r.string("dtype", ""));
  if (!dt.empty()) {
    said.push_back("the checkpoint's dtype is " + dt +
                   "; memfit's compute dtype is a policy (memfit plan searches f32, f16 and bf16; "
                   "memfit train --dtype)");
  }
  std::string ignored;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!read_keys().count(it.key())) ignored += (ignored.empty() ? "" : ", ") + it.key();
  }
  if (!ignored.empty()) said.push_back("keys memfit does not use, ignored: " + ignored);
  try {
    s.validate();
  } catch (const ConfigError& e) {
    // validate names memfit's keys (model.heads ...); say which file they came from.
    std::string what = e.what();
    if (what.rfind("<spec>: ", 0) == 0) what = what.substr(8);
    throw ConfigError(src + ": " + what +
                      " (memfit's names: hidden = hidden_size, heads = num_attention_heads, "
                      "kv_heads = num_key_value_heads, intermediate = intermediate_size, ln_eps "
                      "= rms_norm_eps, seq_len = max_position_embeddings)");
  }
  if (notes != nullptr) {
    for (std::string& n : said) notes->push_back(src + ": " + n);
  }
  return s;
}

ModelSpec ModelSpec::from_hf_config_file(const std::string& path, std::vector<std::string>* notes) {
  // A config.json is a few KB; the cap keeps a wrong path (/dev/zero, a checkpoint) from being
  // read whole.
  const BoundedRead r = try_read_file_bounded(path, kMaxConfigFileBytes, "model config");
  if (!r.error.empty()) throw ConfigError(r.error + " (a HuggingFace config.json, a few KB)");
  return from_hf_config_string(r.bytes, path, notes);
}

}  // namespace memfit
