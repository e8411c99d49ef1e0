// ModelSpec::from_hf_config_*: real HuggingFace config.json files (Llama 3.1, Llama 2, Mistral,
// Qwen2.5, Qwen3) give the presets' shapes and counts; notes; every kind of bad input, and files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "memory/error.h"

namespace memfit {
namespace {

std::string source_dir() {
  if (const char* d = std::getenv("MEMFIT_SOURCE_DIR")) return d;
  return MEMFIT_TEST_SOURCE_DIR;
}

// meta-llama/Llama-3.1-8B's config.json as published.
constexpr const char* kLlama31_8B = R"({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}
)";

// mistralai/Mistral-7B-v0.1's config.json.
constexpr const char* kMistral7B = R"({
  "architectures": [
    "MistralForCausalLM"
  ],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
)";

// Qwen/Qwen2.5-7B's config.json: no attention_bias key (Qwen2's q/k/v always have biases).
constexpr const char* kQwen25_7B = R"({
  "architectures": [
    "Qwen2ForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 3584,
  "initializer_range": 0.02,
  "intermediate_size": 18944,
  "max_position_embeddings": 131072,
  "max_window_layers": 28,
  "model_type": "qwen2",
  "num_attention_heads": 28,
  "num_hidden_layers": 28,
  "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 152064
}
)";

// Qwen/Qwen3-8B's config.json as published: q/k norms (implied by model_type), head_dim 128,
// sliding_window null.
constexpr const char* kQwen3_8B = R"({
  "architectures": [
    "Qwen3ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 36,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}
)";

// meta-llama/Llama-2-13b-hf's config.json: rope_scaling null, no head_dim, no rope_theta.
constexpr const char* kLlama2_13B = R"({
  "_name_or_path": "meta-llama/Llama-2-13b-hf",
  "architectures": [
    "LlamaForCausalLM"
  ],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 5120,
  "initializer_range": 0.02,
  "intermediate_size": 13824,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 40,
  "num_hidden_layers": 40,
  "num_key_value_heads": 40,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.32.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
)";

// A small valid config, one key per line, for the error cases.
constexpr const char* kSmall = R"({
  "model_type": "llama",
  "architectures": ["LlamaForCausalLM"],
  "vocab_size": 64,
  "hidden_size": 32,
  "intermediate_size": 48,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "max_position_embeddings": 16,
  "hidden_act": "silu"
}
)";

// `base` with the line holding "key": replaced by `line` (or removed when empty). The lines
// of kSmall end in commas except the last, so a replacement keeps its own.
std::string with(const std::string& base, const std::string& key, const std::string& line) {
  std::string t = base;
  const std::size_t at = t.find("\"" + key + "\":");
  EXPECT_NE(at, std::string::npos) << key;
  if (at == std::string::npos) return t;
  const std::size_t begin = t.rfind('\n', at) + 1;
  const std::size_t end = t.find('\n', at);
  t.replace(begin, end - begin + 1, line.empty() ? "" : "  " + line + "\n");
  return t;
}

// Parses `text`, expecting a ConfigError whose message contains every needle.
void expect_error(const std::string& text, std::initializer_list<const char*> needles) {
  try {
    ModelSpec::from_hf_config_string(text, "config.json");
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    for (const char* n : needles) {
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' missing from: " << msg;
    }
  }
}

// The note (of those `notes` holds) containing `needle`; empty when none.
std::string note_with(const std::vector<std::string>& notes, const std::string& needle) {
  for (const std::string& n : notes) {
    if (n.find(needle) != std::string::npos) return n;
  }
  return "";
}

// to_yaml without its name line, for comparing shapes of differently named specs.
std::string yaml_without_name(ModelSpec s) {
  s.name = "x";
  return s.to_yaml();
}

// A fresh directory under the test temp dir, removed with its files at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = ::testing::TempDir() + "memfit_hf_config_XXXXXX";
    char* d = mkdtemp(tmpl.data());
    EXPECT_NE(d, nullptr) << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    for (const std::string& f : files_) std::remove(f.c_str());
    for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) rmdir(it->c_str());
    rmdir(path_.c_str());
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // Writes `text` to `rel` (one optional directory level) and returns its path.
  std::string write(const std::string& rel, const std::string& text) {
    const std::size_t slash = rel.find('/');
    if (slash != std::string::npos) {
      const std::string dir = path_ + "/" + rel.substr(0, slash);
      mkdir(dir.c_str(), 0700);
      dirs_.push_back(dir);
    }
    const std::string p = path_ + "/" + rel;
    std::ofstream(p, std::ios::binary) << text;
    files_.push_back(p);
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
  std::vector<std::string> dirs_;
};

// ---- Real configs -----------------------------------------------------------------------------

TEST(HfConfig, Llama31_8BIsThePreset) {
  std::vector<std::string> notes;
  const ModelSpec s = ModelSpec::from_hf_config_string(kLlama31_8B, "Llama-3.1-8B.json", &notes);
  const ModelSpec p = ModelSpec::preset("llama-3.1-8b");
  EXPECT_EQ(s.kind, ModelSpec::Kind::kLlama);
  EXPECT_EQ(s.parameter_count(), p.parameter_count());
  EXPECT_EQ(s.parameter_count(), 8030261248);
  EXPECT_EQ(yaml_without_name(s), yaml_without_name(p));
  EXPECT_EQ(s.name, "Llama-3.1-8B");  // the file's stem: the config has no _name_or_path
  EXPECT_EQ(s.seq_len, 131072);
  EXPECT_EQ(s.vocab, 128256);
  EXPECT_EQ(s.resolved_kv_heads(), 8);
  EXPECT_EQ(s.resolved_head_dim(), 128);
  EXPECT_EQ(s.rope_theta, 500000.0f);
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_EQ(s.rope_scaling.factor, 8.0f);
  EXPECT_EQ(s.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(s.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(s.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(s.ln_eps, 1e-5f);
  EXPECT_FALSE(s.tied_head);
  EXPECT_FALSE(s.qkv_bias);
  EXPECT_FALSE(s.proj_bias);
  EXPECT_FALSE(s.mlp_bias);
  // No sliding window: no note about seq_len.
  EXPECT_EQ(note_with(notes, "sliding_window"), "");
}

TEST(HfConfig, Llama31NotesNameTheUnusedKeysAndTheDtype) {
  std::vector<std::string> notes;
  ModelSpec::from_hf_config_string(kLlama31_8B, "Llama-3.1-8B.json", &notes);
  const std::string unused = note_with(notes, "ignored");
  ASSERT_NE(unused, "") << notes.size();
  // Every unused key in one note, and none of the keys memfit reads.
  for (const char* k : {"attention_dropout", "bos_token_id", "eos_token_id", "initializer_range",
                        "pretraining_tp", "transformers_version", "use_cache"}) {
    EXPECT_NE(unused.find(k), std::string::npos) << k << " not in: " << unused;
  }
  for (const char* k : {"vocab_size", "hidden_size", "rope_scaling", "rms_norm_eps", "torch_dtype",
                        "model_type", "num_key_value_heads"}) {
    EXPECT_EQ(unused.find(k), std::string::npos) << k << " in: " << unused;
  }
  int with_bos = 0;
  for (const std::string& n : notes) with_bos += n.find("bos_token_id") != std::string::npos;
  EXPECT_EQ(with_bos, 1);
  EXPECT_EQ(unused.rfind("Llama-3.1-8B.json", 0), 0u) << unused;  // each note names its source
  const std::string dtype = note_with(notes, "dtype");
  EXPECT_NE(dtype.find("bfloat16"), std::string::npos) << dtype;
  // Without a notes vector nothing is said, and the spec is the same.
  EXPECT_EQ(ModelSpec::from_hf_config_string(kLlama31_8B, "Llama-3.1-8B.json").to_yaml(),
            ModelSpec::from_hf_config_string(kLlama31_8B, "Llama-3.1-8B.json", &notes).to_yaml());
}

TEST(HfConfig, Mistral7BSlidingWindowCapsSeqLen) {
  std::vector<std::string> notes;
  const ModelSpec s = ModelSpec::from_hf_config_string(kMistral7B, "Mistral-7B-v0.1.json", &notes);
  EXPECT_EQ(s.seq_len, 4096);
  EXPECT_EQ(s.parameter_count(), 7241732096);
  EXPECT_EQ(s.parameter_count(), ModelSpec::preset("mistral-7b").parameter_count());
  EXPECT_EQ(yaml_without_name(s), yaml_without_name(ModelSpec::preset("mistral-7b")));
  const std::string n = note_with(notes, "sliding_window");
  EXPECT_NE(n.find("4096"), std::string::npos) << n;
  EXPECT_NE(n.find("32768"), std::string::npos) << n;
  EXPECT_NE(n.find("seq_len is 4096"), std::string::npos) << n;
  EXPECT_NE(note_with(notes, "dtype").find("bfloat16"), std::string::npos);
  // A window at least the context changes nothing; a null window (Mistral v0.2) neither.
  const std::string wide = with(kMistral7B, "sliding_window", "\"sliding_window\": 32768,");
  std::vector<std::string> wide_notes;
  EXPECT_EQ(ModelSpec::from_hf_config_string(wide, "w.json", &wide_notes).seq_len, 32768);
  EXPECT_EQ(note_with(wide_notes, "sliding_window"), "");
  const std::string none = with(kMistral7B, "sliding_window", "\"sliding_window\": null,");
  EXPECT_EQ(ModelSpec::from_hf_config_string(none, "n.json").seq_len, 32768);
}

TEST(HfConfig, Qwen25_7BHasQkvBiasesAndNoWindow) {
  std::vector<std::string> notes;
  const ModelSpec s = ModelSpec::from_hf_config_string(kQwen25_7B, "Qwen2.5-7B.json", &notes);
  EXPECT_TRUE(s.qkv_bias);
  EXPECT_FALSE(s.proj_bias);
  EXPECT_FALSE(s.mlp_bias);
  EXPECT_EQ(s.seq_len, 131072);  // use_sliding_window false: the window is not used
  EXPECT_EQ(s.ln_eps, 1e-6f);
  EXPECT_EQ(s.rope_theta, 1000000.0f);
  EXPECT_EQ(s.parameter_count(), 7615616512);
  EXPECT_EQ(yaml_without_name(s), yaml_without_name(ModelSpec::preset("qwen2.5-7b")));
  EXPECT_EQ(note_with(notes, "sliding_window "), "");
  const std::string unused = note_with(notes, "ignored");
  EXPECT_NE(unused.find("use_mrope"), std::string::npos) << unused;
  EXPECT_EQ(unused.find("max_window_layers"), std::string::npos) << unused;  // read
  // With use_sliding_window true the window applies to layers >= max_window_layers: none of
  // the 28 here, so full attention (said in a note); from layer 20 on, it caps seq_len as
  // Mistral's does.
  const std::string windowed =
      with(with(kQwen25_7B, "use_sliding_window", "\"use_sliding_window\": true,"),
           "sliding_window", "\"sliding_window\": 32768,");
  notes.clear();
  EXPECT_EQ(ModelSpec::from_hf_config_string(windowed, "q.json", &notes).seq_len, 131072);
  EXPECT_NE(note_with(notes, "no layer slides"), "");
  const std::string from20 = with(windowed, "max_window_layers", "\"max_window_layers\": 20,");
  EXPECT_EQ(ModelSpec::from_hf_config_string(from20, "q.json").seq_len, 32768);
}

TEST(HfConfig, Qwen3_8BHasQkNormsAndIsThePreset) {
  std::vector<std::string> notes;
  const ModelSpec s = ModelSpec::from_hf_config_string(kQwen3_8B, "Qwen3-8B.json", &notes);
  EXPECT_TRUE(s.qk_norm);
  EXPECT_FALSE(s.qkv_bias);
  EXPECT_FALSE(s.proj_bias);
  EXPECT_FALSE(s.tied_head);
  EXPECT_EQ(s.seq_len, 40960);
  EXPECT_EQ(s.resolved_head_dim(), 128);
  EXPECT_EQ(s.resolved_kv_heads(), 8);
  EXPECT_EQ(s.rope_theta, 1000000.0f);
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_EQ(s.parameter_count(), 8190735360);  // the model card's 8.2B
  EXPECT_EQ(yaml_without_name(s), yaml_without_name(ModelSpec::preset("qwen3-8b")));
  EXPECT_NE(s.to_yaml().find("qk_norm: true"), std::string::npos) << s.to_yaml();
  const std::string unused = note_with(notes, "ignored");
  EXPECT_NE(unused.find("transformers_version"), std::string::npos) << unused;
  // Qwen3Config's defaults: head_dim 128 (not hidden / heads), 32 kv heads.
  const std::string bare = with(with(kQwen3_8B, "head_dim", ""), "num_key_value_heads", "");
  const ModelSpec d = ModelSpec::from_hf_config_string(bare, "q.json");
  EXPECT_EQ(d.resolved_head_dim(), 128);
  EXPECT_EQ(d.resolved_kv_heads(), 32);
  // attention_bias covers q, k, v and o, as in Llama.
  const ModelSpec b = ModelSpec::from_hf_config_string(
      with(kQwen3_8B, "attention_bias", "\"attention_bias\": true,"), "q.json");
  EXPECT_TRUE(b.qkv_bias && b.proj_bias && b.qk_norm);
  // use_sliding_window: Qwen3-8B's max_window_layers (36) leaves every layer full; layer_types
  // naming a sliding layer, or max_window_layers 0, caps seq_len at the window, 4096 when the
  // key is absent (Qwen3Config's default); a null window is none.
  const std::string windowed =
      with(kQwen3_8B, "use_sliding_window", "\"use_sliding_window\": true,");
  EXPECT_EQ(ModelSpec::from_hf_config_string(windowed, "q.json").seq_len, 40960);
  const std::string typed =
      with(with(windowed, "max_window_layers",
                "\"layer_types\": [\"full_attention\", \"sliding_attention\"],"),
           "sliding_window", "\"sliding_window\": 8192,");
  EXPECT_EQ(ModelSpec::from_hf_config_string(typed, "q.json").seq_len, 8192);
  const std::string all_slide = with(windowed, "max_window_layers", "\"max_window_layers\": 0,");
  EXPECT_EQ(ModelSpec::from_hf_config_string(all_slide, "q.json").seq_len, 40960);  // null
  EXPECT_EQ(
      ModelSpec::from_hf_config_string(with(all_slide, "sliding_window", ""), "q.json").seq_len,
      4096);
  expect_error(with(windowed, "max_window_layers", "\"max_window_layers\": -1,"),
               {"max_window_layers", "integer >= 0"});
  expect_error(with(with(kSmall, "model_type", "\"model_type\": \"qwen3\","), "architectures",
                    "\"architectures\": [\"Qwen2ForCausalLM\"],"),
               {"architectures", "Qwen3ForCausalLM"});
}

TEST(HfConfig, Llama2_13BNullRopeScalingNoHeadDim) {
  std::vector<std::string> notes;
  const ModelSpec s = ModelSpec::from_hf_config_string(kLlama2_13B, "config.json", &notes);
  EXPECT_EQ(s.parameter_count(), 13015864320);
  EXPECT_EQ(s.name, "Llama-2-13b-hf");  // _name_or_path's last component
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_EQ(s.rope_theta, 10000.0f);  // LlamaConfig's default
  EXPECT_EQ(s.resolved_head_dim(), 128);
  EXPECT_EQ(s.seq_len, 4096);
  EXPECT_EQ(yaml_without_name(s), yaml_without_name(ModelSpec::preset("llama-2-13b")));
  EXPECT_NE(note_with(notes, "dtype").find("float16"), std::string::npos);
  // num_key_value_heads absent: multi-head, the same model.
  const ModelSpec mha =
      ModelSpec::from_hf_config_string(with(kLlama2_13B, "num_key_value_heads", ""), "config.json");
  EXPECT_EQ(mha.resolved_kv_heads(), 40);
  EXPECT_EQ(mha.parameter_count(), 13015864320);
}

TEST(HfConfig, DefaultsAndOptionalKeys) {
  const ModelSpec s = ModelSpec::from_hf_config_string(kSmall, "dir/small.json");
  EXPECT_EQ(s.name, "small");
  EXPECT_FALSE(s.tied_head);
  EXPECT_EQ(s.ln_eps, 1e-6f);
  EXPECT_EQ(s.rope_theta, 10000.0f);
  EXPECT_EQ(s.resolved_head_dim(), 8);
  EXPECT_EQ(s.resolved_kv_heads(), 2);
  // attention_bias covers all four of Llama's projections; tie_word_embeddings, mlp_bias,
  // head_dim, rms_norm_eps and the older rope_scaling "type" name are read.
  const std::string more = with(kSmall, "hidden_act",
                                "\"hidden_act\": \"silu\", \"attention_bias\": true, "
                                "\"mlp_bias\": true, \"tie_word_embeddings\": true, "
                                "\"head_dim\": 16, \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000,"
                                " \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 32.0, "
                                "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                                "\"original_max_position_embeddings\": 8192}");
  const ModelSpec m = ModelSpec::from_hf_config_string(more, "more.json");
  EXPECT_TRUE(m.qkv_bias);
  EXPECT_TRUE(m.proj_bias);
  EXPECT_TRUE(m.mlp_bias);
  EXPECT_TRUE(m.tied_head);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_EQ(m.ln_eps, 1e-5f);
  EXPECT_EQ(m.rope_theta, 500000.0f);
  EXPECT_EQ(m.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_EQ(m.rope_scaling.factor, 32.0f);
  // 2 blocks of q = 64, k = 32: 2 * (2C + (128 C + 128) + (C*64 + C) + (3FC + 2F + C)) + C.
  const std::int64_t c = 32, f = 48;
  EXPECT_EQ(m.parameter_count(),
            64 * c + 2 * (2 * c + 128 * c + 128 + c * 64 + c + 3 * f * c + 2 * f + c) + c);
  // rope_type "default" is no scaling; dtype (the newer name) is named like torch_dtype.
  std::vector<std::string> notes;
  const ModelSpec d = ModelSpec::from_hf_config_string(
      with(kSmall, "hidden_act",
           "\"hidden_act\": \"silu\", \"rope_scaling\": {\"rope_type\": \"default\"}, "
           "\"dtype\": \"float32\""),
      "d.json", &notes);
  EXPECT_EQ(d.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_NE(note_with(notes, "dtype").find("float32"), std::string::npos);
  EXPECT_EQ(note_with(notes, "ignored"), "");  // every key read
}

// ---- Errors -----------------------------------------------------------------------------------

TEST(HfConfig, MalformedJsonAndNotAnObject) {
  // Line 3's value is missing: the error points at line 3.
  expect_error("{\n  \"model_type\": \"llama\",\n  \"vocab_size\": ,\n}\n",
               {"config.json:3:", "not valid JSON"});
  expect_error("{\"model_type\": \"llama\"", {"config.json:1:", "not valid JSON"});
  expect_error("", {"config.json:", "not valid JSON"});
  expect_error("[1, 2]", {"config.json", "one JSON object", "a list"});
  expect_error("\"llama\"", {"config.json", "one JSON object", "\"llama\""});
}

TEST(HfConfig, UnsupportedModelTypes) {
  expect_error(with(kSmall, "model_type", ""),
               {"config.json", "model_type", "missing", "llama, mistral, qwen2"});
  expect_error(with(kSmall, "model_type", "\"model_type\": \"mixtral\","),
               {"model_type", "\"mixtral\"", "mixture of experts", "llama, mistral, qwen2"});
  expect_error(with(kSmall, "model_type", "\"model_type\": \"gemma\","),
               {"model_type", "\"gemma\"", "not supported", "llama, mistral, qwen2"});
  expect_error(
      with(kSmall, "model_type", "\"model_type\": \"qwen3_moe\","),
      {"model_type", "\"qwen3_moe\"", "mixture of experts", "llama, mistral, qwen2, qwen3"});
  expect_error(with(kSmall, "model_type", "\"model_type\": 7,"), {"model_type", "string"});
  // architectures must name model_type's causal LM.
  expect_error(
      with(kSmall, "architectures", "\"architectures\": [\"LlamaForSequenceClassification\"],"),
      {"architectures", "LlamaForSequenceClassification", "LlamaForCausalLM"});
  expect_error(with(kSmall, "architectures", "\"architectures\": [\"MistralForCausalLM\"],"),
               {"architectures", "LlamaForCausalLM", "\"llama\""});
  expect_error(with(kSmall, "architectures", "\"architectures\": \"LlamaForCausalLM\","),
               {"architectures", "list"});
  EXPECT_NO_THROW(ModelSpec::from_hf_config_string(with(kSmall, "architectures", ""), "a.json"));
  expect_error(with(kSmall, "hidden_act", "\"hidden_act\": \"gelu\""),
               {"hidden_act", "\"gelu\"", "silu"});
}

TEST(HfConfig, MissingAndBadSizes) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "max_position_embeddings"}) {
    SCOPED_TRACE(key);
    expect_error(with(kSmall, key, ""), {"config.json", key, "missing", "integer >= 1"});
    const std::string k = std::string("\"") + key + "\": ";
    expect_error(with(kSmall, key, k + "\"64\","), {key, "integer", "\"64\""});
    expect_error(with(kSmall, key, k + "-4,"), {key, ">= 1", "-4"});
    expect_error(with(kSmall, key, k + "0,"), {key, ">= 1", "got 0"});
    expect_error(with(kSmall, key, k + "64.5,"), {key, "integer"});
  }
  expect_error(with(kSmall, "num_key_value_heads", "\"num_key_value_heads\": 0,"),
               {"num_key_value_heads", ">= 1"});
  expect_error(with(kSmall, "hidden_act", "\"hidden_act\": \"silu\", \"rms_norm_eps\": \"small\""),
               {"rms_norm_eps", "number"});
  expect_error(with(kSmall, "hidden_act", "\"hidden_act\": \"silu\", \"tie_word_embeddings\": 1"),
               {"tie_word_embeddings", "true or false"});
}

TEST(HfConfig, RopeScalingAndValidationErrors) {
  expect_error(with(kSmall, "hidden_act",
                    "\"hidden_act\": \"silu\", \"rope_scaling\": {\"rope_type\": \"yarn\", "
                    "\"factor\": 4.0}"),
               {"rope_scaling", "\"yarn\"", "not supported", "llama3"});
  expect_error(
      with(kSmall, "hidden_act", "\"hidden_act\": \"silu\", \"rope_scaling\": {\"factor\": 4.0}"),
      {"rope_scaling", "missing", "llama3"});
  expect_error(with(kSmall, "hidden_act", "\"hidden_act\": \"silu\", \"rope_scaling\": 8"),
               {"rope_scaling", "null or an object"});
  // Validation's message, with memfit's name and the HuggingFace one.
  expect_error(with(kSmall, "num_key_value_heads", "\"num_key_value_heads\": 3,"),
               {"config.json", "kv_heads", "3 does not divide heads 4", "num_key_value_heads"});
  expect_error(with(kSmall, "hidden_act", "\"hidden_act\": \"silu\", \"rope_theta\": 1.0"),
               {"config.json", "rope_theta", "> 1"});
  expect_error(with(kSmall, "hidden_act", "\"hidden_act\": \"silu\", \"head_dim\": 7"),
               {"config.json", "head_dim", "even"});
}

// Errors name the file they came from, a rope_scaling sub-key's too (the header: "ConfigError
// naming it").
TEST(HfConfig, RopeScalingSubKeyErrorNamesTheFile) {
  expect_error(with(kSmall, "hidden_act",
                    "\"hidden_act\": \"silu\", \"rope_scaling\": {\"rope_type\": \"llama3\", "
                    "\"factor\": \"8\", \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                    "\"original_max_position_embeddings\": 8192}"),
               {"config.json: ", "rope_scaling", "factor", "number", "\"8\""});
  // transformers' llama3 rule needs all four parameters; the two names of the type must agree;
  // unknown keys are refused.
  expect_error(with(kSmall, "hidden_act",
                    "\"hidden_act\": \"silu\", \"rope_scaling\": {\"rope_type\": \"llama3\", "
                    "\"factor\": 8.0}"),
               {"config.json: ", "rope_scaling.low_freq_factor", "missing"});
  expect_error(with(kSmall, "hidden_act",
                    "\"hidden_act\": \"silu\", \"rope_scaling\": {\"rope_type\": \"llama3\", "
                    "\"type\": \"linear\"}"),
               {"rope_scaling", "disagree"});
  expect_error(with(kSmall, "hidden_act",
                    "\"hidden_act\": \"silu\", \"rope_scaling\": {\"rope_type\": \"default\", "
                    "\"beta\": 1}"),
               {"rope_scaling", "unknown key", "beta"});
}

// Family defaults for an absent num_key_value_heads (MistralConfig 8, Qwen2Config 32) and
// transformers 5's rope_parameters.
TEST(HfConfig, FamilyDefaultsAndRopeParameters) {
  const std::string mistral = std::string(R"({"model_type": "mistral", "vocab_size": 64,
    "hidden_size": 512, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 16, "max_position_embeddings": 128})");
  EXPECT_EQ(ModelSpec::from_hf_config_string(mistral, "m.json").resolved_kv_heads(), 8);
  const std::string v5 = std::string(R"({"model_type": "llama", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "max_position_embeddings": 128,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})");
  const ModelSpec s = ModelSpec::from_hf_config_string(v5, "v5.json");
  EXPECT_EQ(s.rope_theta, 500000.0f);
  EXPECT_EQ(s.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_EQ(s.rope_scaling.original_max_position_embeddings, 64);
  expect_error(std::string(R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-300})"),
               {"rms_norm_eps", "range"});
}

// ---- Files ------------------------------------------------------------------------------------

TEST(HfConfig, FilesAndLoad) {
  ScratchDir dir;
  const std::string flat = dir.write("Mistral-7B-v0.1.json", kMistral7B);
  std::vector<std::string> notes;
  const ModelSpec m = ModelSpec::from_hf_config_file(flat, &notes);
  EXPECT_EQ(m.name, "Mistral-7B-v0.1");
  EXPECT_EQ(m.seq_len, 4096);
  // Notes and errors name the file.
  const std::string n = note_with(notes, "sliding_window");
  EXPECT_EQ(n.rfind(flat, 0), 0u) << n;
  // load() reads a .json path as a config.json; the directory names a config.json.
  const std::string nested = dir.write("Llama-3.1-8B/config.json", kLlama31_8B);
  const ModelSpec l = ModelSpec::load(nested);
  EXPECT_EQ(l.name, "Llama-3.1-8B");
  EXPECT_EQ(l.parameter_count(), 8030261248);
  std::vector<std::string> load_notes;
  ModelSpec::load(nested, &load_notes);
  EXPECT_NE(note_with(load_notes, "bos_token_id"), "");

  const std::string bad = dir.write("bad.json", with(kSmall, "num_attention_heads", ""));
  try {
    ModelSpec::load(bad);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
    EXPECT_NE(msg.find("num_attention_heads"), std::string::npos) << msg;
  }
  const std::string missing = dir.path() + "/no_such/config.json";
  for (int via_load = 0; via_load < 2; ++via_load) {
    try {
      if (via_load) {
        ModelSpec::load(missing);
      } else {
        ModelSpec::from_hf_config_file(missing);
      }
      ADD_FAILURE() << via_load;
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(missing), std::string::npos) << msg;
      EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
    }
  }
}

TEST(HfConfig, ExampleLlamaTinyLoads) {
  const std::string path = source_dir() + "/examples/configs/llama-tiny.json";
  std::vector<std::string> notes;
  const ModelSpec s = ModelSpec::load(path, &notes);
  EXPECT_EQ(s.name, "llama-tiny");
  EXPECT_EQ(s.kind, ModelSpec::Kind::kLlama);
  EXPECT_EQ(s.vocab, 256);
  EXPECT_EQ(s.hidden, 256);
  EXPECT_EQ(s.layers, 6);
  EXPECT_EQ(s.heads, 8);
  EXPECT_EQ(s.resolved_kv_heads(), 4);
  EXPECT_EQ(s.resolved_head_dim(), 32);
  EXPECT_EQ(s.intermediate, 704);
  EXPECT_EQ(s.seq_len, 128);
  // V*C + 6 * (2C + (256 + 2*128) C + C*256 + 3*704*C) + C + V*C.
  const std::int64_t c = 256;
  EXPECT_EQ(s.parameter_count(),
            256 * c + 6 * (2 * c + 512 * c + c * 256 + 3 * 704 * c) + c + 256 * c);
  EXPECT_NE(note_with(notes, "ignored").find("initializer_range"), std::string::npos);
  EXPECT_NE(note_with(notes, "dtype").find("float32"), std::string::npos);
}

TEST(HfConfig, ExampleQwen3TinyLoads) {
  const std::string path = source_dir() + "/examples/configs/qwen3-tiny.json";
  const ModelSpec s = ModelSpec::load(path);
  EXPECT_EQ(s.name, "qwen3-tiny");
  EXPECT_TRUE(s.qk_norm);
  EXPECT_TRUE(s.tied_head);
  EXPECT_FALSE(s.qkv_bias);
  EXPECT_EQ(s.seq_len, 128);
  // llama-tiny's blocks with two head-size norms each, and the head tied.
  const std::int64_t c = 256;
  EXPECT_EQ(s.parameter_count(),
            256 * c + 6 * (2 * c + 512 * c + 2 * 32 + c * 256 + 3 * 704 * c) + c);
}

}  // namespace
}  // namespace memfit
