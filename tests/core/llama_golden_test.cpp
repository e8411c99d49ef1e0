// The whole Llama (kind llama) against PyTorch: logits, loss, every gradient and a 10-step AdamW
// loss trajectory, from two files in tests/core/data (scripts/make_llama_golden.py, the
// plain-torch reference scripts/torch_llama.py, torch 1.13 on the CPU in f32; format in the
// script's docstring). The test never needs PyTorch.
// - llama_golden.bin is Qwen2-like so that every optional piece of Llama 3 and Qwen2 is
//   checked: RMSNorm gains away from 1, grouped-query attention (4 query heads on 2 kv heads),
//   q/k/v biases, rotary embedding with llama3 scaling whose three bands (kept, interpolated,
//   divided by the factor) each hold one of the head's 4 frequencies, SwiGLU MLP, an untied
//   head, no position table.
// - qwen3_golden.bin is Qwen3-like: the same sizes with per-head q/k RMSNorms (gains away from
//   1), no biases, a tied head and rope_theta 1e6 without scaling.
//
// Tolerances: gpt_golden_test.cpp's, for the same reasons (f32 throughout, different
// reduction orders, K <= 96 terms per sum; RMSNorm and softmax amplify them as LayerNorm and
// softmax do there). Rotary adds one rounding of cos and sin per angle on each side (torch's
// f32 cos/sin, memfit's), ~1 u. The q/k/v weights are drawn 8x larger than the rest (the
// script's QKV_SCALE) so that the attention scores are O(1) and where a position attends
// depends on the rotary angles. Measured here (printed by the tests): logits max |diff|
// 1.6e-7 (values up to 0.48; worst 0.13 of the bound), loss 4.3e-8 relative, gradients max
// |diff| 7.5e-8 (worst 0.046 of the bound), trajectory 7.4e-8 relative, with and without
// checkpointing. What a real mistake moves, measured by regenerating the file from a mutated
// torch_llama.py: no llama3 scaling, or the middle band not interpolated: logits 0.13 off
// (1e5 x the bound), loss 7e-4 relative; kv head h % G instead of h // (H/G): logits 0.46;
// interleaved pairs (2i, 2i+1) instead of rotate-half: 0.24; RMSNorm eps 1e-5 for 1e-6: 9e-3.
// qwen3_golden.bin: logits 1.5e-7 (0.13 of the bound), loss 2.7e-8 relative, gradients 7.5e-8
// (0.059), trajectory 1.1e-7; memfit's k heads normed with q_norm's weight (a mutated CPU op):
// logits 0.038 off (29,000 x the bound).
// (A shift of every position by one is invisible: rotary scores depend only on t - s.)
// The bounds:
//   logits      |a - b| <= 1e-6 + 1e-5 |b|
//   loss        relative 2e-6
//   gradients   |a - b| <= 1e-5 * max|b| over the tensor + 1e-5 |b|
//   trajectory  relative 1e-5 per step
#include <gtest/gtest.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/device_adamw.h"
#include "core/executor.h"
#include "core/model.h"
#include "tests/core/exec_testutil.h"
#include "tests/core/golden_testutil.h"

namespace memfit {
namespace {

using testing::Batch;
using testing::GoldenEntry;
using testing::Rig;
using testing::to_host;

using Errors = testing::GoldenErrors;

class LlamaGolden : public ::testing::TestWithParam<const char*> {
 protected:
  bool qwen3() const { return std::string(GetParam()) == "qwen3_golden.bin"; }

  void SetUp() override {
    g_ = testing::read_golden(testing::golden_data_path(GetParam()));
    ASSERT_FALSE(g_.empty());
    for (const char* k :
         {"config", "rope", "adamw", "tokens", "targets", "logits", "loss", "trajectory"}) {
      ASSERT_TRUE(g_.count(k)) << "entry " << k << " missing";
    }
    const std::vector<std::int32_t>& c = g_["config"].i;
    ASSERT_EQ(c.size(), qwen3() ? 16u : 15u);  // llama_golden.bin predates qk_norm
    spec_.kind = ModelSpec::Kind::kLlama;
    spec_.vocab = c[0];
    spec_.seq_len = c[1];
    spec_.layers = c[2];
    spec_.hidden = c[3];
    spec_.heads = c[4];
    spec_.kv_heads = c[5];
    spec_.head_dim = c[6];
    spec_.intermediate = c[7];
    spec_.tied_head = c[8] != 0;
    spec_.qkv_bias = c[9] != 0;
    spec_.proj_bias = c[10] != 0;
    spec_.mlp_bias = c[11] != 0;
    b_ = c[12];
    t_ = c[13];
    steps_ = c[14];
    spec_.qk_norm = c.size() > 15 && c[15] != 0;
    const std::vector<float>& r = g_["rope"].f;
    ASSERT_EQ(r.size(), 6u);
    spec_.rope_theta = r[0];
    if (r[1] != 0.0f) {  // factor 0: no scaling
      spec_.rope_scaling.kind = RopeScaling::Kind::kLlama3;
      spec_.rope_scaling.factor = r[1];
      spec_.rope_scaling.low_freq_factor = r[2];
      spec_.rope_scaling.high_freq_factor = r[3];
      spec_.rope_scaling.original_max_position_embeddings = static_cast<std::int64_t>(r[4]);
    }
    spec_.ln_eps = r[5];  // torch adds the Python 1e-6 to an f32 tensor: f32(1e-6), as here
    // The shapes the files were made for (scripts/make_llama_golden.py): GQA with q/k/v bias
    // only and llama3 scaling; GQA with q/k norms, a tied head and no scaling.
    EXPECT_LT(spec_.resolved_kv_heads(), spec_.heads);
    if (qwen3()) {
      EXPECT_TRUE(spec_.qk_norm && !spec_.qkv_bias && !spec_.proj_bias && !spec_.mlp_bias &&
                  spec_.tied_head);
      EXPECT_EQ(spec_.rope_scaling.kind, RopeScaling::Kind::kNone);
    } else {
      EXPECT_TRUE(spec_.qkv_bias && !spec_.proj_bias && !spec_.mlp_bias && !spec_.tied_head &&
                  !spec_.qk_norm);
      EXPECT_EQ(spec_.rope_scaling.original_max_position_embeddings, 64);
    }
    ASSERT_NO_THROW(spec_.validate());
    const std::vector<float>& o = g_["adamw"].f;
    ASSERT_EQ(o.size(), 5u);
    adamw_.lr = testing::golden_double(o[0]);
    adamw_.beta1 = testing::golden_double(o[1]);
    adamw_.beta2 = testing::golden_double(o[2]);
    adamw_.eps = testing::golden_double(o[3]);
    adamw_.weight_decay = testing::golden_double(o[4]);
    EXPECT_EQ(adamw_.lr, 1e-3);  // the GPT golden's values
    EXPECT_EQ(adamw_.beta2, 0.999);
  }

  void load_params(Model& m, LayerContext& ctx) { testing::load_golden_params(g_, m, ctx); }

  std::map<std::string, GoldenEntry> g_;
  ModelSpec spec_;
  std::int64_t b_ = 0, t_ = 0, steps_ = 0;
  AdamWOptions adamw_;
};

// memfit's parameter names and order, which the golden file (and HuggingFace checkpoint
// loading) rely on.
TEST_P(LlamaGolden, ParameterNamesAndOrder) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  Model m(spec_, ctx);
  std::vector<std::string> want = {"wte"};
  for (std::int64_t i = 0; i < spec_.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    const std::vector<const char*> attn =
        qwen3() ? std::vector<const char*>{"self_attn.qkv.weight", "self_attn.q_norm.weight",
                                           "self_attn.k_norm.weight"}
                : std::vector<const char*>{"self_attn.qkv.weight", "self_attn.qkv.bias"};
    want.push_back(p + "input_layernorm.weight");
    for (const char* s : attn) want.push_back(p + s);
    for (const char* s : {"self_attn.proj.weight", "post_attention_layernorm.weight",
                          "mlp.gate_up.weight", "mlp.down.weight"}) {
      want.push_back(p + s);
    }
  }
  want.push_back("norm.weight");
  if (!qwen3()) want.push_back("head.weight");
  std::vector<std::string> got;
  std::int64_t numel = 0;
  for (Parameter* p : m.parameters()) {
    got.push_back(p->name);
    numel += p->shape.numel();
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(numel, spec_.parameter_count());
  EXPECT_EQ(numel, m.parameter_count());
}

TEST_P(LlamaGolden, LogitsLossAndGradients) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  Model m(spec_, ctx);
  load_params(m, ctx);
  Batch batch(rig, g_["tokens"].i, g_["targets"].i, b_, t_);

  // Logits: the head's saved logits after a forward (the executor runs the head's backward
  // at once, which overwrites them with dlogits).
  {
    Act x = m.embedding().forward(ctx, batch.mb.tokens);
    for (int i = 0; i < m.num_blocks(); ++i) x = m.block(i).forward(ctx, x, false);
    Act losses = m.head().forward(ctx, x, batch.mb.targets);
    ASSERT_NE(m.head().logits(), nullptr);
    const Errors e = testing::golden_compare(to_host(ctx, *m.head().logits()), g_["logits"].f, 1e-6,
                                             1e-5, "logits");
    double scale = 0;
    for (float v : g_["logits"].f) scale = std::max(scale, double{std::fabs(v)});
    std::printf("logits: max |diff| %.3g (max |logit| %.3g), worst / tolerance %.3f\n", e.max_abs,
                scale, e.worst_ratio);
    m.head().release_saved();
  }

  Executor ex(m, ctx);
  m.zero_grad(ctx);
  const double rows = static_cast<double>(b_ * t_);
  Act losses = ex.run(Schedule::none(m.num_blocks()), batch.mb, static_cast<float>(1.0 / rows));
  const double loss = sum_losses(ctx, losses->view()) / rows;
  const double want = g_["loss"].f[0];
  std::printf("loss: memfit %.9g, torch %.9g, relative diff %.3g\n", loss, want,
              std::fabs(loss - want) / want);
  EXPECT_NEAR(loss, want, 2e-6 * want);

  double worst = 0, worst_abs = 0;
  std::string worst_name;
  for (Parameter* p : m.parameters()) {
    const auto it = g_.find("grad/" + p->name);
    ASSERT_NE(it, g_.end()) << p->name;
    const std::vector<float>& ref = it->second.f;
    double scale = 0;
    for (float v : ref) scale = std::max(scale, double{std::fabs(v)});
    ASSERT_GT(scale, 0.0) << p->name << ": an all-zero reference gradient tests nothing";
    const Errors e =
        testing::golden_compare(to_host(ctx, p->grad.view()), ref, 1e-5 * scale, 1e-5, p->name);
    if (e.worst_ratio > worst) {
      worst = e.worst_ratio;
      worst_name = p->name;
    }
    worst_abs = std::max(worst_abs, e.max_abs);
  }
  std::printf("gradients: max |diff| %.3g; worst / tolerance %.3f (%s)\n", worst_abs, worst,
              worst_name.c_str());
}

TEST_P(LlamaGolden, AdamWTrajectory) {
  for (bool checkpointed : {false, true}) {
    Rig rig(false);
    LayerContext ctx = rig.ctx(DType::kF32);
    Model m(spec_, ctx);
    load_params(m, ctx);
    Batch batch(rig, g_["tokens"].i, g_["targets"].i, b_, t_);
    Executor ex(m, ctx);
    DeviceAdamW opt(m.parameters(), adamw_, ctx);
    const Schedule s =
        checkpointed ? Schedule::all(m.num_blocks()) : Schedule::none(m.num_blocks());
    const double rows = static_cast<double>(b_ * t_);
    const std::vector<float>& ref = g_["trajectory"].f;
    ASSERT_EQ(static_cast<std::int64_t>(ref.size()), steps_);
    double worst = 0;
    for (std::int64_t k = 0; k < steps_; ++k) {
      m.zero_grad(ctx);
      Act losses = ex.run(s, batch.mb, static_cast<float>(1.0 / rows));
      const double loss = sum_losses(ctx, losses->view()) / rows;
      const double rel =
          std::fabs(loss - ref[static_cast<std::size_t>(k)]) / ref[static_cast<std::size_t>(k)];
      EXPECT_LE(rel, 1e-5) << "step " << k << ": memfit " << loss << ", torch " << ref[k];
      worst = std::max(worst, rel);
      opt.step(ctx, 1.0);
    }
    EXPECT_EQ(opt.steps(), steps_);
    EXPECT_LT(ref.back(), ref.front());  // training on one batch lowers the loss
    std::printf("trajectory (%s): %lld steps, loss %.6f -> %.6f, worst relative diff %.3g\n",
                s.name().c_str(), static_cast<long long>(steps_), ref.front(), ref.back(), worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Files, LlamaGolden,
                         ::testing::Values("llama_golden.bin", "qwen3_golden.bin"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param).substr(0, 5);  // llama, qwen3
                         });

}  // namespace
}  // namespace memfit
