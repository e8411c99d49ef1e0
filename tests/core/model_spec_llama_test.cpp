// ModelSpec kind llama: the presets' published parameter counts, the Model it builds (names,
// shapes, biases, a tied head), its YAML keys, defaults, round trip and every kind of bad input.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/model_spec.h"
#include "memory/error.h"
#include "tests/core/exec_testutil.h"

namespace memfit {
namespace {

using testing::Rig;

// llama-micro's shape, written out in full (every key, a llama3 rope_scaling).
constexpr const char* kFull = R"(model:
  kind: llama
  name: full
  vocab: 64
  seq_len: 16
  layers: 2
  hidden: 32
  heads: 4
  kv_heads: 2
  head_dim: 8
  intermediate: 48
  rope_theta: 500000
  rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192}
  qkv_bias: true
  proj_bias: true
  mlp_bias: true
  tied_head: true
  ln_eps: 1e-5
  attention: flash
)";

// The smallest llama: only the required keys.
constexpr const char* kMinimal = R"(model:
  kind: llama
  vocab: 64
  seq_len: 16
  layers: 2
  hidden: 32
  heads: 4
  intermediate: 48
)";

// Parses `text`, expecting a ConfigError whose message contains every needle.
void expect_error(const std::string& text, std::initializer_list<const char*> needles) {
  try {
    ModelSpec::from_yaml_string(text, "spec.yaml");
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    for (const char* n : needles) {
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' missing from: " << msg;
    }
  }
}

// `base` with line `key: ...` replaced by `line` (or removed when line is empty).
std::string with(const std::string& base, const std::string& key, const std::string& line) {
  std::string t = base;
  const std::size_t at = t.find("  " + key + ":");
  EXPECT_NE(at, std::string::npos) << key;
  if (at == std::string::npos) return t;
  const std::size_t end = t.find('\n', at);
  t.replace(at, end - at + 1, line.empty() ? "" : "  " + line + "\n");
  return t;
}

// ---- Published parameter counts ---------------------------------------------------------------

TEST(ModelSpecLlama, PresetsHaveThePublishedParameterCounts) {
  struct Published {
    const char* preset;
    std::int64_t count;
  };
  // Each model's card / the sum over its safetensors shards.
  const Published published[] = {
      {"llama-3.2-1b", 1235814400}, {"llama-3.2-3b", 3212749824}, {"llama-3.1-8b", 8030261248},
      {"llama-2-7b", 6738415616},   {"llama-2-13b", 13015864320}, {"mistral-7b", 7241732096},
      {"qwen2.5-7b", 7615616512},   {"qwen3-0.6b", 596049920},    {"qwen3-8b", 8190735360},
  };
  for (const Published& p : published) {
    const ModelSpec s = ModelSpec::preset(p.preset);
    EXPECT_EQ(s.kind, ModelSpec::Kind::kLlama) << p.preset;
    EXPECT_EQ(s.parameter_count(), p.count) << p.preset;
  }
}

TEST(ModelSpecLlama, MicroCountByHand) {
  const ModelSpec s = ModelSpec::preset("llama-micro");
  ASSERT_EQ(s.kind, ModelSpec::Kind::kLlama);
  const std::int64_t v = 64, c = 32, l = 2, f = 48;
  const std::int64_t q = 4 * 8, k = 2 * 8;  // heads * head_dim, kv_heads * head_dim
  EXPECT_EQ(s.vocab, v);
  EXPECT_EQ(s.hidden, c);
  EXPECT_EQ(s.layers, l);
  EXPECT_EQ(s.intermediate, f);
  EXPECT_EQ(s.resolved_kv_heads(), 2);
  EXPECT_EQ(s.resolved_head_dim(), 8);
  EXPECT_FALSE(s.tied_head);
  // wte V*C + L*(2C + (q+2k)*C + C*q + 3*F*C) + C final norm + untied head V*C.
  const std::int64_t block = 2 * c + (q + 2 * k) * c + c * q + 3 * f * c;
  EXPECT_EQ(s.parameter_count(), v * c + l * block + c + v * c);
  EXPECT_EQ(s.parameter_count(), 19616);

  // Each bias adds its own: qkv (q+2k), proj C, gate_up 2F and down C; a tied head drops V*C.
  ModelSpec b = s;
  b.qkv_bias = true;
  EXPECT_EQ(b.parameter_count(), s.parameter_count() + l * (q + 2 * k));
  b.proj_bias = true;
  EXPECT_EQ(b.parameter_count(), s.parameter_count() + l * (q + 2 * k + c));
  b.mlp_bias = true;
  EXPECT_EQ(b.parameter_count(), s.parameter_count() + l * (q + 2 * k + c + 2 * f + c));
  ModelSpec t = s;
  t.tied_head = true;
  EXPECT_EQ(t.parameter_count(), s.parameter_count() - v * c);
  // No position table: seq_len does not change the count.
  ModelSpec longer = s;
  longer.seq_len = 4096;
  EXPECT_EQ(longer.parameter_count(), s.parameter_count());
}

// ---- The Model it builds ----------------------------------------------------------------------

struct Expected {
  std::string name;
  Shape shape;
};

// HuggingFace's names and memfit's packed shapes: qkv (q+2k, C), gate_up (2F, C).
std::vector<Expected> llama_names(const ModelSpec& s) {
  const std::int64_t c = s.hidden, f = s.intermediate;
  const std::int64_t q = s.heads * s.resolved_head_dim();
  const std::int64_t k = s.resolved_kv_heads() * s.resolved_head_dim();
  std::vector<Expected> e = {{"wte", {s.vocab, c}}};
  for (int i = 0; i < s.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    e.push_back({p + "input_layernorm.weight", {c}});
    e.push_back({p + "self_attn.qkv.weight", {q + 2 * k, c}});
    if (s.qkv_bias) e.push_back({p + "self_attn.qkv.bias", {q + 2 * k}});
    if (s.qk_norm) {
      e.push_back({p + "self_attn.q_norm.weight", {s.resolved_head_dim()}});
      e.push_back({p + "self_attn.k_norm.weight", {s.resolved_head_dim()}});
    }
    e.push_back({p + "self_attn.proj.weight", {c, q}});
    if (s.proj_bias) e.push_back({p + "self_attn.proj.bias", {c}});
    e.push_back({p + "post_attention_layernorm.weight", {c}});
    e.push_back({p + "mlp.gate_up.weight", {2 * f, c}});
    if (s.mlp_bias) e.push_back({p + "mlp.gate_up.bias", {2 * f}});
    e.push_back({p + "mlp.down.weight", {c, f}});
    if (s.mlp_bias) e.push_back({p + "mlp.down.bias", {c}});
  }
  e.push_back({"norm.weight", {c}});
  if (!s.tied_head) e.push_back({"head.weight", {s.vocab, c}});
  return e;
}

void expect_model(const ModelSpec& s) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  Model m(s, ctx);
  EXPECT_EQ(m.num_blocks(), s.layers);
  EXPECT_EQ(m.block(0).name(), "layers.0");
  const std::vector<Expected> want = llama_names(s);
  const std::vector<Parameter*> got = m.parameters();
  ASSERT_EQ(got.size(), want.size()) << s.to_yaml();
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i]->name, want[i].name) << i;
    EXPECT_EQ(got[i]->shape, want[i].shape) << want[i].name;
    sum += got[i]->numel();
  }
  EXPECT_EQ(m.parameter_count(), s.parameter_count()) << s.to_yaml();
  EXPECT_EQ(sum, s.parameter_count());
}

TEST(ModelSpecLlama, ModelNamesShapesAndCount) {
  const ModelSpec s = ModelSpec::preset("llama-micro");
  expect_model(s);
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  Model m(s, ctx);
  // 1 + 2 blocks * 6 + norm + head.
  EXPECT_EQ(m.parameters().size(), 15u);
  // Grouped-query: 4 query heads over 2 kv heads of 8 -> (32 + 2*16, 32).
  EXPECT_EQ(m.parameters()[2]->name, "layers.0.self_attn.qkv.weight");
  EXPECT_EQ(m.parameters()[2]->shape, (Shape{64, 32}));
  EXPECT_EQ(m.parameters().back()->name, "head.weight");
  EXPECT_FALSE(m.head().tied());
}

TEST(ModelSpecLlama, ModelBiasesAppearAndCountsAgree) {
  ModelSpec s = ModelSpec::preset("llama-micro");
  s.qkv_bias = true;
  expect_model(s);
  s.proj_bias = true;
  expect_model(s);
  s.mlp_bias = true;
  expect_model(s);
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  Model m(s, ctx);
  EXPECT_EQ(m.parameters().size(), 15u + 2 * 4);
  std::vector<std::string> biases;
  for (Parameter* p : m.parameters()) {
    if (p->name.size() > 5 && p->name.substr(p->name.size() - 5) == ".bias") {
      biases.push_back(p->name);
    }
  }
  EXPECT_EQ(biases,
            (std::vector<std::string>{"layers.0.self_attn.qkv.bias", "layers.0.self_attn.proj.bias",
                                      "layers.0.mlp.gate_up.bias", "layers.0.mlp.down.bias",
                                      "layers.1.self_attn.qkv.bias", "layers.1.self_attn.proj.bias",
                                      "layers.1.mlp.gate_up.bias", "layers.1.mlp.down.bias"}));
}

TEST(ModelSpecLlama, QkNormsAppearAndCountsAgree) {
  ModelSpec s = ModelSpec::preset("llama-micro");
  s.qk_norm = true;
  expect_model(s);
  EXPECT_EQ(s.parameter_count(), ModelSpec::preset("llama-micro").parameter_count() + 2 * 2 * 8);
  // YAML: the key round-trips, and is refused with materialized attention.
  const ModelSpec back = ModelSpec::from_yaml_string(s.to_yaml());
  EXPECT_TRUE(back.qk_norm);
  EXPECT_FALSE(ModelSpec::from_yaml_string(ModelSpec::preset("llama-micro").to_yaml()).qk_norm);
  expect_error(std::string(kMinimal) + "  qk_norm: true\n  attention: materialized\n",
               {"model.qk_norm", "materialized"});
  expect_error(std::string(kMinimal) + "  qk_norm: 3\n", {"model.qk_norm"});
}

TEST(ModelSpecLlama, TiedModelHasNoHeadWeight) {
  ModelSpec s = ModelSpec::preset("llama-micro");
  s.tied_head = true;
  expect_model(s);
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  Model m(s, ctx);
  EXPECT_TRUE(m.head().tied());
  for (Parameter* p : m.parameters()) EXPECT_NE(p->name, "head.weight");
  EXPECT_EQ(m.parameters().back()->name, "norm.weight");
  EXPECT_EQ(m.parameter_count(), ModelSpec::preset("llama-micro").parameter_count() - 64 * 32);
}

TEST(ModelSpecLlama, ModelWithExplicitHeadDimNotDividingHidden) {
  // head_dim given: heads need not divide hidden (q = 3 * 16 = 48 rows against C = 40).
  ModelSpec s = ModelSpec::preset("llama-micro");
  s.hidden = 40;
  s.heads = 3;
  s.kv_heads = 1;
  s.head_dim = 16;
  expect_model(s);
}

// ---- YAML -------------------------------------------------------------------------------------

TEST(ModelSpecLlama, ParsesEveryKey) {
  const ModelSpec s = ModelSpec::from_yaml_string(kFull, "full.yaml");
  EXPECT_EQ(s.kind, ModelSpec::Kind::kLlama);
  EXPECT_EQ(s.name, "full");
  EXPECT_EQ(s.vocab, 64);
  EXPECT_EQ(s.seq_len, 16);
  EXPECT_EQ(s.layers, 2);
  EXPECT_EQ(s.hidden, 32);
  EXPECT_EQ(s.heads, 4);
  EXPECT_EQ(s.kv_heads, 2);
  EXPECT_EQ(s.head_dim, 8);
  EXPECT_EQ(s.intermediate, 48);
  EXPECT_EQ(s.rope_theta, 500000.0f);
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_EQ(s.rope_scaling.factor, 8.0f);
  EXPECT_EQ(s.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(s.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(s.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(s.qkv_bias);
  EXPECT_TRUE(s.proj_bias);
  EXPECT_TRUE(s.mlp_bias);
  EXPECT_TRUE(s.tied_head);
  EXPECT_EQ(s.ln_eps, 1e-5f);
  EXPECT_EQ(s.attention, AttentionImpl::kFlash);

  // Non-default llama3 factors are read, not replaced by RopeScaling's defaults.
  const ModelSpec r = ModelSpec::from_yaml_string(
      with(kMinimal, "intermediate",
           "intermediate: 48\n  rope_scaling: {type: llama3, factor: 32, low_freq_factor: 2, "
           "high_freq_factor: 8, original_max_position_embeddings: 4096}"));
  EXPECT_EQ(r.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_EQ(r.rope_scaling.factor, 32.0f);
  EXPECT_EQ(r.rope_scaling.low_freq_factor, 2.0f);
  EXPECT_EQ(r.rope_scaling.high_freq_factor, 8.0f);
  EXPECT_EQ(r.rope_scaling.original_max_position_embeddings, 4096);
  // type none (or rope_type, HuggingFace's newer name) is no scaling.
  const ModelSpec n = ModelSpec::from_yaml_string(
      with(kMinimal, "intermediate", "intermediate: 48\n  rope_scaling: {rope_type: none}"));
  EXPECT_EQ(n.rope_scaling.kind, RopeScaling::Kind::kNone);
}

TEST(ModelSpecLlama, Defaults) {
  const ModelSpec s = ModelSpec::from_yaml_string(kMinimal);
  EXPECT_EQ(s.kind, ModelSpec::Kind::kLlama);
  EXPECT_FALSE(s.tied_head);            // LlamaConfig.tie_word_embeddings
  EXPECT_EQ(s.ln_eps, 1e-6f);           // LlamaConfig.rms_norm_eps
  EXPECT_EQ(s.resolved_kv_heads(), 4);  // heads
  EXPECT_EQ(s.resolved_head_dim(), 8);  // hidden / heads
  EXPECT_EQ(s.rope_theta, 10000.0f);
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_FALSE(s.qkv_bias);
  EXPECT_FALSE(s.proj_bias);
  EXPECT_FALSE(s.mlp_bias);
  EXPECT_EQ(s.attention, AttentionImpl::kFlash);
  // Multi-head with the default head size: 2 * (2C + 3C*C + C*C + 3FC) + C + 2VC.
  const std::int64_t c = 32;
  EXPECT_EQ(s.parameter_count(), 2 * (2 * c + 4 * c * c + 3 * 48 * c) + c + 2 * 64 * c);
  // materialized is allowed when kv_heads = heads.
  EXPECT_EQ(
      ModelSpec::from_yaml_string(std::string(kMinimal) + "  attention: materialized\n").attention,
      AttentionImpl::kMaterialized);
}

TEST(ModelSpecLlama, YamlRoundTrip) {
  for (const char* text : {kFull, kMinimal}) {
    const ModelSpec s = ModelSpec::from_yaml_string(text);
    const std::string y = s.to_yaml();
    const ModelSpec back = ModelSpec::from_yaml_string(y, "to_yaml");
    EXPECT_EQ(back.to_yaml(), y);
    EXPECT_EQ(back.kind, ModelSpec::Kind::kLlama);
    EXPECT_EQ(back.parameter_count(), s.parameter_count());
    EXPECT_EQ(back.tied_head, s.tied_head);
    EXPECT_EQ(back.ln_eps, s.ln_eps);
    EXPECT_EQ(back.rope_theta, s.rope_theta);
    EXPECT_EQ(back.rope_scaling.kind, s.rope_scaling.kind);
    EXPECT_EQ(back.qkv_bias, s.qkv_bias);
    EXPECT_EQ(back.proj_bias, s.proj_bias);
    EXPECT_EQ(back.mlp_bias, s.mlp_bias);
  }
  // A theta and factors that need all 9 digits survive.
  ModelSpec odd = ModelSpec::preset("llama-micro");
  odd.rope_theta = 123456.789f;
  odd.rope_scaling.kind = RopeScaling::Kind::kLlama3;
  odd.rope_scaling.factor = 3.3333333f;
  odd.rope_scaling.low_freq_factor = 1.1f;
  odd.rope_scaling.high_freq_factor = 4.7f;
  odd.rope_scaling.original_max_position_embeddings = 1234;
  odd.attention = AttentionImpl::kFlash;
  const ModelSpec back = ModelSpec::from_yaml_string(odd.to_yaml());
  EXPECT_EQ(back.rope_theta, odd.rope_theta);
  EXPECT_EQ(back.rope_scaling.factor, odd.rope_scaling.factor);
  EXPECT_EQ(back.rope_scaling.low_freq_factor, odd.rope_scaling.low_freq_factor);
  EXPECT_EQ(back.rope_scaling.high_freq_factor, odd.rope_scaling.high_freq_factor);
  EXPECT_EQ(back.rope_scaling.original_max_position_embeddings, 1234);
  EXPECT_EQ(back.to_yaml(), odd.to_yaml());
}

TEST(ModelSpecLlama, EveryPresetRoundTrips) {
  int llamas = 0;
  for (const std::string& name : ModelSpec::preset_names()) {
    const ModelSpec s = ModelSpec::preset(name);
    const std::string y = s.to_yaml();
    const ModelSpec back = ModelSpec::from_yaml_string(y, name);
    EXPECT_EQ(back.to_yaml(), y) << name;
    EXPECT_EQ(back.name, name);
    EXPECT_EQ(back.kind, s.kind) << name;
    EXPECT_EQ(back.parameter_count(), s.parameter_count()) << name;
    if (s.kind == ModelSpec::Kind::kLlama) {
      ++llamas;
      EXPECT_EQ(back.resolved_kv_heads(), s.resolved_kv_heads()) << name;
      EXPECT_EQ(back.resolved_head_dim(), s.resolved_head_dim()) << name;
      EXPECT_EQ(back.rope_theta, s.rope_theta) << name;
      EXPECT_EQ(back.rope_scaling.kind, s.rope_scaling.kind) << name;
      EXPECT_EQ(back.rope_scaling.factor, s.rope_scaling.factor) << name;
      EXPECT_EQ(back.ln_eps, s.ln_eps) << name;
      EXPECT_EQ(back.tied_head, s.tied_head) << name;
      EXPECT_EQ(back.qkv_bias, s.qkv_bias) << name;
      EXPECT_EQ(back.qk_norm, s.qk_norm) << name;
    }
  }
  EXPECT_EQ(llamas, 10);  // llama-micro and the nine published models
}

TEST(ModelSpecLlama, Errors) {
  expect_error(with(kMinimal, "intermediate", ""),
               {"spec.yaml:", "model.intermediate: missing", "intermediate for llama"});
  expect_error(with(kMinimal, "intermediate", "intermediate: 0"),
               {"model.intermediate", ">= 1", "got 0"});
  expect_error(std::string(kMinimal) + "  kv_heads: 3\n",
               {"spec.yaml:9:", "model.kv_heads", "3 does not divide heads 4", "divisor"});
  expect_error(std::string(kMinimal) + "  kv_heads: 8\n",
               {"model.kv_heads", "8 does not divide heads 4"});
  expect_error(std::string(kMinimal) + "  head_dim: 7\n",
               {"model.head_dim", "head size of 7", "even"});
  expect_error(std::string(kMinimal) + "  head_dim: 258\n",
               {"model.head_dim", "head size of 258", "at most 256"});
  // 256 itself is the limit, allowed.
  EXPECT_EQ(
      ModelSpec::from_yaml_string(std::string(kMinimal) + "  head_dim: 256\n").resolved_head_dim(),
      256);
  // hidden / heads odd with no head_dim: the message says it came from heads.
  expect_error(with(kMinimal, "heads", "heads: 32"), {"model.heads", "head size of 1", "even"});
  expect_error(with(kMinimal, "heads", "heads: 5"),
               {"model.heads", "5 does not divide hidden 32", "explicit head_dim"});
  EXPECT_EQ(
      ModelSpec::from_yaml_string(with(kMinimal, "heads", "heads: 5") + "  head_dim: 8\n").heads,
      5);
  expect_error(std::string(kMinimal) + "  kv_heads: 2\n  attention: materialized\n",
               {"model.attention", "multi-head only", "kv_heads 2 < heads 4", "flash"});
  expect_error(std::string(kMinimal) + "  rope_theta: 1\n",
               {"spec.yaml:9:", "model.rope_theta", "> 1", "got 1"});
  expect_error(std::string(kMinimal) + "  rope_theta: 0.5\n", {"model.rope_theta", "> 1"});
  expect_error(std::string(kMinimal) + "  rope_theta: -10000\n", {"model.rope_theta", "> 1"});
  expect_error(std::string(kMinimal) + "  rope_theta: big\n", {"model.rope_theta", "number"});
  expect_error(std::string(kMinimal) + "  rope_scaling: {type: yarn, factor: 4}\n",
               {"model.rope_scaling", "yarn", "llama3", "not supported"});
  expect_error(std::string(kMinimal) + "  rope_scaling: {factor: 8}\n",
               {"model.rope_scaling", "type", "missing", "llama3"});
  expect_error(std::string(kMinimal) + "  rope_scaling: {type: llama3, beta: 2}\n",
               {"model.rope_scaling", "unknown key 'beta'"});
  expect_error(std::string(kMinimal) + "  rope_scaling: llama3\n",
               {"model.rope_scaling", "must be a map"});
  // llama3 parameters out of range are rope_frequencies' to judge, reported on the key.
  expect_error(std::string(kMinimal) +
                   "  rope_scaling: {type: llama3, low_freq_factor: 4, high_freq_factor: 1}\n",
               {"model.rope_scaling"});
  expect_error(std::string(kMinimal) + "  rope_scaling: {type: llama3, factor: 0}\n",
               {"model.rope_scaling"});
  expect_error(std::string(kMinimal) + "  qkv_bias: maybe\n", {"model.qkv_bias", "true or false"});
  // A llama-only key under another kind is named.
  const std::string gpt =
      "model:\n  kind: gpt\n  vocab: 64\n  seq_len: 16\n  layers: 2\n"
      "  hidden: 32\n  heads: 4\n";
  EXPECT_NO_THROW(ModelSpec::from_yaml_string(gpt));
  expect_error(gpt + "  kv_heads: 2\n", {"model.kv_heads", "kind llama key", "kind gpt"});
  expect_error(gpt + "  intermediate: 48\n", {"model.intermediate", "kind llama key"});
  expect_error(gpt + "  rope_scaling: {type: none}\n", {"model.rope_scaling", "kind llama key"});
  std::string mlp = gpt;
  mlp.replace(mlp.find("kind: gpt"), 9, "kind: mlp");
  expect_error(mlp + "  qkv_bias: true\n", {"model.qkv_bias", "kind llama key", "kind mlp"});
}

// The header's rule: sizes < 1 are errors; kv_heads and head_dim default only when absent (the
// struct's 0 means "absent", an explicit 0 in the YAML is a mistake to name, as
// from_hf_config_* does for num_key_value_heads: 0).
TEST(ModelSpecLlama, ExplicitZeroKvHeadsOrHeadDimIsAnError) {
  expect_error(std::string(kMinimal) + "  kv_heads: 0\n",
               {"spec.yaml:9:", "model.kv_heads", ">= 1"});
  expect_error(std::string(kMinimal) + "  head_dim: 0\n",
               {"spec.yaml:9:", "model.head_dim", ">= 1"});
}

TEST(ModelSpecLlama, ValidateNamesTheKeyOfAHandBuiltSpec) {
  ModelSpec s = ModelSpec::preset("llama-micro");
  s.kv_heads = 3;
  try {
    s.validate();
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("<spec>: model.kv_heads"), std::string::npos) << e.what();
  }
  s = ModelSpec::preset("llama-micro");
  s.rope_theta = 1.0f;
  EXPECT_THROW(s.parameter_count(), ConfigError);
  s = ModelSpec::preset("llama-micro");
  s.intermediate = 0;
  EXPECT_THROW(s.validate(), ConfigError);
}

}  // namespace
}  // namespace memfit
