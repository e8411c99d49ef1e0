// Executor: every schedule gives the bits of no checkpointing; memory per schedule; the meta
// dry run sees what the CPU run allocates; OOM mid-run leaves nothing behind.
#include "core/executor.h"

#include <gtest/gtest.h>

#include <sstream>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/layers/linear.h"
#include "memory/error.h"
#include "memory/fault_injecting_provider.h"
#include "tests/core/exec_testutil.h"

namespace memfit {
namespace {

using testing::activation_bytes_now;
using testing::Batch;
using testing::bytes_of;
using testing::Rig;

// 6 blocks, small enough to run every schedule in milliseconds.
ModelSpec six_blocks(ModelSpec::Kind kind = ModelSpec::Kind::kGpt, bool qk_norm = false) {
  // llama: llama-micro's blocks (grouped-query rotary attention, SwiGLU) with q/k/v biases, or
  // with Qwen3's q/k norms instead.
  ModelSpec s = ModelSpec::preset(kind == ModelSpec::Kind::kLlama ? "llama-micro" : "gpt-micro");
  s.kind = kind;
  s.layers = 6;
  if (kind == ModelSpec::Kind::kLlama) s.qkv_bias = !qk_norm;
  s.qk_norm = qk_norm;
  return s;
}

// The bits a run leaves: the losses, then every gradient.
struct Result {
  std::vector<unsigned char> losses;
  std::vector<std::vector<unsigned char>> grads;
};

Result run_once(Executor& ex, Model& m, const Schedule& s, const MicroBatch& mb, float dloss) {
  LayerContext& ctx = ex.context();
  m.zero_grad(ctx);
  Act losses = ex.run(s, mb, dloss);
  ctx.backend.synchronize(ctx.stream);
  Result r;
  r.losses = bytes_of(losses->view());
  for (Parameter* p : m.parameters()) r.grads.push_back(bytes_of(p->grad.view()));
  return r;
}

void expect_same_bits(const Result& want, const Result& got, Model& m, const std::string& what) {
  EXPECT_EQ(want.losses, got.losses) << what << ": losses differ";
  const auto params = m.parameters();
  ASSERT_EQ(want.grads.size(), got.grads.size());
  for (std::size_t i = 0; i < want.grads.size(); ++i) {
    EXPECT_EQ(want.grads[i], got.grads[i]) << what << ": grad of " << params[i]->name;
  }
}

void check_schedules_bit_identical(ModelSpec::Kind kind, DType dt, LossMode loss = LossMode::kWhole,
                                   bool qk_norm = false) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(dt);
  Model m(six_blocks(kind, qk_norm), ctx);
  m.init(11, ctx);
  m.head().set_loss(loss);
  Batch batch(rig, 2, 16, m.spec().vocab, 1);
  Executor ex(m, ctx);
  const float dloss = 1.0f / 32;
  const Result ref = run_once(ex, m, Schedule::none(6), batch.mb, dloss);
  // A gradient that is all zero would make the comparison vacuous.
  bool nonzero = false;
  for (unsigned char c : ref.grads[2]) nonzero = nonzero || c != 0;
  ASSERT_TRUE(nonzero);
  for (const char* spec : {"all", "every:2", "every:3", "sqrt", "every:6"}) {
    const Schedule s = Schedule::parse(spec, 6);
    expect_same_bits(ref, run_once(ex, m, s, batch.mb, dloss), m, spec);
    EXPECT_EQ(ex.stats().recomputes, s.recomputed_forwards()) << spec;
    EXPECT_EQ(ex.stats().backwards, 6) << spec;
  }
  std::mt19937 rng(99);
  for (int trial = 0; trial < 12; ++trial) {
    const Schedule s = testing::random_schedule(6, rng);
    expect_same_bits(ref, run_once(ex, m, s, batch.mb, dloss), m, s.str());
    EXPECT_FALSE(m.any_saved());
  }
}

TEST(Executor, SchedulesBitIdenticalF32) {
  check_schedules_bit_identical(ModelSpec::Kind::kGpt, DType::kF32);
}
TEST(Executor, SchedulesBitIdenticalBF16) {
  check_schedules_bit_identical(ModelSpec::Kind::kGpt, DType::kBF16);
}
TEST(Executor, SchedulesBitIdenticalMlpF16) {
  check_schedules_bit_identical(ModelSpec::Kind::kMlp, DType::kF16);
}
TEST(Executor, SchedulesBitIdenticalLlamaF32ChunkedLoss) {
  check_schedules_bit_identical(ModelSpec::Kind::kLlama, DType::kF32, LossMode::kChunked);
}
TEST(Executor, SchedulesBitIdenticalLlamaBF16) {
  check_schedules_bit_identical(ModelSpec::Kind::kLlama, DType::kBF16);
}
TEST(Executor, SchedulesBitIdenticalQwen3QkNormBF16) {
  check_schedules_bit_identical(ModelSpec::Kind::kLlama, DType::kBF16, LossMode::kChunked, true);
}

TEST(Executor, UserChainUnderCheckpointing) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  std::vector<std::unique_ptr<Layer>> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(std::make_unique<Linear>("lin." + std::to_string(i), 32, 32));
  }
  Model m(ModelSpec::preset("gpt-micro"), std::move(blocks), ctx);
  m.init(5, ctx);
  Batch batch(rig, 2, 16, 64, 2);
  Executor ex(m, ctx);
  const Result ref = run_once(ex, m, Schedule::none(4), batch.mb, 0.5f);
  expect_same_bits(ref, run_once(ex, m, Schedule::all(4), batch.mb, 0.5f), m, "all");
}

TEST(Executor, StatsHooksAndNothingLeft) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  Model m(six_blocks(), ctx);
  m.init(1, ctx);
  Batch batch(rig, 2, 16, 64, 3);
  Executor ex(m, ctx);
  std::vector<std::string> calls;
  ExecutorHooks hooks;
  hooks.before_stage = [&](int s) { calls.push_back("<" + std::to_string(s)); };
  hooks.after_stage = [&](int s) { calls.push_back(std::to_string(s) + ">"); };
  Act losses = ex.run(Schedule::every(6, 2), batch.mb, 1.0f, hooks);
  // Model::backward_stages()' numbering: 0 the head, 1..6 blocks 5..0, 7 the embedding.
  std::vector<std::string> want_calls;
  for (int s = 0; s <= 7; ++s) {
    want_calls.push_back("<" + std::to_string(s));
    want_calls.push_back(std::to_string(s) + ">");
  }
  EXPECT_EQ(calls, want_calls);
  const std::vector<Model::BackwardStage> stages = m.backward_stages();
  ASSERT_EQ(stages.size(), 8u);
  EXPECT_EQ(stages[0].final, m.head_parameters());
  EXPECT_EQ(stages[1].final, m.block_parameters(5));
  EXPECT_EQ(stages[6].final, m.block_parameters(0));
  EXPECT_EQ(stages[7].final, m.embedding_parameters());
  // Each parameter is final in exactly one stage, and written by the stage it is final in.
  std::map<const Parameter*, int> finals;
  for (const Model::BackwardStage& st : stages) {
    for (const Parameter* p : st.final) {
      ++finals[p];
      EXPECT_NE(std::find(st.writes.begin(), st.writes.end(), p), st.writes.end()) << p->name;
    }
  }
  EXPECT_EQ(finals.size(), m.parameters().size());
  for (const auto& [p, n] : finals) EXPECT_EQ(n, 1) << p->name;
  // F0..F5, then R0..R3: the last segment (blocks 4, 5) keeps all and is not recomputed.
  EXPECT_EQ(ex.stats().forwards, 10);
  EXPECT_EQ(ex.stats().recomputes, 4);
  // x[0], x[2] (checkpoints) and the latest output.
  EXPECT_EQ(ex.stats().max_held_inputs, 3);
  EXPECT_FALSE(m.any_saved());
  // Only the returned losses are left.
  EXPECT_EQ(activation_bytes_now(*rig.alloc),
            static_cast<std::int64_t>(rig.alloc->round_size(losses->view().nbytes())));
  const double sum = sum_losses(ctx, losses->view());
  double want = 0;
  for (float v : testing::to_host(ctx, losses->view())) want += v;
  EXPECT_EQ(sum, want);
  EXPECT_GT(sum, 0.0);
  losses.reset();
  EXPECT_EQ(activation_bytes_now(*rig.alloc), 0);

  ex.run(Schedule::all(6), batch.mb, 1.0f);
  EXPECT_EQ(ex.stats().max_held_inputs, 7);  // x[0..6] before the head takes x[6]
  ex.run(Schedule::none(6), batch.mb, 1.0f);
  EXPECT_EQ(ex.stats().max_held_inputs, 1);
  EXPECT_EQ(ex.stats().recomputes, 0);
  EXPECT_EQ(activation_bytes_now(*rig.alloc), 0);
}

// The use hooks bracket every run of ops on one weight unit, in weight_uses() order, each told
// the unit after it; every op that reads a unit's weights runs inside its use.
TEST(Executor, UseHooksFollowWeightUses) {
  // Units: 0 embedding, 1 + i block i, 4 the head (3 blocks).
  EXPECT_EQ(weight_uses(Schedule::none(3), 3), (std::vector<int>{0, 1, 2, 3, 4, 3, 2, 1, 0}));
  // Each recompute merges with the backward right after it.
  EXPECT_EQ(weight_uses(Schedule::all(3), 3), (std::vector<int>{0, 1, 2, 3, 4, 3, 2, 1, 0}));
  // every:2 on 3 blocks: F0:input F1:nothing F2:all, head, B2, R0 R1 B1 B0.
  EXPECT_EQ(weight_uses(Schedule::every(3, 2), 3),
            (std::vector<int>{0, 1, 2, 3, 4, 3, 1, 2, 1, 0}));

  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  Model m(six_blocks(), ctx);
  m.init(1, ctx);
  const auto units = m.weight_units();
  ASSERT_EQ(units.size(), 8u);
  EXPECT_EQ(units[0], m.embedding_parameters());
  EXPECT_EQ(units[3], m.block_parameters(2));
  // The head reads its own parameters and, tied, the embedding's wte.
  ASSERT_TRUE(m.spec().tied_head);
  EXPECT_EQ(units[7].size(), m.head_parameters().size() + 1);
  EXPECT_EQ(units[7].back(), &m.embedding().wte());
  Batch batch(rig, 2, 16, 64, 3);
  Executor ex(m, ctx);
  for (const Schedule& sch : {Schedule::none(6), Schedule::every(6, 2), Schedule::all(6)}) {
    std::vector<int> seen, nexts;
    int open = -1;
    ExecutorHooks hooks;
    hooks.before_use = [&](int u, int next) {
      EXPECT_EQ(open, -1) << "a use opened inside another";
      open = u;
      seen.push_back(u);
      nexts.push_back(next);
    };
    hooks.after_use = [&](int u) {
      EXPECT_EQ(open, u);
      open = -1;
    };
    hooks.before_stage = [&](int s) {
      // The head's stage (0) runs in the head's use, stage 1 + k in block 5 - k's.
      EXPECT_EQ(open, s == 0 ? 7 : s == 7 ? 0 : 1 + (6 - s)) << sch.str();
    };
    ex.run(sch, batch.mb, 1.0f, hooks);
    EXPECT_EQ(open, -1);
    const std::vector<int> want = weight_uses(sch, 6);
    EXPECT_EQ(seen, want) << sch.str();
    for (std::size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(nexts[k], k + 1 < want.size() ? want[k + 1] : -1) << sch.str() << " use " << k;
    }
    // forward_only: each unit once, in order.
    seen.clear();
    nexts.clear();
    (void)ex.forward_only(batch.mb, hooks);
    EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
    EXPECT_EQ(nexts.back(), -1);
  }
}

// The stash hooks see every checkpoint once its forward is queued and give it back before the
// op that reads it, in checkpoint_reads() order, each told the one after it; a hook that takes
// the handle and returns a fresh copy changes no bit, and one that leaves it changes nothing.
// Which forwards run for their backward only: a keep-all forward whose output is not stored.
TEST(Executor, ForwardsForBackwardAreTheKeepAllsWhoseOutputIsNotStored) {
  const auto ops_of = [](const Schedule& s, const std::vector<char>& v) {
    std::istringstream words(s.str());  // one word per op, in order
    std::string out, w;
    for (std::size_t j = 0; j < v.size() && words >> w; ++j) {
      if (v[j]) out += w + " ";
    }
    return out;
  };
  // none: every forward keeps all and feeds the next one, or the head.
  const Schedule none = Schedule::none(3);
  EXPECT_EQ(ops_of(none, forwards_for_backward(none, 3)), "");
  // all: each block recomputed right before its backward: x[i+1] is read by nothing later.
  const Schedule all = Schedule::all(3);
  EXPECT_EQ(ops_of(all, forwards_for_backward(all, 3)), "R2:all R1:all R0:all ");
  // R0:all feeds R1:all (stored: full forward); R1:all's output x[2] is read by nothing.
  const Schedule chain = Schedule::parse("F0:input F1:nothing F2:all B2 R0:all R1:all B1 B0", 3);
  EXPECT_EQ(ops_of(chain, forwards_for_backward(chain, 3)), "R1:all ");
  // An output already held is not stored again: R0:all while x[1] is still a checkpoint.
  const Schedule held = Schedule::parse("F0:input F1:input F2:all B2 R0:all R1:all B1 B0", 3);
  EXPECT_EQ(ops_of(held, forwards_for_backward(held, 3)), "R0:all R1:all ");
  // Every schedule: the op list agrees with outputs_read_later where nothing is held twice.
  for (const Schedule& s : {Schedule::sqrt_n(6), Schedule::every(6, 2), Schedule::all(6)}) {
    const std::vector<char> read = outputs_read_later(s, 6);
    const std::vector<char> fb = forwards_for_backward(s, 6);
    for (std::size_t j = 0; j < fb.size(); ++j) {
      const ScheduleOp& op = s.ops()[j];
      if (fb[j]) EXPECT_EQ(op.keep, Keep::kAll) << s.str();
      if (op.kind == ScheduleOp::Kind::kForward && op.keep == Keep::kAll && !read[j]) {
        EXPECT_TRUE(fb[j]) << s.str() << " op " << j;
      }
    }
  }
}

TEST(Executor, StashHooksFollowCheckpointReads) {
  EXPECT_TRUE(checkpoint_reads(Schedule::none(3), 3).empty());
  EXPECT_EQ(checkpoint_reads(Schedule::all(3), 3), (std::vector<int>{2, 1, 0}));
  // every:2 on 4 blocks: the last segment (blocks 2, 3) keeps all, so x[0] is the checkpoint.
  EXPECT_EQ(checkpoint_reads(Schedule::every(4, 2), 4), (std::vector<int>{0}));
  EXPECT_EQ(checkpoint_reads(Schedule::every(6, 2), 6), (std::vector<int>{2, 0}));
  EXPECT_TRUE(checkpoint_reads(Schedule::every(4, 4), 4).empty());
  // A nested schedule: the recomputation of block 0 keeps its input again for a later one.
  const Schedule nested = Schedule::parse("F0:input F1:input R1:all B1 R0:input R0:all B0", 2);
  EXPECT_EQ(checkpoint_reads(nested, 2), (std::vector<int>{1, 0, 0}));

  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kBF16);
  Model m(six_blocks(), ctx);
  m.init(5, ctx);
  Batch batch(rig, 2, 16, m.spec().vocab, 2);
  Executor ex(m, ctx);
  const float dloss = 1.0f / 32;
  for (const char* spec : {"none", "all", "every:2", "every:4"}) {
    const Schedule sch = Schedule::parse(spec, 6);
    const Result want = run_once(ex, m, sch, batch.mb, dloss);
    for (bool take : {true, false}) {
      std::map<int, Act> held;
      std::vector<int> puts, reads, nexts;
      ExecutorHooks hooks;
      hooks.stash = [&](int i, Act& x) {
        puts.push_back(i);
        if (!take) return;
        EXPECT_EQ(x.use_count(), 1) << "slot " << i;
        EXPECT_EQ(held.count(i), 0u) << "slot " << i << " stashed twice";
        held[i] = std::move(x);
      };
      hooks.unstash = [&](int i, int next) {
        reads.push_back(i);
        nexts.push_back(next);
        EXPECT_EQ(held.count(i), 1u) << "slot " << i << " read but not stashed";
        // A fresh tensor with the same bits, as a fetch from the host gives.
        const Act& old = held[i];
        Act copy =
            ctx.make(old->view().shape(), old->view().dtype(), Category::kActivation, "fetched");
        ctx.backend.copy(ctx.stream, old->view(), copy->view());
        held.erase(i);
        return copy;
      };
      m.zero_grad(ctx);
      Act losses = ex.run(sch, batch.mb, dloss, hooks);
      ctx.backend.synchronize(ctx.stream);
      Result got;
      got.losses = bytes_of(losses->view());
      for (Parameter* p : m.parameters()) got.grads.push_back(bytes_of(p->grad.view()));
      expect_same_bits(want, got, m, std::string(spec) + (take ? " taken" : " left"));
      EXPECT_TRUE(held.empty()) << spec;
      const std::vector<int> order = checkpoint_reads(sch, 6);
      EXPECT_EQ(ex.stats().stashed, take ? static_cast<std::int64_t>(order.size()) : 0) << spec;
      EXPECT_EQ(puts.size(), order.size()) << spec;
      if (!take) {
        EXPECT_TRUE(reads.empty()) << spec;
        continue;
      }
      EXPECT_EQ(reads, order) << spec;
      for (std::size_t k = 0; k < order.size(); ++k) {
        EXPECT_EQ(nexts[k], k + 1 < order.size() ? order[k + 1] : -1) << spec << " read " << k;
      }
    }
  }
  ExecutorHooks half;
  half.stash = [](int, Act&) {};
  EXPECT_THROW((void)ex.run(Schedule::all(6), batch.mb, dloss, half), InvalidArgument);
}

TEST(Executor, ForwardOnlyMatchesRun) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kBF16);
  Model m(six_blocks(), ctx);
  m.init(2, ctx);
  Batch batch(rig, 3, 16, 64, 4);
  Executor ex(m, ctx);
  Act a = ex.forward_only(batch.mb);
  EXPECT_FALSE(m.any_saved());
  Act b = ex.run(Schedule::every(6, 3), batch.mb, 1.0f);
  EXPECT_EQ(bytes_of(a->view()), bytes_of(b->view()));
  a.reset();
  b.reset();
  EXPECT_EQ(activation_bytes_now(*rig.alloc), 0);
}

TEST(Executor, BadInputChangesNothing) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  Model m(six_blocks(), ctx);
  m.init(2, ctx);
  Batch batch(rig, 2, 16, 64, 4);
  Executor ex(m, ctx);
  EXPECT_THROW(ex.run(Schedule::none(5), batch.mb, 1.0f), InvalidArgument);
  MicroBatch bad = batch.mb;
  bad.targets.shape = Shape{2, 8};
  EXPECT_THROW(ex.run(Schedule::none(6), bad, 1.0f), InvalidArgument);
  // T beyond seq_len: the embedding refuses, nothing is left held.
  Batch longer(rig, 1, 32, 64, 4);
  EXPECT_THROW(ex.run(Schedule::none(6), longer.mb, 1.0f), InvalidArgument);
  EXPECT_EQ(activation_bytes_now(*rig.alloc), 0);
  EXPECT_FALSE(m.any_saved());
}

// Peak of allocated bytes during one run, above what was allocated before it.
struct Peaks {
  std::int64_t allocated = 0;   // all bytes, above what was allocated before the run
  std::int64_t activation = 0;  // Category::kActivation
};

Peaks run_peak(Rig& rig, Executor& ex, const Schedule& s, const MicroBatch& mb) {
  rig.alloc->reset_peak_stats();
  const std::int64_t before = rig.alloc->stats().allocated_bytes[kStatAll].current;
  ex.run(s, mb, 1.0f);
  const AllocatorStats st = rig.alloc->stats();
  return {st.allocated_bytes[kStatAll].peak - before,
          st.category_bytes[static_cast<int>(Category::kActivation)].peak};
}

TEST(Executor, CheckpointingLowersThePeak) {
  Rig rig(false);
  LayerContext ctx = rig.ctx(DType::kF32);
  ModelSpec s = six_blocks();
  s.seq_len = 64;  // attention's (T,T) scores make the saved state large against x
  Model m(s, ctx);
  m.init(1, ctx);
  Batch batch(rig, 4, 64, 64, 5);
  Executor ex(m, ctx);
  const Peaks none = run_peak(rig, ex, Schedule::none(6), batch.mb);
  const Peaks every2 = run_peak(rig, ex, Schedule::every(6, 2), batch.mb);
  const Peaks all = run_peak(rig, ex, Schedule::all(6), batch.mb);
  std::printf(
      "6 blocks, C=32, B=4, T=64, f32: peak above the model none / every:2 / all: allocated "
      "%lld / %lld / %lld, activation %lld / %lld / %lld bytes\n",
      static_cast<long long>(none.allocated), static_cast<long long>(every2.allocated),
      static_cast<long long>(all.allocated), static_cast<long long>(none.activation),
      static_cast<long long>(every2.activation), static_cast<long long>(all.activation));
  EXPECT_LT(all.allocated, every2.allocated);
  EXPECT_LT(every2.allocated, none.allocated);
  EXPECT_LT(all.activation, every2.activation);
  EXPECT_LT(every2.activation, none.activation);
  // Checkpointing every block keeps at most ~1/3 of no checkpointing's activations here.
  EXPECT_LT(3 * all.activation, none.activation);
  EXPECT_EQ(activation_bytes_now(*rig.alloc), 0);
}

// The planner's premise: the meta dry run through the same allocator sees the same bytes.
void check_meta_matches_cpu(const ModelSpec& spec, DType dt, const char* sched, std::int64_t b) {
  std::vector<AllocatorStats> stats;
  for (bool meta : {false, true}) {
    Rig rig(meta);
    LayerContext ctx = rig.ctx(dt);
    Model m(spec, ctx);
    m.init(1, ctx);
    Batch batch(rig, b, spec.seq_len, spec.vocab, 6);
    Executor ex(m, ctx);
    for (int step = 0; step < 2; ++step) {  // the second step runs on cached segments
      m.zero_grad(ctx);
      Act losses = ex.run(Schedule::parse(sched, m.num_blocks()), batch.mb, 1.0f / 64);
      EXPECT_EQ(sum_losses(ctx, losses->view()) == 0.0, meta);
    }
    stats.push_back(rig.alloc->stats());
  }
  const AllocatorStats& c = stats[0];
  const AllocatorStats& mt = stats[1];
  const std::string what = std::string(sched) + " " + dtype_name(dt);
  EXPECT_EQ(c.allocated_bytes[kStatAll].peak, mt.allocated_bytes[kStatAll].peak) << what;
  EXPECT_EQ(c.reserved_bytes[kStatAll].peak, mt.reserved_bytes[kStatAll].peak) << what;
  EXPECT_EQ(c.allocation[kStatAll].allocated, mt.allocation[kStatAll].allocated) << what;
  for (std::size_t k = 0; k < kCategoryCount; ++k) {
    EXPECT_EQ(c.category_bytes[k].peak, mt.category_bytes[k].peak)
        << what << " category " << category_name(static_cast<Category>(k));
  }
}

TEST(Executor, MetaDryRunPredictsTheCpuPeak) {
  // CpuBackend's GEMM scratch comes from its own pool by default (not the allocator), as the
  // meta backend allocates none: both runs make exactly the layers' allocations.
  for (const char* sched : {"none", "all", "every:2"}) {
    check_meta_matches_cpu(six_blocks(), DType::kF32, sched, 2);
    check_meta_matches_cpu(six_blocks(), DType::kBF16, sched, 2);
  }
  check_meta_matches_cpu(six_blocks(ModelSpec::Kind::kMlp), DType::kF16, "sqrt", 3);
}

// B=8, T=384, bf16: a block saves ~5.7 MiB (gpt-micro's 7c + 2f + 16T + the lse rows; flash
// attention keeps no scores) at little arithmetic, so a run needs several 2 MiB segments and limits
// can fall between its allocations.
ModelSpec long_model() {
  ModelSpec s = six_blocks();
  s.seq_len = 384;
  return s;
}

TEST(Executor, OutOfMemoryMidRunLeavesNothing) {
  for (bool provider_limit : {false, true}) {
    HostProvider host;
    FaultInjectingProvider faulty(host);
    Rig rig(false, {}, &faulty);
    LayerContext ctx = rig.ctx(DType::kBF16);
    Model m(long_model(), ctx);
    m.init(7, ctx);
    Batch batch(rig, 8, 384, 64, 8);
    Executor ex(m, ctx);
    // Both segments of 3 blocks recomputed keeping all (~17 MiB at once each), so the peak is in
    // the backward phase. (every:3 keeps blocks 3-5 in the forward instead: its peak is there.)
    const Schedule s = Schedule::parse(
        "F0:input F1:nothing F2:nothing F3:input F4:nothing F5:nothing "
        "R3:all R4:all R5:all B5 B4 B3 R0:all R1:all R2:all B2 B1 B0",
        6);
    const Result ref = run_once(ex, m, s, batch.mb, 0.25f);
    std::vector<std::vector<unsigned char>> weights;
    for (Parameter* p : m.parameters()) {
      weights.push_back(bytes_of(p->weight.view()));
      weights.push_back(bytes_of(p->master.view()));
    }
    // Limits from the model's own segments upwards, in 1 MiB steps: each run fails at a later
    // point, until one succeeds.
    std::vector<std::pair<std::int64_t, std::int64_t>> failed_at;  // (forwards, backwards) done
    bool succeeded = false;
    for (std::size_t extra = 0; extra <= (std::size_t{64} << 20); extra += std::size_t{1} << 20) {
      rig.alloc->empty_cache();
      const std::size_t limit = faulty.bytes_in_use() + extra;
      if (provider_limit) {
        faulty.set_byte_limit(limit);
      } else {
        rig.alloc->set_budget(limit);
      }
      try {
        m.zero_grad(ctx);
        Act losses = ex.run(s, batch.mb, 0.25f);
        succeeded = true;
        break;
      } catch (const OutOfMemory&) {
        failed_at.emplace_back(ex.stats().forwards, ex.stats().backwards);
      }
      EXPECT_EQ(activation_bytes_now(*rig.alloc), 0) << extra;
      EXPECT_FALSE(m.any_saved());
      std::size_t k = 0;
      for (Parameter* p : m.parameters()) {
        ASSERT_EQ(bytes_of(p->weight.view()), weights[k++]) << p->name;
        ASSERT_EQ(bytes_of(p->master.view()), weights[k++]) << p->name;
      }
    }
    EXPECT_TRUE(succeeded);
    // Failures at several points, some of them mid-run (after forwards or in the backward).
    std::sort(failed_at.begin(), failed_at.end());
    failed_at.erase(std::unique(failed_at.begin(), failed_at.end()), failed_at.end());
    EXPECT_GE(failed_at.size(), 3u);
    ASSERT_FALSE(failed_at.empty());
    EXPECT_GT(failed_at.back().first, 6) << "no failure in the recomputations";
    std::printf("%s: OOM at %zu distinct points, the latest after %lld forwards, %lld backwards\n",
                provider_limit ? "provider limit" : "allocator budget", failed_at.size(),
                static_cast<long long>(failed_at.back().first),
                static_cast<long long>(failed_at.back().second));
    faulty.set_byte_limit(0);
    rig.alloc->set_budget(0);
    expect_same_bits(ref, run_once(ex, m, s, batch.mb, 0.25f), m, "after OOM");
  }
}

// The figure for the report: gpt-tiny at B=4, activation + temporary peak per schedule, from
// the meta dry run (which MetaDryRunPredictsTheCpuPeak ties to the CPU run).
TEST(Executor, GptTinyActivationPeaks) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<std::int64_t> peaks;
    for (const char* sched : {"none", "every:2", "sqrt", "all"}) {
      Rig rig(true);
      LayerContext ctx = rig.ctx(dt);
      Model m(ModelSpec::preset("gpt-tiny"), ctx);
      Batch batch(rig, 4, 128, 256, 1);
      Executor ex(m, ctx);
      rig.alloc->reset_peak_stats();
      ex.run(Schedule::parse(sched, 6), batch.mb, 1.0f);
      const AllocatorStats st = rig.alloc->stats();
      const std::int64_t act = st.category_bytes[static_cast<int>(Category::kActivation)].peak;
      const std::int64_t tmp = st.category_bytes[static_cast<int>(Category::kTemporary)].peak;
      std::printf(
          "gpt-tiny B=4 %s %-8s activation peak %9lld  temporary peak %9lld  "
          "allocated peak %9lld\n",
          dtype_name(dt), sched, static_cast<long long>(act), static_cast<long long>(tmp),
          static_cast<long long>(st.allocated_bytes[kStatAll].peak));
      peaks.push_back(st.allocated_bytes[kStatAll].peak);
    }
    EXPECT_GT(peaks[0], peaks[1]);
    EXPECT_GT(peaks[1], peaks[3]);
  }
}

}  // namespace
}  // namespace memfit
