// ModelSpec: the shape of a model, from YAML or a built-in name.
//
//   ModelSpec s = ModelSpec::from_yaml_file("examples/configs/gpt-tiny.yaml");
//   ModelSpec g = ModelSpec::preset("gpt2");          // 124M
//   s.validate();                                     // done by both of the above
//   std::int64_t n = s.parameter_count();
//
// YAML (one top-level `model:` map; unknown keys are errors):
//   model:
//     kind: gpt          # gpt: GPT-2 (pre-LN transformer blocks); mlp: the same with MLP-only
//     name: gpt-tiny     # optional; blocks (no attention), for models without attention
//     vocab: 256         # token ids in [0, vocab)
//     seq_len: 128       # maximum sequence length (the position table's size)
//     layers: 6
//     hidden: 256
//     heads: 8           # gpt only; must divide hidden
//     mlp_ratio: 4       # the MLP's inner width is mlp_ratio * hidden
//     tied_head: true    # the output projection shares the token embedding (GPT-2)
//     ln_eps: 1e-5       # optional
//     attention: flash   # optional, gpt: flash (the default: tiled, O(T) memory, head size at
//                        # most 256) or materialized (the (T, T) probabilities saved, as memfit
//                        # computed attention before flash; reproduces older plans)
// Errors are ConfigError naming the file, the line and the key, and what would be valid:
// missing keys, wrong types, sizes < 1, heads not dividing hidden, products (parameter count,
// bytes of any one tensor) that overflow int64.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/layers/attention_impl.h"

namespace memfit {

struct ModelSpec {
  enum class Kind : std::uint8_t { kGpt, kMlp };
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

  static ModelSpec from_yaml_string(std::string_view text, std::string_view source = "<string>");
  static ModelSpec from_yaml_file(const std::string& path);
  // Built-in shapes: "gpt-tiny" (the benchmarks' 6 x 256), "gpt-micro" (tests), "gpt2",
  // "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-6.7b", "gpt3-13b", "mlp-tiny". ConfigError
  // listing them otherwise.
  static ModelSpec preset(std::string_view name);
  static std::vector<std::string> preset_names();
  // A preset name, or else a YAML file path.
  static ModelSpec load(const std::string& name_or_path);

  // ConfigError (source "<spec>") as for the YAML; from_yaml_* and preset call it.
  void validate() const;
  // The one check of a sequence length asked of this model: 0 is the model's own seq_len;
  // otherwise 1 to seq_len, else InvalidArgument "seq_len N: valid: 1 to M (NAME's seq_len;
  // 0: that)". Returns the length to use.
  std::int64_t resolve_seq_len(std::int64_t requested) const;
  std::int64_t parameter_count() const;  // unique parameters (a tied head counted once)
  std::string to_yaml() const;           // round-trips through from_yaml_string
};

const char* model_kind_name(ModelSpec::Kind k);  // "gpt", "mlp"

}  // namespace memfit
