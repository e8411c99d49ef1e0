// The neural-network ops' argument checks (identical on the CPU and meta backends, naming the
// op and the operand, writing nothing) and the meta backend's counting of them, which must
// never touch memory: its tensors carry NullProvider addresses, so a dereference would crash.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu/adamw.h"
#include "core/cpu/cpu_backend.h"
#include "core/meta/meta_backend.h"
#include "memory/null_provider.h"
#include "tests/core/nn_testutil.h"

namespace memfit {
namespace {

using namespace testing;  // NOLINT

constexpr StreamId s0 = kDefaultStream;

// Makes tensors for one backend: host memory for cpu, NullProvider addresses for meta.
class Maker {
 public:
  explicit Maker(Device dev) : dev_(dev) {}
  ~Maker() {
    for (auto& [p, n] : null_ptrs_) null_.deallocate(p, n);
  }
  Tensor t(Shape s, DType dt = DType::kF32) {
    const std::size_t bytes = static_cast<std::size_t>(s.numel()) * dtype_size(dt) + 4;
    return Tensor(raw(bytes), s, dt, dev_);
  }
  IndexTensor ids(Shape s) {
    const std::size_t bytes = static_cast<std::size_t>(s.numel()) * 4 + 4;
    auto* p = static_cast<std::int32_t*>(raw(bytes));
    if (dev_ == Device::kCpu) std::fill_n(p, s.numel(), 0);
    return {p, s, dev_};
  }
  // A view of `base` shifted by `off` elements (for overlap cases).
  static Tensor shifted(const Tensor& base, std::int64_t off, Shape s) {
    return Tensor(static_cast<char*>(base.raw()) + off * dtype_size(base.dtype()), s, base.dtype(),
                  base.device());
  }

 private:
  void* raw(std::size_t bytes) {
    if (dev_ == Device::kMeta) {
      void* p = null_.allocate(bytes);
      null_ptrs_.push_back({p, bytes});
      return p;
    }
    host_.push_back(std::make_unique<float[]>(bytes / 4 + 1));
    std::fill_n(host_.back().get(), bytes / 4 + 1, 0.5f);
    return host_.back().get();
  }
  Device dev_;
  NullProvider null_;
  std::vector<std::pair<void*, std::size_t>> null_ptrs_;
  std::vector<std::unique_ptr<float[]>> host_;
};

struct BadCall {
  const char* what;
  std::function<void(Backend&, Maker&)> call;
  std::vector<const char*> parts;  // the message must name these
};

std::string message_of(const BadCall& c, Backend& be, Maker& mk) {
  try {
    c.call(be, mk);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(NnChecks, BothBackendsRejectWithTheSameNamedMessage) {
  const DType f32 = DType::kF32, bf16 = DType::kBF16;
  const AdamWConstants k = adamw_constants(AdamWOptions{}, 1);
  const std::vector<BadCall> cases = {
      {"layernorm mean dtype",
       [&](Backend& b, Maker& m) {
         b.layernorm_forward(s0, m.t({2, 4}), m.t({4}), m.t({4}), 1e-5f, m.t({2, 4}),
                             m.t({2}, bf16), m.t({2}));
       },
       {"layernorm_forward", "mean", "f32"}},
      {"layernorm weight size",
       [&](Backend& b, Maker& m) {
         b.layernorm_forward(s0, m.t({2, 4}), m.t({5}), m.t({4}), 1e-5f, m.t({2, 4}), m.t({2}),
                             m.t({2}));
       },
       {"layernorm_forward", "weight", "4 elements"}},
      {"layernorm eps",
       [&](Backend& b, Maker& m) {
         b.layernorm_forward(s0, m.t({2, 4}), m.t({4}), m.t({4}), 0.0f, m.t({2, 4}), m.t({2}),
                             m.t({2}));
       },
       {"layernorm_forward", "eps"}},
      {"layernorm_backward dweight dtype",
       [&](Backend& b, Maker& m) {
         b.layernorm_backward(s0, m.t({2, 4}), m.t({2, 4}), m.t({4}), m.t({2}), m.t({2}),
                              m.t({2, 4}), m.t({4}, bf16), m.t({4}));
       },
       {"layernorm_backward", "dweight", "f32"}},
      {"gelu numel",
       [&](Backend& b, Maker& m) { b.gelu_forward(s0, m.t({6}), m.t({5})); },
       {"gelu_forward", "inp", "out"}},
      {"gelu partial overlap",
       [&](Backend& b, Maker& m) {
         Tensor x = m.t({8});
         b.gelu_forward(s0, Maker::shifted(x, 0, {4}), Maker::shifted(x, 2, {4}));
       },
       {"gelu_forward", "out", "overlaps", "inp"}},
      {"gelu_backward in place with another dtype",
       [&](Backend& b, Maker& m) {
         Tensor x = m.t({8});
         b.gelu_backward(s0, x, m.t({8}), Tensor(x.raw(), Shape{8}, bf16, x.device()));
       },
       {"gelu_backward", "dinp", "overlaps", "dout"}},
      {"add out overlaps a",
       [&](Backend& b, Maker& m) {
         Tensor x = m.t({8});
         b.add(s0, Maker::shifted(x, 0, {4}), m.t({4}), Maker::shifted(x, 1, {4}));
       },
       {"Backend::add", "out", "overlaps", "a"}},
      {"bias_backward dbias",
       [&](Backend& b, Maker& m) {
         b.bias_backward(s0, m.t({3, 4}), m.t({3}));
       },
       {"bias_backward", "dbias"}},
      {"softmax not square",
       [&](Backend& b, Maker& m) {
         b.softmax_causal_forward(s0, m.t({2, 3, 4}), 1.0f, m.t({24}));
       },
       {"softmax_causal_forward", "preatt", "square"}},
      {"attention heads",
       [&](Backend& b, Maker& m) {
         b.attention_forward(s0, m.t({1, 2, 12}), 3, m.t({12}), m.t({12}), m.t({8}), m.t({8}));
       },
       {"attention_forward", "qkv", "heads"}},
      {"attention att size",
       [&](Backend& b, Maker& m) {
         b.attention_forward(s0, m.t({1, 2, 12}), 2, m.t({24}), m.t({7}), m.t({8}), m.t({8}));
       },
       {"attention_forward", "att", "(B, H, T, T)"}},
      {"attention out overlaps qkvr",
       [&](Backend& b, Maker& m) {
         Tensor big = m.t({16});
         b.attention_forward(s0, m.t({1, 2, 6}), 1, Maker::shifted(big, 0, {12}), m.t({4}),
                             m.t({4}), Maker::shifted(big, 10, {4}));
       },
       {"attention_forward", "out", "overlaps", "qkvr"}},
      {"attention_backward dqkv size",
       [&](Backend& b, Maker& m) {
         b.attention_backward(s0, m.t({1, 2, 4}), m.t({24}), m.t({8}), 2, m.t({8}), m.t({24}),
                              m.t({23}));
       },
       {"attention_backward", "dqkv"}},
      {"embedding maxT",
       [&](Backend& b, Maker& m) {
         b.embedding_forward(s0, m.ids({2, 5}), m.t({7, 3}), m.t({4, 3}), m.t({2, 5, 3}));
       },
       {"embedding_forward", "wpe", "maxT >= T"}},
      {"embedding tokens shape",
       [&](Backend& b, Maker& m) {
         b.embedding_forward(s0, m.ids({10}), m.t({7, 3}), m.t({4, 3}), m.t({10, 3}));
       },
       {"embedding_forward", "tokens", "(B, T)"}},
      {"embedding_backward dwte dtype",
       [&](Backend& b, Maker& m) {
         b.embedding_backward(s0, m.t({1, 2, 3}), m.ids({1, 2}), m.t({7, 3}, bf16), m.t({4, 3}));
       },
       {"embedding_backward", "dwte", "f32"}},
      {"crossentropy vocab",
       [&](Backend& b, Maker& m) {
         b.crossentropy_forward(s0, m.t({2, 8}), m.ids({2}), 9, m.t({2}), m.t({2}));
       },
       {"crossentropy_forward", "vocab"}},
      {"crossentropy targets",
       [&](Backend& b, Maker& m) {
         b.crossentropy_forward(s0, m.t({2, 8}), m.ids({3}), 8, m.t({2}), m.t({2}));
       },
       {"crossentropy_forward", "targets"}},
      {"crossentropy losses dtype",
       [&](Backend& b, Maker& m) {
         b.crossentropy_forward(s0, m.t({2, 8}), m.ids({2}), 8, m.t({2}, bf16), m.t({2}));
       },
       {"crossentropy_forward", "losses", "f32"}},
      {"crossentropy_backward dlosses",
       [&](Backend& b, Maker& m) {
         const Tensor dl = m.t({3});
         b.crossentropy_backward(s0, m.t({2, 8}), m.t({2}), m.ids({2}), 8, 1.0f, &dl, m.t({2, 8}));
       },
       {"crossentropy_backward", "dlosses"}},
      {"adamw param dtype",
       [&](Backend& b, Maker& m) { b.adamw(s0, k, m.t({4}, bf16), m.t({4}), m.t({4}), m.t({4})); },
       {"adamw", "param", "f32"}},
      {"adamw param_out aliases param",
       [&](Backend& b, Maker& m) {
         const Tensor p = m.t({4});
         b.adamw(s0, k, p, m.t({4}), m.t({4}), m.t({4}), &p);
       },
       {"adamw", "overlaps"}},
  };
  CpuBackend cpu;
  MetaBackend meta;
  for (const BadCall& c : cases) {
    SCOPED_TRACE(c.what);
    Maker mc(Device::kCpu), mm(Device::kMeta);
    const std::string cm = message_of(c, cpu, mc), mmsg = message_of(c, meta, mm);
    ASSERT_FALSE(cm.empty()) << "cpu accepted it";
    ASSERT_FALSE(mmsg.empty()) << "meta accepted it";
    for (const char* p : c.parts) EXPECT_NE(cm.find(p), std::string::npos) << p << ": " << cm;
    std::string normalized = mmsg;
    normalized.replace(normalized.find("(meta)"), 6, "(cpu)");
    // Same text but the backend name and the device in operand descriptions.
    std::string cpu_norm = cm;
    for (std::string* s : {&normalized, &cpu_norm}) {
      for (std::size_t at; (at = s->find(" on meta")) != std::string::npos;)
        s->replace(at, 8, " on X");
      for (std::size_t at; (at = s->find(" on cpu")) != std::string::npos;)
        s->replace(at, 7, " on X");
      for (std::size_t at; (at = s->find("0x")) != std::string::npos;) s->replace(at, 2, "@");
    }
    if (normalized.find('@') == std::string::npos) EXPECT_EQ(normalized, cpu_norm);
  }
  EXPECT_EQ(meta.stats().total_calls(), 0);
}

TEST(NnChecks, RejectedCallWritesNothing) {
  CpuBackend be;
  HT x({2, 4}, DType::kF32), w({4}, DType::kF32), b({4}, DType::kF32), out({2, 4}, DType::kF32),
      mean({2}, DType::kF32), rstd({2}, DType::kBF16);
  out.fill(3);
  mean.fill(3);
  EXPECT_THROW(be.layernorm_forward(s0, x, w, b, 1e-5f, out, mean, rstd), InvalidArgument);
  for (std::int64_t i = 0; i < out.n(); ++i) ASSERT_EQ(out.get(i), 3.0f);
  for (std::int64_t i = 0; i < mean.n(); ++i) ASSERT_EQ(mean.get(i), 3.0f);
}

// One GPT-2 block's worth of ops at a small size on meta: counts, flops and bytes follow the
// documented rules, and nothing is dereferenced.
TEST(NnChecks, MetaCountsAGpt2BlockWithoutTouchingMemory) {
  MetaBackend be;
  Maker m(Device::kMeta);
  const std::int64_t B = 2, T = 16, C = 32, H = 4, V = 50, Vp = 64, hs = C / H;
  const DType dt = DType::kBF16;
  const IndexTensor tok = m.ids({B, T});
  const Tensor wte = m.t({Vp, C}, dt), wpe = m.t({T, C}, dt), x = m.t({B, T, C}, dt);
  be.embedding_forward(s0, tok, wte, wpe, x);
  const Tensor ln = m.t({B, T, C}, dt), mean = m.t({B * T}), rstd = m.t({B * T});
  const Tensor w = m.t({C}, dt), bias = m.t({C}, dt);
  be.layernorm_forward(s0, x, w, bias, 1e-5f, ln, mean, rstd);
  const Tensor qkv = m.t({B, T, 3 * C}, dt), qkvr = m.t({3 * B * T * C}, dt),
               att = m.t({B, H, T, T}, dt), scratch = m.t({B * T * C}, dt), y = m.t({B, T, C}, dt);
  be.attention_forward(s0, qkv, H, qkvr, att, scratch, y);
  MetaStats s = be.stats();
  EXPECT_EQ(s.calls(MetaOp::kEmbeddingForward), 1);
  EXPECT_EQ(s.calls(MetaOp::kLayerNormForward), 1);
  EXPECT_EQ(s.calls(MetaOp::kSplitHeads), 1);
  EXPECT_EQ(s.calls(MetaOp::kGemm), 2);
  EXPECT_EQ(s.calls(MetaOp::kSoftmaxCausalForward), 1);
  EXPECT_EQ(s.calls(MetaOp::kMergeHeads), 1);
  EXPECT_EQ(s.gemm_flops, 2 * (2 * B * H * T * T * hs));
  const std::int64_t live = B * H * T * (T + 1) / 2;
  EXPECT_EQ(s.other_flops, B * T * C /*embedding*/ + MetaFlops::kLayerNormForward * B * T * C +
                               MetaFlops::kSoftmaxForward * live);
  EXPECT_EQ(s.flops(), s.gemm_flops + s.other_flops);

  be.reset_stats();
  const Tensor dy = m.t({B, T, C}, dt), datt = m.t({B * H * T * T}, dt),
               dqkvr = m.t({3 * B * T * C}, dt), dqkv = m.t({B, T, 3 * C}, dt);
  be.attention_backward(s0, dy, qkvr, att, H, datt, dqkvr, dqkv);
  s = be.stats();
  EXPECT_EQ(s.calls(MetaOp::kGemm), 4);
  EXPECT_EQ(s.gemm_flops, 4 * (2 * B * H * T * T * hs));
  EXPECT_EQ(s.calls(MetaOp::kSoftmaxCausalBackward), 1);
  EXPECT_EQ(s.other_flops, MetaFlops::kSoftmaxBackward * live);

  be.reset_stats();
  const Tensor dw = m.t({C}), db = m.t({C});
  be.layernorm_backward(s0, dy, x, w, mean, rstd, ln, dw, db);
  s = be.stats();
  const std::int64_t act = B * T * C * 2;  // bf16 bytes of one activation
  EXPECT_EQ(s.bytes_written, act + 2 * C * 4);
  EXPECT_EQ(s.bytes_read, 3 * act + C * 2 + 2 * B * T * 4 + 2 * C * 4);

  be.reset_stats();
  const Tensor logits = m.t({B, T, Vp}, dt), losses = m.t({B * T}), lse = m.t({B * T});
  be.crossentropy_forward(s0, logits, m.ids({B * T}), V, losses, lse);
  be.crossentropy_backward(s0, logits, lse, m.ids({B * T}), V, 1.0f / (B * T), nullptr, logits);
  s = be.stats();
  EXPECT_EQ(s.other_flops,
            (MetaFlops::kCrossEntropyForward + MetaFlops::kCrossEntropyBackward) * B * T * V);
  EXPECT_EQ(s.bytes_written, 2 * B * T * 4 + B * T * Vp * 2);

  be.reset_stats();
  const std::int64_t n = 1000;
  const Tensor p = m.t({n}), g = m.t({n}, dt), ea = m.t({n}), eas = m.t({n}), po = m.t({n}, dt);
  be.adamw(s0, adamw_constants(AdamWOptions{}, 1), p, g, ea, eas, &po);
  s = be.stats();
  EXPECT_EQ(s.bytes_moved(), static_cast<std::int64_t>(adamw_bytes_per_element(dt, true, dt)) * n);
  EXPECT_EQ(s.calls(MetaOp::kAdamW), 1);
  EXPECT_STREQ(meta_op_name(MetaOp::kAdamW), "adamw");
  EXPECT_STREQ(meta_op_name(MetaOp::kSoftmaxCausalBackward), "softmax_causal_backward");
}

}  // namespace
}  // namespace memfit
