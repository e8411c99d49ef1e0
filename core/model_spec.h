// ModelSpec: the shape of a model, from YAML or a built-in name.
//
//   ModelSpec s = ModelSpec::from_yaml_file("examples/configs/gpt-tiny.yaml");
//   ModelSpec g = ModelSpec::preset("gpt2");          // 124M
//   s.validate();                                     // done by both of the above
//   std::int64_t n = s.parameter_count();
//
// YAML (one top-level `model:` map; unknown keys are errors):
//   model:
//     kind: gpt          # gpt: GPT-2 (pre-LN transformer blocks); llama: the Llama family
//     name: gpt-tiny     # (RMSNorm, grouped-query rotary attention, SwiGLU; Mistral, Qwen2
//     vocab: 256         # and Qwen3 too); mlp: GPT-2 blocks without attention. Optional name.
//     seq_len: 128       # maximum sequence length (gpt: the position table's size)
//     layers: 6          # token ids are in [0, vocab)
//     hidden: 256
//     heads: 8           # gpt and llama; gpt: must divide hidden
//     mlp_ratio: 4       # gpt and mlp: the MLP's inner width is mlp_ratio * hidden
//     tied_head: true    # the output projection shares the token embedding (default: true for
//                        # gpt and mlp, false for llama)
//     ln_eps: 1e-5       # optional; the norms' epsilon (default 1e-5; llama's RMSNorm: 1e-6)
//     attention: flash   # optional, gpt and llama: flash (the default: tiled, O(T) memory, head
//                        # size at most 256) or materialized (the (T, T) probabilities saved,
//                        # as memfit computed attention before flash; reproduces older plans;
//                        # multi-head only)
//   kind llama only (HuggingFace's LlamaConfig names in brackets):
//     intermediate: 14336   # required: the SwiGLU MLP's inner width [intermediate_size]
//     kv_heads: 8           # optional, divides heads [num_key_value_heads]; default heads
//     head_dim: 128         # optional, even, 1 to 256; default hidden / heads (which must
//                           # then divide)
//     rope_theta: 500000    # optional, > 1; default 10000
//     rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4,
//                    original_max_position_embeddings: 8192}   # optional; type none or llama3
//     qkv_bias: false       # optional [attention_bias, or Qwen2's always-on q/k/v biases]
//     proj_bias: false      # optional [attention_bias covers both in Llama]
//     mlp_bias: false       # optional [mlp_bias]
//     qk_norm: false        # optional: Qwen3's per-head RMSNorm of q and k before the rotary
//                           # embedding (q_norm, k_norm: head_dim weights each); flash only
// Errors are ConfigError naming the file, the line and the key, and what would be valid:
// missing keys, wrong types, sizes < 1, heads not dividing hidden, products (parameter count,
// bytes of any one tensor) that overflow int64.
// A HuggingFace config.json describes the same models (core/hf_config.cpp; load() reads a path
// ending in .json that way).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/layers/attention_impl.h"
#include "core/rope.h"

namespace memfit {

struct ModelSpec {
  enum class Kind : std::uint8_t { kGpt, kMlp, kLlama };
  Kind kind = Kind::kGpt;
  std::string name = "custom";
  std::int64_t vocab = 256;
  std::int64_t seq_len = 128;
  std::int64_t layers = 2;
  std::int64_t hidden = 64;
  std::int64_t heads = 4;
  std::int64_t mlp_ratio = 4;
  bool tied_head = true;
  float ln_eps = 1e-5f;
  AttentionImpl attention = AttentionImpl::kFlash;
  // kind llama (0 for kv_heads and head_dim: heads and hidden / heads).
  std::int64_t intermediate = 0;
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool qkv_bias = false;
  bool proj_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;

  static ModelSpec from_yaml_string(std::string_view text, std::string_view source = "<string>");
  static ModelSpec from_yaml_file(const std::string& path);
  // A HuggingFace config.json (core/hf_config.cpp): model_type llama, mistral, qwen2 or qwen3
  // (kind llama; qwen3 with qk_norm), its `architectures` checked against model_type. Read:
  // vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
  // max_position_embeddings (required); num_key_value_heads (absent: the family's default,
  // Mistral 8, Qwen2 and Qwen3 32, Llama heads; null: heads), head_dim (absent: Qwen3 128,
  // others hidden / heads), rms_norm_eps, rope_theta, rope_scaling (null, default or llama3
  // with all four of its parameters) or transformers 5's rope_parameters, tie_word_embeddings,
  // attention_bias, mlp_bias, hidden_act (silu only); seq_len is max_position_embeddings,
  // capped by a smaller sliding window (Mistral's, default 4096, and Qwen2's and Qwen3's with
  // use_sliding_window when a layer slides: layer_types, else max_window_layers <
  // num_hidden_layers) so the model memfit computes is the one trained; torch_dtype / dtype
  // are only named in `notes`; the name is _name_or_path's last component, else the directory
  // holding config.json, else the file's stem. Keys memfit does not use (bos_token_id,
  // initializer_range, ...) are named in one line of `notes` and ignored. Any other model_type
  // (mixtral and other mixtures of experts, gemma, ...), a missing required key or a value out
  // of range is ConfigError naming it and what is valid.
  static ModelSpec from_hf_config_string(std::string_view text, std::string_view source,
                                         std::vector<std::string>* notes = nullptr);
  static ModelSpec from_hf_config_file(const std::string& path,
                                       std::vector<std::string>* notes = nullptr);
  // Built-in shapes (core/model_presets.cpp): "gpt-tiny" (the benchmarks' 6 x 256),
  // "gpt-micro" (tests), "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-6.7b",
  // "gpt3-13b", "mlp-tiny", "llama-micro" (tests), "llama-3.2-1b", "llama-3.2-3b",
  // "llama-3.1-8b", "llama-2-7b", "llama-2-13b", "mistral-7b", "qwen2.5-7b", "qwen3-0.6b",
  // "qwen3-8b". ConfigError
  // listing them otherwise.
  static ModelSpec preset(std::string_view name);
  static std::vector<std::string> preset_names();
  // A preset name, else a path: *.json a HuggingFace config.json (core/hf_config.cpp), anything
  // else memfit's YAML.
  static ModelSpec load(const std::string& name_or_path, std::vector<std::string>* notes = nullptr);

  // ConfigError (source "<spec>") as for the YAML; from_yaml_* and preset call it.
  void validate() const;
  // The one check of a sequence length asked of this model: 0 is the model's own seq_len;
  // otherwise 1 to seq_len, else InvalidArgument "seq_len N: valid: 1 to M (NAME's seq_len;
  // 0: that)". Returns the length to use.
  std::int64_t resolve_seq_len(std::int64_t requested) const;
  std::int64_t parameter_count() const;  // unique parameters (a tied head counted once)
  // The attention's shape as the layers take it: kv heads and head size resolved (gpt: G = H,
  // hs = hidden / heads). Valid only for a validated spec of kind gpt or llama.
  std::int64_t resolved_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  std::int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden / heads; }
  std::string to_yaml() const;  // round-trips through from_yaml_string
};

const char* model_kind_name(ModelSpec::Kind k);  // "gpt", "mlp", "llama"

}  // namespace memfit
