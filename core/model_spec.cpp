#include "core/model_spec.h"

#include <yaml-cpp/yaml.h>

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
#include "memory/error.h"

namespace memfit {

namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
// Token ids and targets are int32 (core/backend.h's IndexTensor).
constexpr std::int64_t kMaxVocab = std::numeric_limits<std::int32_t>::max();

constexpr const char* kValidKeys =
    "kind, name, vocab, seq_len, layers, hidden, heads, mlp_ratio, tied_head, ln_eps, attention";

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

// Parameters of one block; nullopt on overflow. Sizes are validated >= 1 before this.
std::optional<std::int64_t> block_params(const ModelSpec& s) {
  const std::int64_t c = s.hidden;
  const auto f = product({s.mlp_ratio, c});
  if (!f) return std::nullopt;
  // mlp: fc (F,C)+F, proj (C,F)+C.
  const auto fc = product({*f, c});
  if (!fc) return std::nullopt;
  std::int64_t mlp = 0;
  if (!add_ok(*fc, *fc, mlp) || !add_ok(mlp, *f, mlp) || !add_ok(mlp, c, mlp)) {
    return std::nullopt;
  }
  std::int64_t total = mlp;
  if (s.kind == ModelSpec::Kind::kGpt) {
    // ln1 + ln2 (4C), qkv (3C,C)+3C, proj (C,C)+C.
    const auto cc = product({c, c, 4});
    if (!cc || !add_ok(total, *cc, total) || !add_ok(total, 8 * c, total)) return std::nullopt;
  } else {
    if (!add_ok(total, 2 * c, total)) return std::nullopt;  // one LayerNorm
  }
  return total;
}

std::optional<std::int64_t> count_params(const ModelSpec& s) {
  const std::int64_t c = s.hidden;
  const auto wte = product({s.vocab, c});
  const auto wpe = product({s.seq_len, c});
  const auto blk = block_params(s);
  if (!wte || !wpe || !blk) return std::nullopt;
  const auto blocks = product({*blk, s.layers});
  if (!blocks) return std::nullopt;
  std::int64_t n = 0;
  if (!add_ok(*wte, *wpe, n) || !add_ok(n, *blocks, n) || !add_ok(n, 2 * c, n)) {
    return std::nullopt;
  }
  if (!s.tied_head && !add_ok(n, *wte, n)) return std::nullopt;
  return n;
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
  if (s.kind == ModelSpec::Kind::kGpt && s.hidden % s.heads != 0) {
    std::string divisors;
    int shown = 0;
    for (std::int64_t d = 1; d <= s.hidden && shown < 8; ++d) {
      if (s.hidden % d == 0) divisors += (shown++ ? ", " : "") + std::to_string(d);
    }
    fail_key(w, "heads",
             std::to_string(s.heads) + " does not divide hidden " + std::to_string(s.hidden) +
                 "; valid: a divisor of hidden (" + divisors + (shown == 8 ? ", ...)" : ")"));
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
    fail_key(w, "seq_len", "seq_len * hidden * 4 bytes overflows int64 (the position table)");
  }
  if (!product({s.hidden, s.hidden, 12})) {
    fail_key(w, "hidden", "3 * hidden * hidden * 4 bytes overflows int64 (the QKV weight)");
  }
  if (!count_params(s)) {
    fail_key(w, "layers",
             "the parameter count overflows int64 (vocab " + std::to_string(s.vocab) +
                 ", seq_len " + std::to_string(s.seq_len) + ", layers " + std::to_string(s.layers) +
                 ", hidden " + std::to_string(s.hidden) + ", mlp_ratio " +
                 std::to_string(s.mlp_ratio) + ")");
  }
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

ModelSpec parse_model_map(const YAML::Node& m, Where& w) {
  ModelSpec s;
  std::map<std::string, YAML::Node> values;
  for (auto it = m.begin(); it != m.end(); ++it) {
    const std::string key = scalar_text(it->first);
    if (!it->first.IsScalar()) {
      throw ConfigError(w.at(it->first.Mark()) +
                        "model: keys must be names; valid keys: " + kValidKeys);
    }
    static const std::array<const char*, 11> kKeys = {
        "kind",  "name",      "vocab",     "seq_len", "layers",   "hidden",
        "heads", "mlp_ratio", "tied_head", "ln_eps",  "attention"};
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
                        "heads for kind gpt)");
    }
    return it->second;
  };
  const YAML::Node& kind = need("kind");
  const std::string k = scalar_text(kind);
  if (kind.IsScalar() && k == "gpt") {
    s.kind = ModelSpec::Kind::kGpt;
  } else if (kind.IsScalar() && k == "mlp") {
    s.kind = ModelSpec::Kind::kMlp;
  } else {
    fail_key(w, "kind", "must be gpt or mlp, got " + node_kind(kind));
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
  if (s.kind == ModelSpec::Kind::kGpt) {
    s.heads = read_int(w, "heads", need("heads"));
  } else if (values.count("heads")) {
    s.heads = read_int(w, "heads", values["heads"]);  // accepted (round trip), unused
  }
  if (values.count("mlp_ratio")) s.mlp_ratio = read_int(w, "mlp_ratio", values["mlp_ratio"]);
  if (values.count("tied_head")) s.tied_head = read_bool(w, "tied_head", values["tied_head"]);
  if (values.count("ln_eps")) s.ln_eps = read_float(w, "ln_eps", values["ln_eps"]);
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
  return k == ModelSpec::Kind::kGpt ? "gpt" : "mlp";
}

ModelSpec ModelSpec::from_yaml_string(std::string_view text, std::string_view source) {
  Where w{std::string(source), {}};
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
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
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::string names;
    for (const std::string& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw ConfigError("model spec '" + path + "': cannot open the file (" +
                      std::error_code(errno, std::generic_category()).message() +
                      "); valid: a YAML file path or a preset name (" + names + ")");
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_yaml_string(ss.str(), path);
}

namespace {

struct Preset {
  const char* name;
  ModelSpec::Kind kind;
  std::int64_t vocab, seq_len, layers, hidden, heads, mlp_ratio;
};

// GPT-2 sizes from the GPT-2 paper (Radford et al. 2019, table 2) and the released configs
// (n_ctx 1024, vocab 50257). gpt3-6.7b: Brown et al. 2020 ("Language Models are Few-Shot
// Learners"), table 2.1: 32 layers, d_model 4096, 32 heads, context 2048, GPT-2's vocabulary
// and architecture (6.66e9 parameters here with the head tied to the embedding). gpt3-13b: the
// same table's 13B row (40 layers, 40 heads of d_head 128, context 2048) with d_model
// 40 x 128 = 5120, as implementations of that size use (OPT-13B, Zhang et al. 2022, table 1;
// the table's printed 5140 is not a multiple of its 40 heads): 12.85e9 parameters here.
constexpr Preset kPresets[] = {
    {"gpt-tiny", ModelSpec::Kind::kGpt, 256, 128, 6, 256, 8, 4},
    {"gpt-micro", ModelSpec::Kind::kGpt, 64, 16, 2, 32, 4, 4},
    {"gpt2", ModelSpec::Kind::kGpt, 50257, 1024, 12, 768, 12, 4},
    {"gpt2-medium", ModelSpec::Kind::kGpt, 50257, 1024, 24, 1024, 16, 4},
    {"gpt2-large", ModelSpec::Kind::kGpt, 50257, 1024, 36, 1280, 20, 4},
    {"gpt2-xl", ModelSpec::Kind::kGpt, 50257, 1024, 48, 1600, 25, 4},
    {"gpt3-6.7b", ModelSpec::Kind::kGpt, 50257, 2048, 32, 4096, 32, 4},
    {"gpt3-13b", ModelSpec::Kind::kGpt, 50257, 2048, 40, 5120, 40, 4},
    {"mlp-tiny", ModelSpec::Kind::kMlp, 256, 128, 6, 256, 8, 4},
};

}  // namespace

ModelSpec ModelSpec::preset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    ModelSpec s;
    s.kind = p.kind;
    s.name = p.name;
    s.vocab = p.vocab;
    s.seq_len = p.seq_len;
    s.layers = p.layers;
    s.hidden = p.hidden;
    s.heads = p.heads;
    s.mlp_ratio = p.mlp_ratio;
    s.tied_head = true;
    s.validate();
    return s;
  }
  std::string names;
  for (const std::string& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError("model preset '" + std::string(name) + "': unknown; valid: " + names);
}

std::vector<std::string> ModelSpec::preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.emplace_back(p.name);
  return out;
}

ModelSpec ModelSpec::load(const std::string& name_or_path) {
  for (const Preset& p : kPresets) {
    if (name_or_path == p.name) return preset(name_or_path);
  }
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
  out << YAML::Key << "mlp_ratio" << YAML::Value << mlp_ratio;
  out << YAML::Key << "tied_head" << YAML::Value << (tied_head ? "true" : "false");
  char eps[32];
  std::snprintf(eps, sizeof eps, "%.9g", static_cast<double>(ln_eps));  // exact for a float
  out << YAML::Key << "ln_eps" << YAML::Value << eps;
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
