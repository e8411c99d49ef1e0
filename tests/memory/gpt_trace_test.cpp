#include "tests/support/gpt_trace.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>

#include "memory/error.h"

namespace memfit {
namespace {

// B=2 T=8 C=16 H=4 L=2 V=64: small enough to count every byte by hand.
GptTraceSpec tiny_spec() {
  GptTraceSpec s;
  s.layers = 2;
  s.hidden = 16;
  s.heads = 4;
  s.seq_len = 8;
  s.max_seq_len = 8;
  s.vocab = 64;
  s.micro_batch = 2;
  s.steps = 3;
  s.act_bytes = 2;
  s.mixed_precision = true;
  return s;
}

// Parameters of tiny_spec: wte 64*16 + wpe 8*16 + 2 * (12*16*16 + 13*16) + ln_f 2*16.
constexpr std::size_t kTinyParams = 1024 + 128 + 2 * (3072 + 208) + 32;  // 7744
constexpr std::size_t kTinyParamTensors = 2 + 2 * 12 + 2;                // 28

// Saved by one tiny block: 16*B*T*C*a + B*H*T*T*a + 16*B*T (ln stats, 4 FP32 (B,T) tensors).
constexpr std::size_t kTinySavedPerBlock = 16 * 2 * 8 * 16 * 2 + 2 * 4 * 8 * 8 * 2 + 16 * 2 * 8;

// Live requested bytes just before each op index (after ops [0, i)).
std::vector<std::size_t> live_before_each_op(const AllocTrace& t) {
  std::map<std::uint64_t, std::size_t> live;
  std::size_t bytes = 0;
  std::vector<std::size_t> out;
  for (const TraceOp& op : t.ops) {
    out.push_back(bytes);
    if (op.kind == TraceOpKind::kAlloc) {
      live[op.id] = op.size;
      bytes += op.size;
    } else if (op.kind == TraceOpKind::kFree) {
      bytes -= live.at(op.id);
      live.erase(op.id);
    }
  }
  return out;
}

// Index of the n-th (0-based) op of `kind` whose tag (phase) or id (step) matches.
std::size_t find_phase(const AllocTrace& t, const std::string& name, int nth) {
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    if (t.ops[i].kind == TraceOpKind::kPhase && t.ops[i].tag == name && nth-- == 0) return i;
  }
  ADD_FAILURE() << "phase " << name << " not found";
  return 0;
}

TEST(GptTrace, ParameterCountIsGpt2Small) {
  // HF GPT-2 small (tied LM head) has 124,439,808 parameters.
  EXPECT_EQ(gpt_trace_bytes(GptTraceSpec{}).parameter_count, 124439808u);
  EXPECT_EQ(gpt_trace_bytes(tiny_spec()).parameter_count, kTinyParams);
}

TEST(GptTrace, SavedBytesPerBlockMatchHandCount) {
  const GptTraceSpec spec = tiny_spec();
  EXPECT_EQ(kTinySavedPerBlock, 9472u);
  EXPECT_EQ(gpt_trace_bytes(spec).saved_per_block, kTinySavedPerBlock);
  const AllocTrace t = make_gpt_training_trace(spec);
  // Activations tagged h<l>. in the first step are exactly what block l saves (its input is
  // the previous block's output, counted there).
  std::map<std::string, std::size_t> saved;
  for (const TraceOp& op : t.ops) {
    if (op.kind == TraceOpKind::kStep && op.id == 1) break;
    if (op.kind == TraceOpKind::kAlloc && op.category == Category::kActivation &&
        op.tag.rfind("h", 0) == 0)
      saved[op.tag.substr(0, op.tag.find('.'))] += op.size;
  }
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved["h0"], kTinySavedPerBlock);
  EXPECT_EQ(saved["h1"], kTinySavedPerBlock);
}

TEST(GptTrace, LiveBytesAtEndOfForwardMatchHandCount) {
  const AllocTrace t = make_gpt_training_trace(tiny_spec());
  const std::vector<std::size_t> live = live_before_each_op(t);
  const std::size_t state = 4 * kTinyParams;         // one FP32 copy of the parameters
  const std::size_t forward_live = 2 * 2 * 8 * 8     // batch: inputs, targets (B,T) int64
                                   + 2 * 8 * 16 * 2  // embedding output (B,T,C)
                                   + 2 * kTinySavedPerBlock + 2 * 2 * 8 * 4  // ln_f stats
                                   + 2 * 8 * 16 * 2                          // ln_f output
                                   + 2 * 8 * 64 * 4         // FP32 log-softmax (B,T,V)
                                   + 4                      // loss
                                   + 64 * 16 * 2            // wte cast for the LM head
                                   + 2 * 12 * 16 * 16 * 2;  // per block qkv/proj/fc/fcproj casts
  EXPECT_EQ(forward_live, 38788u);
  // Step 0: parameters only; later steps also hold gradients and two Adam moments.
  EXPECT_EQ(live[find_phase(t, "backward", 0)], state + forward_live);
  EXPECT_EQ(live[find_phase(t, "backward", 1)], 4 * state + forward_live);
  EXPECT_EQ(live[find_phase(t, "backward", 2)], 4 * state + forward_live);
}

TEST(GptTrace, EveryAllocationIsFreedOrPersistent) {
  const AllocTrace t = make_gpt_training_trace(tiny_spec());
  const TraceSummary s = t.validate();
  EXPECT_EQ(s.num_steps, 3u);
  EXPECT_EQ(s.num_persistent, 4 * kTinyParamTensors);  // parameter, gradient, exp_avg(_sq)
  EXPECT_EQ(s.num_allocs, s.num_frees + s.num_persistent);
  EXPECT_EQ(s.persistent_bytes, 16 * kTinyParams);
  EXPECT_EQ(s.persistent_by_category[category_index(Category::kParameter)], 4 * kTinyParams);
  EXPECT_EQ(s.persistent_by_category[category_index(Category::kGradient)], 4 * kTinyParams);
  EXPECT_EQ(s.persistent_by_category[category_index(Category::kOptimizerState)], 8 * kTinyParams);
  for (Category c : {Category::kActivation, Category::kTemporary, Category::kInput})
    EXPECT_EQ(s.persistent_by_category[category_index(c)], 0u) << category_name(c);
  // At each later step marker only the persistent state is live: nothing leaks per step.
  const std::vector<std::size_t> live = live_before_each_op(t);
  int markers = 0;
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    if (t.ops[i].kind != TraceOpKind::kStep || t.ops[i].id == 0) continue;
    EXPECT_EQ(live[i], s.persistent_bytes) << "step " << t.ops[i].id;
    ++markers;
  }
  EXPECT_EQ(markers, 2);
  // Step peaks: step 0 lacks optimizer state during forward, so later steps peak higher.
  ASSERT_EQ(s.step_peak_live_bytes.size(), 3u);
  EXPECT_LT(s.step_peak_live_bytes[0], s.step_peak_live_bytes[1]);
  EXPECT_EQ(s.step_peak_live_bytes[1], s.step_peak_live_bytes[2]);
  EXPECT_EQ(s.peak_live_bytes, s.step_peak_live_bytes[1]);
}

TEST(GptTrace, BatchArrivesOnCopyStreamWithRecordStream) {
  const AllocTrace t = make_gpt_training_trace(tiny_spec());
  std::set<std::uint64_t> on_copy, recorded;
  for (const TraceOp& op : t.ops) {
    if (op.kind == TraceOpKind::kAlloc && op.stream == 1) {
      EXPECT_EQ(op.category, Category::kInput) << op.tag;
      on_copy.insert(op.id);
    }
    if (op.kind == TraceOpKind::kRecordStream) {
      EXPECT_EQ(op.stream, kDefaultStream);
      recorded.insert(op.id);
    }
  }
  EXPECT_EQ(on_copy.size(), 6u);  // inputs and targets, 3 steps
  EXPECT_EQ(on_copy, recorded);

  GptTraceSpec no_copy = tiny_spec();
  no_copy.use_copy_stream = false;
  for (const TraceOp& op : make_gpt_training_trace(no_copy).ops) {
    EXPECT_NE(op.kind, TraceOpKind::kRecordStream);
    if (op.kind == TraceOpKind::kAlloc) EXPECT_EQ(op.stream, kDefaultStream);
  }
}

TEST(GptTrace, Fp32HasNoWeightCastsAndFp32State) {
  GptTraceSpec spec = tiny_spec();
  spec.mixed_precision = false;
  spec.act_bytes = 4;
  const AllocTrace t = make_gpt_training_trace(spec);
  for (const TraceOp& op : t.ops)
    if (op.kind == TraceOpKind::kAlloc) EXPECT_EQ(op.tag.find(".half"), std::string::npos);
  const TraceSummary s = t.validate();
  EXPECT_EQ(s.persistent_bytes, 16 * kTinyParams);
  EXPECT_EQ(gpt_trace_bytes(spec).saved_per_block,
            16 * 2 * 8 * 16 * 4 + 2 * 4 * 8 * 8 * 4 + 16 * 2 * 8);
}

TEST(GptTrace, DeterministicAndEmptyCacheOption) {
  GptTraceSpec spec = tiny_spec();
  std::ostringstream a, b;
  write_trace(a, make_gpt_training_trace(spec));
  write_trace(b, make_gpt_training_trace(spec));
  EXPECT_EQ(a.str(), b.str());
  spec.empty_cache_after_first_step = true;
  int empties = 0;
  for (const TraceOp& op : make_gpt_training_trace(spec).ops)
    empties += op.kind == TraceOpKind::kEmptyCache;
  EXPECT_EQ(empties, 1);
}

TEST(GptTrace, BadSpecsNameTheField) {
  auto expect_bad = [](GptTraceSpec s, const char* field) {
    try {
      make_gpt_training_trace(s);
      ADD_FAILURE() << "accepted a bad " << field;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  GptTraceSpec s = tiny_spec();
  s.heads = 3;  // 16 % 3 != 0
  expect_bad(s, "hidden");
  s = tiny_spec();
  s.act_bytes = 4;  // mixed precision with FP32 activations
  expect_bad(s, "act_bytes");
  s = tiny_spec();
  s.seq_len = 9;
  expect_bad(s, "max_seq_len");
  s = tiny_spec();
  s.micro_batch = 0;
  expect_bad(s, "micro_batch");
  s = tiny_spec();
  s.copy_stream = kDefaultStream;
  expect_bad(s, "copy_stream");
  s = tiny_spec();
  s.vocab = std::int64_t{1} << 40;
  s.micro_batch = std::int64_t{1} << 20;  // B*T*V*4 overflows 64 bits
  expect_bad(s, "overflows");
}

// ---- validation of hand-made traces -------------------------------------------------------

}  // namespace
}  // namespace memfit
