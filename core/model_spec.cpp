#include "core/model_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>

#include "core/backend.h"  // Backend::kMaxAttentionHeadSize
#include "core/yaml_document.h"
#include "memory/error.h"
#include "profiler/read_file.h"

namespace memfit {

namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
// Token ids and targets are int32 (core/backend.h's IndexTensor).
constexpr std::int64_t kMaxVocab = std::numeric_limits<std::int32_t>::max();

constexpr const char* kValidKeys =
    "kind, name, vocab, seq_len, layers, hidden, heads, mlp_ratio, tied_head, ln_eps, attention, "
    "and for kind llama intermediate, kv_heads, head_dim, rope_theta, rope_scaling, qkv_bias, "
    "proj_bias, mlp_bias, qk_norm";
constexpr std::array<const char*, 20> kKeys = {
    "kind",       "name",         "vocab",    "seq_len",   "layers",       "hidden",   "heads",
    "mlp_ratio",  "tied_head",    "ln_eps",   "attention", "intermediate", "kv_heads", "head_dim",
    "rope_theta", "rope_scaling", "qkv_bias", "proj_bias", "mlp_bias",     "qk_norm"};
// Keys only kind llama reads (the rest of kKeys from "intermediate" on).
bool llama_only_key(const std::string& key) {
  for (std::size_t i = 11; i < kKeys.size(); ++i) {
    if (key == kKeys[i]) return true;
  }
  return false;
}

// Where a message points: "file:line:col: " when the YAML gave a position, else "source: ".
struct Where {
  std::string source;
  std::map<std::string, YAML::Mark> marks;  // key -> position of its value

  std::string at(const std::string& key) const {
    const auto it = marks.find(key);
    if (it == marks.end() || it->second.is_null()) return source + ": ";
    return source + ":" + std::to_string(it->second.line + 1) + ":" +
           std::to_string(it->second.column + 1) + ": ";
  }
  std::string at(const YAML::Mark& m) const {
    if (m.is_null()) return source + ": ";
    return source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1) + ": ";
  }
};

[[noreturn]] void fail_key(const Where& w, const std::string& key, const std::string& what) {
  throw ConfigError(w.at(key) + "model." + key + ": " + what);
}

bool mul_ok(std::int64_t a, std::int64_t b, std::int64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}
bool add_ok(std::int64_t a, std::int64_t b, std::int64_t& out) {
  return !__builtin_add_overflow(a, b, &out);
}

// Products of sizes, checked: returns nullopt on int64 overflow.
std::optional<std::int64_t> product(std::initializer_list<std::int64_t> xs) {
  std::int64_t r = 1;
  for (std::int64_t x : xs) {
    if (!mul_ok(r, x, r)) return std::nullopt;
  }
  return r;
}

// Sums of products of sizes, checked: nullopt on int64 overflow.
std::optional<std::int64_t> sum(std::initializer_list<std::optional<std::int64_t>> xs) {
  std::int64_t r = 0;
  for (const auto& x : xs) {
    if (!x || !add_ok(r, *x, r)) return std::nullopt;
  }
  return r;
}

// Parameters of one block; nullopt on overflow. Sizes are validated >= 1 before this.
std::optional<std::int64_t> block_params(const ModelSpec& s) {
  const std::int64_t c = s.hidden;
  if (s.kind == ModelSpec::Kind::kLlama) {
    // Two RMSNorms (2C); qkv (q+2k, C) [+ q+2k]; [q_norm, k_norm (2hs)]; proj (C, q) [+ C];
    // gate_up (2F, C) [+ 2F]; down (C, F) [+ C].
    const auto q = product({s.heads, s.resolved_head_dim()});
    const auto k = product({s.resolved_kv_heads(), s.resolved_head_dim()});
    if (!q || !k) return std::nullopt;
    const auto qkv_rows = sum({q, product({2, *k})});
    if (!qkv_rows) return std::nullopt;
    const std::int64_t f = s.intermediate;
    return sum({product({2, c}), product({*qkv_rows, c}), s.qkv_bias ? qkv_rows : 0,
                s.qk_norm ? product({2, s.resolved_head_dim()}) : 0, product({c, *q}),
                s.proj_bias ? c : 0, product({3, f, c}),
                s.mlp_bias ? sum({product({2, f}), c}) : 0});
  }
  // mlp: fc (F,C)+F, proj (C,F)+C.
  const auto f = product({s.mlp_ratio, c});
  if (!f) return std::nullopt;
  const auto mlp = sum({product({2, *f, c}), f, c});
  if (s.kind == ModelSpec::Kind::kGpt) {
    // ln1 + ln2 (4C), qkv (3C,C)+3C, proj (C,C)+C.
    return sum({mlp, product({4, c, c}), product({8, c})});
  }
  return sum({mlp, product({2, c})});  // one LayerNorm
}

std::optional<std::int64_t> count_params(const ModelSpec& s) {
  const std::int64_t c = s.hidden;
  const auto wte = product({s.vocab, c});
  // GPT-2's learned position table; Llama's positions are rotary (no parameters).
  const auto wpe = s.kind == ModelSpec::Kind::kLlama ? 0 : product({s.seq_len, c});
  const auto blk = block_params(s);
  if (!blk) return std::nullopt;
  // The final norm: LayerNorm (2C) or RMSNorm (C).
  const std::int64_t final_norm = s.kind == ModelSpec::Kind::kLlama ? c : 2 * c;
  return sum({wte, wpe, product({*blk, s.layers}), final_norm,
              s.tied_head ? std::optional<std::int64_t>(0) : wte});
}

// kind llama's own keys; the shared ones are checked by validate_spec.
void validate_llama(const ModelSpec& s, const Where& w) {
  const auto at_least_1 = [&](const char* key, std::int64_t v) {
    if (v < 1) fail_key(w, key, "must be an integer >= 1, got " + std::to_string(v));
  };
  at_least_1("heads", s.heads);
  at_least_1("intermediate", s.intermediate);
  if (s.kv_heads < 0) {
    fail_key(w, "kv_heads",
             "must be an integer >= 1 (or absent: heads), got " + std::to_string(s.kv_heads));
  }
  if (s.head_dim < 0) {
    fail_key(
        w, "head_dim",
        "must be an integer >= 1 (or absent: hidden / heads), got " + std::to_string(s.head_dim));
  }
  if (s.qk_norm && s.attention == AttentionImpl::kMaterialized) {
    fail_key(w, "qk_norm", "true with attention: materialized; valid: attention: flash");
  }
  // Each query head's q and each kv head's k, v are one packed row block: at most 2^31 heads
  // keeps the (heads + 2 kv_heads) * head_dim arithmetic in range (CausalSelfAttention's rule).
  if (s.heads > (std::int64_t{1} << 31)) {
    fail_key(w, "heads", std::to_string(s.heads) + " exceeds 2^31 heads");
  }
  const std::int64_t g = s.resolved_kv_heads();
  if (g > s.heads || s.heads % g != 0) {
    fail_key(w, "kv_heads",
             std::to_string(g) + " does not divide heads " + std::to_string(s.heads) +
                 "; valid: a divisor of heads (grouped-query attention: each kv head serves "
                 "heads / kv_heads query heads)");
  }
  if (s.head_dim == 0 && s.hidden % s.heads != 0) return;  // validate_spec names it
  const std::int64_t hs = s.resolved_head_dim();
  if (hs % 2 != 0 || hs > Backend::kMaxAttentionHeadSize) {
    fail_key(w, s.head_dim > 0 ? "head_dim" : "heads",
             "a head size of " + std::to_string(hs) + (s.head_dim > 0 ? "" : " (hidden / heads)") +
                 "; valid: even (the rotary embedding rotates pairs) and at most " +
                 std::to_string(Backend::kMaxAttentionHeadSize) + " (flash attention's limit)");
  }
  if (s.attention == AttentionImpl::kMaterialized && g != s.heads) {
    fail_key(w, "attention",
             "materialized attention is multi-head only (kv_heads " + std::to_string(g) +
                 " < heads " + std::to_string(s.heads) + "); valid: flash");
  }
  if (!std::isfinite(s.rope_theta) || !(s.rope_theta > 1.0f)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", static_cast<double>(s.rope_theta));
    fail_key(w, "rope_theta", std::string("must be a finite number > 1, got ") + buf);
  }
  try {
    (void)rope_frequencies(hs, s.rope_theta, s.rope_scaling);
  } catch (const InvalidArgument& e) {
    fail_key(w, "rope_scaling", e.what());
  }
}

void validate_spec(const ModelSpec& s, const Where& w) {
  const auto at_least_1 = [&](const char* key, std::int64_t v) {
    if (v < 1) fail_key(w, key, "must be an integer >= 1, got " + std::to_string(v));
  };
  at_least_1("vocab", s.vocab);
  at_least_1("seq_len", s.seq_len);
  at_least_1("layers", s.layers);
  at_least_1("hidden", s.hidden);
  at_least_1("heads", s.heads);
  at_least_1("mlp_ratio", s.mlp_ratio);
  if (s.vocab > kMaxVocab) {
    fail_key(w, "vocab",
             std::to_string(s.vocab) +
                 " exceeds 2147483647 (token ids are int32); valid: 1 to "
                 "2147483647");
  }
  if (s.layers > std::numeric_limits<int>::max()) {
    fail_key(w, "layers", std::to_string(s.layers) + " exceeds 2147483647 blocks");
  }
  const bool llama = s.kind == ModelSpec::Kind::kLlama;
  if (llama) validate_llama(s, w);
  if ((s.kind == ModelSpec::Kind::kGpt || (llama && s.head_dim == 0)) && s.hidden % s.heads != 0) {
    // The first few divisors, looked for among 1..kLook only: a prime hidden of 3e8 took
    // seconds to list (found by fuzz_model_yaml), and no model has more heads than that.
    constexpr std::int64_t kLook = 4096;
    std::string divisors;
    int shown = 0;
    for (std::int64_t d = 1; d <= std::min(s.hidden, kLook) && shown < 8; ++d) {
      if (s.hidden % d == 0) divisors += (shown++ ? ", " : "") + std::to_string(d);
    }
    const bool more = shown == 8 || s.hidden > kLook;
    fail_key(w, "heads",
             std::to_string(s.heads) + " does not divide hidden " + std::to_string(s.hidden) +
                 "; valid: a divisor of hidden (" + divisors + (more ? ", ...)" : ")") +
                 (llama ? ", or an explicit head_dim" : ""));
  }
  if (!std::isfinite(s.ln_eps) || !(s.ln_eps > 0.0f) || s.ln_eps > 1.0f) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", static_cast<double>(s.ln_eps));
    fail_key(w, "ln_eps", std::string("must be in (0, 1], got ") + buf);
  }
  // Bytes of the largest tensors (f32, the widest dtype): each must fit in int64.
  const auto f = product({s.mlp_ratio, s.hidden});
  if (!f || !product({*f, s.hidden, 4})) {
    fail_key(w, "mlp_ratio",
             "mlp_ratio * hidden * hidden * 4 bytes overflows int64 (the MLP's weight)");
  }
  if (!product({s.vocab, s.hidden, 4})) {
    fail_key(w, "vocab", "vocab * hidden * 4 bytes overflows int64 (the token embedding)");
  }
  if (!product({s.seq_len, s.hidden, 4})) {
    fail_key(w, "seq_len",
             std::string("seq_len * hidden * 4 bytes overflows int64 (") +
                 (llama ? "one sequence's hidden states)" : "the position table)"));
  }
  if (!product({s.hidden, s.hidden, 12})) {
    fail_key(w, "hidden", "3 * hidden * hidden * 4 bytes overflows int64 (the QKV weight)");
  }
  if (llama &&
      (!product({s.intermediate, s.hidden, 8}) ||
       !product({s.heads + 2 * s.resolved_kv_heads(), s.resolved_head_dim(), s.hidden, 4}))) {
    fail_key(w, "intermediate",
             "the MLP's (2 * intermediate, hidden) or the attention's (heads + 2 * kv_heads) * "
             "head_dim x hidden f32 weight overflows int64");
  }
  if (!count_params(s)) {
    fail_key(
        w, "layers",
        "the parameter count overflows int64 (vocab " + std::to_string(s.vocab) + ", seq_len " +
            std::to_string(s.seq_len) + ", layers " + std::to_string(s.layers) + ", hidden " +
            std::to_string(s.hidden) +
            (llama ? ", heads " + std::to_string(s.heads) + ", kv_heads " +
                         std::to_string(s.kv_heads) + ", head_dim " + std::to_string(s.head_dim) +
                         ", intermediate " + std::to_string(s.intermediate)
                   : ", mlp_ratio " + std::to_string(s.mlp_ratio)) +
            ")");
  }
  if (llama) return;  // validate_llama checked the head size
  if (s.kind == ModelSpec::Kind::kGpt && s.attention == AttentionImpl::kFlash &&
      s.hidden / s.heads > Backend::kMaxAttentionHeadSize) {
    fail_key(w, "heads",
             std::to_string(s.heads) + " heads of " + std::to_string(s.hidden / s.heads) +
                 " (hidden / heads) exceed flash attention's head size limit of " +
                 std::to_string(Backend::kMaxAttentionHeadSize) +
                 "; valid: heads dividing hidden with hidden / heads <= " +
                 std::to_string(Backend::kMaxAttentionHeadSize) + ", or attention: materialized");
  }
}

// ---- YAML -----------------------------------------------------------------------------------

std::string scalar_text(const YAML::Node& n) { return n.IsScalar() ? n.Scalar() : std::string(); }

std::string node_kind(const YAML::Node& n) {
  if (n.IsMap()) return "a map";
  if (n.IsSequence()) return "a list";
  if (n.IsNull()) return "nothing (null)";
  return "'" + n.Scalar() + "'";
}

std::int64_t read_int(const Where& w, const std::string& key, const YAML::Node& n) {
  const std::string t = scalar_text(n);
  std::int64_t v = 0;
  const char* b = t.data();
  const char* e = t.data() + t.size();
  if (b != e && *b == '+') ++b;
  const auto r = std::from_chars(b, e, v);
  if (!n.IsScalar() || t.empty() || r.ec == std::errc::invalid_argument || r.ptr != e) {
    fail_key(w, key, "must be an integer >= 1, got " + node_kind(n));
  }
  if (r.ec == std::errc::result_out_of_range) {
    fail_key(
        w, key,
        "'" + t + "' overflows int64; valid: an integer from 1 to " + std::to_string(kInt64Max));
  }
  return v;
}

bool read_bool(const Where& w, const std::string& key, const YAML::Node& n) {
  const std::string t = scalar_text(n);
  if (n.IsScalar() && (t == "true" || t == "True" || t == "TRUE")) return true;
  if (n.IsScalar() && (t == "false" || t == "False" || t == "FALSE")) return false;
  fail_key(w, key, "must be true or false, got " + node_kind(n));
}

float read_float(const Where& w, const std::string& key, const YAML::Node& n) {
  const std::string t = scalar_text(n);
  char* end = nullptr;
  const double v = n.IsScalar() && !t.empty() ? std::strtod(t.c_str(), &end) : 0.0;
  if (!n.IsScalar() || t.empty() || end != t.c_str() + t.size()) {
    fail_key(w, key, "must be a number in (0, 1], got " + node_kind(n));
  }
  if (!std::isfinite(v) || !(v > 0.0) || v > 1.0 || static_cast<float>(v) == 0.0f) {
    fail_key(w, key, "must be a number in (0, 1] (nonzero in f32), got '" + t + "'");
  }
  return static_cast<float>(v);
}

// A finite number (range checks are validate's); `valid` says what would be.
float read_number(const Where& w, const std::string& key, const YAML::Node& n, const char* valid) {
  const std::string t = scalar_text(n);
  char* end = nullptr;
  const double v = n.IsScalar() && !t.empty() ? std::strtod(t.c_str(), &end) : 0.0;
  if (!n.IsScalar() || t.empty() || end != t.c_str() + t.size() || !std::isfinite(v) ||
      std::fabs(v) > 3.0e38) {
    fail_key(w, key, std::string("must be ") + valid + ", got " + node_kind(n));
  }
  return static_cast<float>(v);
}

// rope_scaling: null / {type: none} or {type: llama3, factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings} (each optional, RopeScaling's defaults).
RopeScaling read_rope_scaling(const Where& w, const YAML::Node& n) {
  RopeScaling r;
  if (n.IsNull()) return r;
  if (!n.IsMap()) {
    fail_key(w, "rope_scaling", "must be a map {type: none or llama3, ...}, got " + node_kind(n));
  }
  bool typed = false;
  std::string type;
  std::vector<std::string> seen;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string k = scalar_text(it->first);
    if (std::find(seen.begin(), seen.end(), k) != seen.end()) {
      fail_key(w, "rope_scaling", "duplicate key '" + k + "'");
    }
    seen.push_back(k);
    const YAML::Node v = it->second;  // a copy: the iterator's pair is a temporary
    const std::string key = "rope_scaling." + k;
    if (k == "type" || k == "rope_type") {
      type = scalar_text(v);
      typed = true;
    } else if (k == "factor") {
      r.factor = read_number(w, key, v, "a number > 0");
    } else if (k == "low_freq_factor") {
      r.low_freq_factor = read_number(w, key, v, "a number > 0");
    } else if (k == "high_freq_factor") {
      r.high_freq_factor = read_number(w, key, v, "a number > low_freq_factor");
    } else if (k == "original_max_position_embeddings") {
      r.original_max_position_embeddings = read_int(w, key, v);
    } else {
      fail_key(w, "rope_scaling",
               "unknown key '" + k +
                   "'; valid: type, factor, low_freq_factor, high_freq_factor, "
                   "original_max_position_embeddings");
    }
  }
  if (!typed) fail_key(w, "rope_scaling", "type: missing; valid: none or llama3");
  if (type == "llama3") {
    r.kind = RopeScaling::Kind::kLlama3;
  } else if (type != "none" && type != "default") {
    fail_key(w, "rope_scaling",
             "type '" + type +
                 "' is not supported; valid: none or llama3 (linear, dynamic, yarn, longrope "
                 "are not implemented)");
  }
  return r;
}

ModelSpec parse_model_map(const YAML::Node& m, Where& w) {
  ModelSpec s;
  std::map<std::string, YAML::Node> values;
  for (auto it = m.begin(); it != m.end(); ++it) {
    const std::string key = scalar_text(it->first);
    if (!it->first.IsScalar()) {
      throw ConfigError(w.at(it->first.Mark()) +
                        "model: keys must be names; valid keys: " + kValidKeys);
    }
    bool known = false;
    for (const char* k : kKeys) known = known || key == k;
    if (!known) {
      throw ConfigError(w.at(it->first.Mark()) + "model." + key +
                        ": unknown key; valid keys: " + kValidKeys);
    }
    if (values.count(key)) {
      throw ConfigError(w.at(it->first.Mark()) + "model." + key + ": duplicate key");
    }
    values[key] = it->second;
    w.marks[key] = it->second.Mark();
  }
  const auto need = [&](const char* key) -> const YAML::Node& {
    const auto it = values.find(key);
    if (it == values.end()) {
      throw ConfigError(w.at(m.Mark()) + "model." + key +
                        ": missing; required keys: kind, vocab, seq_len, layers, hidden (and "
                        "heads for kinds gpt and llama, intermediate for llama)");
    }
    return it->second;
  };
  const YAML::Node& kind = need("kind");
  const std::string k = scalar_text(kind);
  if (kind.IsScalar() && k == "gpt") {
    s.kind = ModelSpec::Kind::kGpt;
  } else if (kind.IsScalar() && k == "mlp") {
    s.kind = ModelSpec::Kind::kMlp;
  } else if (kind.IsScalar() && k == "llama") {
    s.kind = ModelSpec::Kind::kLlama;
    s.tied_head = false;  // Llama's default (LlamaConfig.tie_word_embeddings)
    s.ln_eps = 1e-6f;     // LlamaConfig.rms_norm_eps
  } else {
    fail_key(w, "kind", "must be gpt, llama or mlp, got " + node_kind(kind));
  }
  const bool llama = s.kind == ModelSpec::Kind::kLlama;
  if (llama && values.count("mlp_ratio")) {
    fail_key(w, "mlp_ratio", "is not a kind llama key; llama's MLP width is intermediate");
  }
  for (const auto& [key, node] : values) {
    if (!llama && llama_only_key(key)) {
      fail_key(w, key,
               std::string("is a kind llama key; kind ") + model_kind_name(s.kind) +
                   " has no such setting");
    }
  }
  if (values.count("name")) {
    const YAML::Node& n = values["name"];
    if (!n.IsScalar()) fail_key(w, "name", "must be a string, got " + node_kind(n));
    s.name = n.Scalar();
  }
  s.vocab = read_int(w, "vocab", need("vocab"));
  s.seq_len = read_int(w, "seq_len", need("seq_len"));
  s.layers = read_int(w, "layers", need("layers"));
  s.hidden = read_int(w, "hidden", need("hidden"));
  if (s.kind != ModelSpec::Kind::kMlp) {
    s.heads = read_int(w, "heads", need("heads"));
  } else if (values.count("heads")) {
    s.heads = read_int(w, "heads", values["heads"]);  // accepted (round trip), unused
  }
  if (values.count("mlp_ratio")) s.mlp_ratio = read_int(w, "mlp_ratio", values["mlp_ratio"]);
  if (values.count("tied_head")) s.tied_head = read_bool(w, "tied_head", values["tied_head"]);
  if (values.count("ln_eps")) s.ln_eps = read_float(w, "ln_eps", values["ln_eps"]);
  if (llama) {
    s.intermediate = read_int(w, "intermediate", need("intermediate"));
    // 0 in the struct means "absent"; written out, a size must be >= 1.
    for (const char* key : {"kv_heads", "head_dim"}) {
      if (!values.count(key)) continue;
      const std::int64_t v = read_int(w, key, values[key]);
      if (v < 1) fail_key(w, key, "must be an integer >= 1 (or absent), got " + std::to_string(v));
      (std::string(key) == "kv_heads" ? s.kv_heads : s.head_dim) = v;
    }
    if (values.count("rope_theta")) {
      s.rope_theta = read_number(w, "rope_theta", values["rope_theta"], "a number > 1");
    }
    if (values.count("rope_scaling")) s.rope_scaling = read_rope_scaling(w, values["rope_scaling"]);
    for (const char* b : {"qkv_bias", "proj_bias", "mlp_bias", "qk_norm"}) {
      if (!values.count(b)) continue;
      bool& field = std::string(b) == "qkv_bias"    ? s.qkv_bias
                    : std::string(b) == "proj_bias" ? s.proj_bias
                    : std::string(b) == "mlp_bias"  ? s.mlp_bias
                                                    : s.qk_norm;
      field = read_bool(w, b, values[b]);
    }
  }
  if (values.count("attention")) {
    const YAML::Node& a = values["attention"];
    const std::string v = a.IsScalar() ? a.Scalar() : "";
    if (!a.IsScalar() || !parse_attention_impl(v, &s.attention)) {
      fail_key(w, "attention",
               "must be flash (tiled, O(T) memory; the default) or materialized (the (T, T) "
               "probabilities saved, as memfit before flash attention), got " +
                   (a.IsScalar() ? "'" + v + "'" : node_kind(a)));
    }
  }
  return s;
}

}  // namespace

const char* model_kind_name(ModelSpec::Kind k) {
  switch (k) {
    case ModelSpec::Kind::kGpt:
      return "gpt";
    case ModelSpec::Kind::kMlp:
      return "mlp";
    case ModelSpec::Kind::kLlama:
      return "llama";
  }
  return "?";
}

ModelSpec ModelSpec::from_yaml_string(std::string_view text, std::string_view source) {
  Where w{std::string(source), {}};
  YAML::Node root;
  try {
    const YamlDocument d = load_yaml_document(text);
    if (d.more) {
      throw ConfigError(w.at(d.second) +
                        "a second YAML document; valid: one document (the model: map)");
    }
    root = d.root;
  } catch (const YAML::Exception& e) {
    throw ConfigError(w.at(e.mark) + "not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) {
    throw ConfigError(w.at(root.Mark()) +
                      "expected a map with one key 'model' (model: {kind: gpt, vocab: ...}), "
                      "got " +
                      node_kind(root));
  }
  YAML::Node model;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = scalar_text(it->first);
    if (key != "model") {
      throw ConfigError(w.at(it->first.Mark()) + key +
                        ": unknown top-level key; valid: model (one map)");
    }
    model = it->second;
  }
  if (!model.IsDefined() || !model.IsMap()) {
    throw ConfigError(w.at(root.Mark()) + "model: must be a map of " + kValidKeys + ", got " +
                      (model.IsDefined() ? node_kind(model) : std::string("nothing")));
  }
  ModelSpec s = parse_model_map(model, w);
  validate_spec(s, w);
  return s;
}

ModelSpec ModelSpec::from_yaml_file(const std::string& path) {
  const BoundedRead r = try_read_file_bounded(path, kMaxConfigFileBytes, "model spec");
  if (!r.error.empty()) {
    std::string names;
    for (const std::string& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw ConfigError(r.error + " (a YAML file), or a preset name (" + names + ")");
  }
  return from_yaml_string(r.bytes, path);
}

ModelSpec ModelSpec::load(const std::string& name_or_path, std::vector<std::string>* notes) {
  for (const std::string& p : preset_names()) {
    if (name_or_path == p) return preset(name_or_path);
  }
  const std::string_view v(name_or_path);
  if (v.size() >= 5 && v.substr(v.size() - 5) == ".json")
    return from_hf_config_file(name_or_path, notes);
  return from_yaml_file(name_or_path);
}

void ModelSpec::validate() const { validate_spec(*this, Where{"<spec>", {}}); }

std::int64_t ModelSpec::parameter_count() const {
  validate();
  const auto n = count_params(*this);
  return *n;  // validate() rejected an overflow
}

std::string ModelSpec::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "kind" << YAML::Value << model_kind_name(kind);
  out << YAML::Key << "name" << YAML::Value << YAML::DoubleQuoted << name;
  out << YAML::Key << "vocab" << YAML::Value << vocab;
  out << YAML::Key << "seq_len" << YAML::Value << seq_len;
  out << YAML::Key << "layers" << YAML::Value << layers;
  out << YAML::Key << "hidden" << YAML::Value << hidden;
  out << YAML::Key << "heads" << YAML::Value << heads;
  const auto exact = [](float v) {  // %.9g is exact for a float
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
    return std::string(buf);
  };
  if (kind == Kind::kLlama) {
    out << YAML::Key << "kv_heads" << YAML::Value << resolved_kv_heads();
    out << YAML::Key << "head_dim" << YAML::Value << resolved_head_dim();
    out << YAML::Key << "intermediate" << YAML::Value << intermediate;
    out << YAML::Key << "rope_theta" << YAML::Value << exact(rope_theta);
    out << YAML::Key << "rope_scaling" << YAML::Value << YAML::Flow << YAML::BeginMap;
    if (rope_scaling.kind == RopeScaling::Kind::kLlama3) {
      out << YAML::Key << "type" << YAML::Value << "llama3";
      out << YAML::Key << "factor" << YAML::Value << exact(rope_scaling.factor);
      out << YAML::Key << "low_freq_factor" << YAML::Value << exact(rope_scaling.low_freq_factor);
      out << YAML::Key << "high_freq_factor" << YAML::Value << exact(rope_scaling.high_freq_factor);
      out << YAML::Key << "original_max_position_embeddings" << YAML::Value
          << rope_scaling.original_max_position_embeddings;
    } else {
      out << YAML::Key << "type" << YAML::Value << "none";
    }
    out << YAML::EndMap;
    out << YAML::Key << "qkv_bias" << YAML::Value << (qkv_bias ? "true" : "false");
    out << YAML::Key << "proj_bias" << YAML::Value << (proj_bias ? "true" : "false");
    out << YAML::Key << "mlp_bias" << YAML::Value << (mlp_bias ? "true" : "false");
    if (qk_norm) out << YAML::Key << "qk_norm" << YAML::Value << "true";  // absent: false
  } else {
    out << YAML::Key << "mlp_ratio" << YAML::Value << mlp_ratio;
  }
  out << YAML::Key << "tied_head" << YAML::Value << (tied_head ? "true" : "false");
  out << YAML::Key << "ln_eps" << YAML::Value << exact(ln_eps);
  out << YAML::Key << "attention" << YAML::Value << attention_impl_name(attention);
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::int64_t ModelSpec::resolve_seq_len(std::int64_t requested) const {
  if (requested == 0) return seq_len;
  if (requested < 1 || requested > seq_len) {
    throw InvalidArgument("seq_len " + std::to_string(requested) + ": valid: 1 to " +
                          std::to_string(seq_len) + " (" + name + "'s seq_len; 0: that)");
  }
  return requested;
}

}  // namespace memfit
