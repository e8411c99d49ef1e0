// ModelSpec's built-in shapes (core/model_spec.h), each from its published configuration.
#include <string>
#include <string_view>
#include <vector>

#include "core/model_spec.h"
#include "memory/error.h"

namespace memfit {

namespace {

ModelSpec gpt(const char* name, std::int64_t vocab, std::int64_t seq_len, std::int64_t layers,
              std::int64_t hidden, std::int64_t heads,
              ModelSpec::Kind kind = ModelSpec::Kind::kGpt) {
  ModelSpec s;
  s.kind = kind;
  s.name = name;
  s.vocab = vocab;
  s.seq_len = seq_len;
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.mlp_ratio = 4;
  s.tied_head = true;
  return s;
}

struct LlamaShape {
  std::int64_t vocab, seq_len, layers, hidden, heads, kv_heads, head_dim, intermediate;
  float rope_theta, rms_eps;
  bool tied, qkv_bias;
  float llama3_factor;   // 0: no rope_scaling
  bool qk_norm = false;  // Qwen3
};

ModelSpec llama(const char* name, const LlamaShape& l) {
  ModelSpec s;
  s.kind = ModelSpec::Kind::kLlama;
  s.name = name;
  s.vocab = l.vocab;
  s.seq_len = l.seq_len;
  s.layers = l.layers;
  s.hidden = l.hidden;
  s.heads = l.heads;
  s.kv_heads = l.kv_heads;
  s.head_dim = l.head_dim;
  s.intermediate = l.intermediate;
  s.rope_theta = l.rope_theta;
  s.ln_eps = l.rms_eps;
  s.tied_head = l.tied;
  s.qkv_bias = l.qkv_bias;
  s.qk_norm = l.qk_norm;
  if (l.llama3_factor > 0) {
    // Llama 3.1 / 3.2's rope_scaling: low 1, high 4, original context 8192.
    s.rope_scaling.kind = RopeScaling::Kind::kLlama3;
    s.rope_scaling.factor = l.llama3_factor;
    s.rope_scaling.low_freq_factor = 1.0f;
    s.rope_scaling.high_freq_factor = 4.0f;
    s.rope_scaling.original_max_position_embeddings = 8192;
  }
  return s;
}

// GPT-2 sizes from the GPT-2 paper (Radford et al. 2019, table 2) and the released configs
// (n_ctx 1024, vocab 50257). gpt3-6.7b: Brown et al. 2020 ("Language Models are Few-Shot
// Learners"), table 2.1: 32 layers, d_model 4096, 32 heads, context 2048, GPT-2's vocabulary
// and architecture (6.66e9 parameters here with the head tied to the embedding). gpt3-13b: the
// same table's 13B row (40 layers, 40 heads of d_head 128, context 2048) with d_model
// 40 x 128 = 5120, as implementations of that size use (OPT-13B, Zhang et al. 2022, table 1;
// the table's printed 5140 is not a multiple of its 40 heads): 12.85e9 parameters here.
//
// The Llama family from each model's HuggingFace config.json (the values below are those
// files' keys; parameter counts as published, checked by tests/core/model_spec_test.cpp):
//   llama-3.2-1b   meta-llama/Llama-3.2-1B        1,235,814,400 (tied head)
//   llama-3.2-3b   meta-llama/Llama-3.2-3B        3,212,749,824 (tied head)
//   llama-3.1-8b   meta-llama/Llama-3.1-8B        8,030,261,248
//   llama-2-7b     meta-llama/Llama-2-7b-hf       6,738,415,616
//   llama-2-13b    meta-llama/Llama-2-13b-hf     13,015,864,320
//   mistral-7b     mistralai/Mistral-7B-v0.1      7,241,732,096; seq_len is its sliding_window
//                  (4096) rather than max_position_embeddings (32768): memfit's attention is
//                  full causal, the same function up to the window
//   qwen2.5-7b     Qwen/Qwen2.5-7B                7,615,616,512 (q/k/v biases; 131072 context)
//   qwen3-0.6b     Qwen/Qwen3-0.6B                  596,049,920 (q/k norms, tied head; its
//                  model card: 0.6B, 0.44B non-embedding)
//   qwen3-8b       Qwen/Qwen3-8B                  8,190,735,360 (q/k norms; its model card:
//                  8.2B, 6.95B non-embedding)
//   llama-micro    the tests' 2-block Llama (grouped-query, 4 heads over 2 kv heads of 8)
std::vector<ModelSpec> all_presets() {
  using K = ModelSpec::Kind;
  return {
      gpt("gpt-tiny", 256, 128, 6, 256, 8),
      gpt("gpt-micro", 64, 16, 2, 32, 4),
      gpt("gpt2", 50257, 1024, 12, 768, 12),
      gpt("gpt2-medium", 50257, 1024, 24, 1024, 16),
      gpt("gpt2-large", 50257, 1024, 36, 1280, 20),
      gpt("gpt2-xl", 50257, 1024, 48, 1600, 25),
      gpt("gpt3-6.7b", 50257, 2048, 32, 4096, 32),
      gpt("gpt3-13b", 50257, 2048, 40, 5120, 40),
      gpt("mlp-tiny", 256, 128, 6, 256, 8, K::kMlp),
      llama("llama-micro", {64, 16, 2, 32, 4, 2, 8, 48, 10000.0f, 1e-6f, false, false, 0}),
      llama("llama-3.2-1b",
            {128256, 131072, 16, 2048, 32, 8, 64, 8192, 500000.0f, 1e-5f, true, false, 32}),
      llama("llama-3.2-3b",
            {128256, 131072, 28, 3072, 24, 8, 128, 8192, 500000.0f, 1e-5f, true, false, 32}),
      llama("llama-3.1-8b",
            {128256, 131072, 32, 4096, 32, 8, 128, 14336, 500000.0f, 1e-5f, false, false, 8}),
      llama("llama-2-7b",
            {32000, 4096, 32, 4096, 32, 32, 128, 11008, 10000.0f, 1e-5f, false, false, 0}),
      llama("llama-2-13b",
            {32000, 4096, 40, 5120, 40, 40, 128, 13824, 10000.0f, 1e-5f, false, false, 0}),
      llama("mistral-7b",
            {32000, 4096, 32, 4096, 32, 8, 128, 14336, 10000.0f, 1e-5f, false, false, 0}),
      llama("qwen2.5-7b",
            {152064, 131072, 28, 3584, 28, 4, 128, 18944, 1000000.0f, 1e-6f, false, true, 0}),
      llama("qwen3-0.6b",
            {151936, 40960, 28, 1024, 16, 8, 128, 3072, 1000000.0f, 1e-6f, true, false, 0, true}),
      llama("qwen3-8b",
            {151936, 40960, 36, 4096, 32, 8, 128, 12288, 1000000.0f, 1e-6f, false, false, 0, true}),
  };
}

}  // namespace

ModelSpec ModelSpec::preset(std::string_view name) {
  for (ModelSpec& s : all_presets()) {
    if (name != s.name) continue;
    s.validate();
    return s;
  }
  std::string names;
  for (const std::string& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError("model preset '" + std::string(name) + "': unknown; valid: " + names);
}

std::vector<std::string> ModelSpec::preset_names() {
  std::vector<std::string> out;
  for (const ModelSpec& s : all_presets()) out.push_back(s.name);
  return out;
}

}  // namespace memfit
