// Dry run: the proof that it predicts. A dry run on the meta backend and a real Trainer step on
// the CPU backend (same AllocatorConfig, budget included) reach the same peaks byte for byte,
// for several models, dtypes, schedules, accumulation and offload; under a budget, the largest
// micro-batch the dry run admits trains within it and one more raises OutOfMemory for real.
#include "policies/dry_run.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/model.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "memory/size.h"
#include "policies/trainer.h"

namespace memfit {
namespace {

ModelSpec small_gpt() {
  ModelSpec s;
  s.name = "small-gpt";
  s.vocab = 512;
  s.seq_len = 64;
  s.layers = 3;
  s.hidden = 64;
  s.heads = 4;
  return s;
}

struct Case {
  ModelSpec spec;
  DType dtype = DType::kF32;
  std::string checkpoint = "none";
  bool offload = false;
  std::int64_t micro = 1, accum = 1, last = 0;
  std::int64_t seq_len = 0;

  std::string str() const {
    return spec.name + " " + dtype_name(dtype) + " " + checkpoint + (offload ? " offload" : "") +
           " micro " + std::to_string(micro) + " accum " + std::to_string(accum) +
           (last ? " last " + std::to_string(last) : "");
  }
  std::int64_t global() const { return last ? micro * (accum - 1) + last : micro * accum; }
  std::int64_t t() const { return seq_len ? seq_len : spec.seq_len; }
};

DryRunRequest request(const Case& c, std::size_t budget) {
  DryRunRequest q;
  q.spec = c.spec;
  q.policy = Policy{c.dtype, c.checkpoint, c.offload};
  q.schedule = Schedule::parse(c.checkpoint, static_cast<int>(c.spec.layers));
  q.micro_batch = c.micro;
  q.accum = c.accum;
  q.last_micro_batch = c.last;
  q.seq_len = c.seq_len;
  q.alloc_conf.budget = budget;
  return q;
}

// What a real run measured: the construction's peak and the step's (nullopt: OutOfMemory).
struct Measured {
  std::size_t setup_peak_reserved = 0;
  std::optional<StepResult> step;
  std::string oom;
};

Measured real_step(const Case& c, std::size_t budget) {
  CpuBackend be(CpuBackendOptions{.worker_streams = c.offload});
  HostProvider host;
  AllocatorConfig conf;
  conf.budget = budget;
  CachingAllocator alloc(host, conf, &be.stream_sync());
  LayerContext ctx{be, alloc, kDefaultStream, c.dtype};
  Measured m;
  try {
    Model model(c.spec, ctx);
    TrainerOptions o;
    o.checkpoint = c.checkpoint;
    o.micro_batch = c.micro;
    o.offload = c.offload;
    Trainer trainer(model, ctx, o);
    m.setup_peak_reserved = static_cast<std::size_t>(alloc.stats().reserved_bytes[kStatAll].peak);
    Batch b;
    b.batch = c.global();
    b.seq_len = c.t();
    const auto n = static_cast<std::size_t>(b.batch * b.seq_len);
    for (std::size_t i = 0; i < n; ++i) {
      b.tokens.push_back(static_cast<std::int32_t>((i * 7 + 3) % c.spec.vocab));
      b.targets.push_back(static_cast<std::int32_t>((i * 5 + 1) % c.spec.vocab));
    }
    m.step = trainer.step(b);
  } catch (const OutOfMemory& e) {
    m.oom = e.what();
    if (m.setup_peak_reserved == 0) {
      m.setup_peak_reserved = static_cast<std::size_t>(alloc.stats().reserved_bytes[kStatAll].peak);
    }
  }
  return m;
}

void expect_same_peaks(const Case& c, const DryRunResult& d, const Measured& m) {
  SCOPED_TRACE(c.str());
  ASSERT_TRUE(d.fits) << d.failure;
  ASSERT_TRUE(m.step.has_value()) << m.oom;
  EXPECT_EQ(d.setup_peak_reserved, m.setup_peak_reserved);
  EXPECT_EQ(d.peak_reserved, m.step->peak_reserved);
  EXPECT_EQ(d.peak_allocated, m.step->peak_allocated);
  for (std::size_t k = 0; k < kCategoryCount; ++k) {
    EXPECT_EQ(d.peak_by_category[k], m.step->peak_by_category[k])
        << category_name(static_cast<Category>(k));
  }
}

std::vector<Case> unbudgeted_cases() {
  const ModelSpec micro = ModelSpec::preset("gpt-micro");
  const ModelSpec mlp = ModelSpec::preset("mlp-tiny");
  const ModelSpec gpt = small_gpt();
  std::vector<Case> v;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const char* ck : {"none", "all", "every:2"}) {
      for (bool off : {false, true}) {
        v.push_back({gpt, dt, ck, off, 5, 3, 2, 0});
        v.push_back({micro, dt, ck, off, 3, 1, 0, 0});
      }
    }
  }
  // Accumulation past the two micro-batches the dry run runs; an uneven last one.
  v.push_back({gpt, DType::kBF16, "sqrt", false, 4, 5, 0, 32});
  v.push_back({gpt, DType::kF32, "none", true, 6, 4, 1, 0});
  v.push_back({mlp, DType::kF32, "none", false, 2, 2, 0, 32});
  v.push_back({mlp, DType::kBF16, "all", true, 3, 3, 2, 16});
  return v;
}

TEST(DryRun, PeaksEqualARealTrainerStepOnTheCpuBackend) {
  for (const Case& c : unbudgeted_cases()) {
    const DryRunResult d = dry_run(request(c, 0));
    expect_same_peaks(c, d, real_step(c, 0));
  }
}

// The proof: under a budget, the largest micro-batch the dry run admits trains within the
// budget with the predicted peak, and one more sample raises OutOfMemory for real.
TEST(DryRun, AtTheLargestFittingMicroBatchARealStepFitsAndOneMoreDoesNot) {
  struct Proof {
    Case c;
    std::int64_t seed_micro;  // the budget is this micro-batch's unbudgeted peak + 1.5 MiB
  };
  const ModelSpec micro = ModelSpec::preset("gpt-micro");
  const ModelSpec mlp = ModelSpec::preset("mlp-tiny");
  const ModelSpec gpt = small_gpt();
  const std::vector<Proof> proofs = {
      {{micro, DType::kF32, "none", false, 1, 2, 0, 0}, 24},
      {{micro, DType::kBF16, "all", true, 1, 1, 0, 0}, 40},
      {{gpt, DType::kF32, "none", false, 1, 2, 0, 0}, 6},
      {{gpt, DType::kBF16, "all", false, 1, 3, 0, 0}, 12},
      {{gpt, DType::kBF16, "all", false, 1, 6, 0, 0}, 12},  // past the settling micro-batches
      {{gpt, DType::kF16, "every:2", true, 1, 1, 0, 0}, 9},
      {{gpt, DType::kBF16, "none", true, 1, 2, 0, 0}, 5},
      {{mlp, DType::kF32, "all", false, 1, 1, 0, 32}, 3},
      {{mlp, DType::kBF16, "sqrt", true, 1, 1, 0, 32}, 3},
  };
  std::printf("%-40s %10s %6s %14s %14s %8s\n", "case", "budget", "max", "predicted", "measured",
              "ratio");
  for (const Proof& p : proofs) {
    Case c = p.c;
    c.micro = p.seed_micro;
    const std::size_t budget = dry_run(request(c, 0)).peak_reserved + (std::size_t{3} << 19);
    // Largest fitting micro-batch by the dry run (a scan up from 1: these are small).
    std::int64_t max = 0;
    DryRunResult at_max;
    for (std::int64_t b = 1; b <= 4 * p.seed_micro + 64; ++b) {
      c.micro = b;
      const DryRunResult d = dry_run(request(c, budget));
      if (!d.fits) break;
      max = b;
      at_max = d;
    }
    c.micro = max;
    SCOPED_TRACE(c.str() + " budget " + std::to_string(budget));
    ASSERT_GE(max, p.seed_micro);
    ASSERT_LT(max, 4 * p.seed_micro + 64) << "the scan never found a micro-batch that fails";
    const Measured fit = real_step(c, budget);
    ASSERT_TRUE(fit.step.has_value()) << fit.oom;
    EXPECT_LE(fit.step->peak_reserved, budget);
    EXPECT_EQ(fit.step->peak_reserved, at_max.peak_reserved);  // within 1% asked; exact here
    EXPECT_EQ(fit.setup_peak_reserved, at_max.setup_peak_reserved);
    std::printf("%-40s %10s %6lld %14zu %14zu %8.5f\n", c.str().c_str(),
                format_bytes(budget).c_str(), static_cast<long long>(max), at_max.peak_reserved,
                fit.step->peak_reserved,
                static_cast<double>(fit.step->peak_reserved) / at_max.peak_reserved);
    c.micro = max + 1;
    const DryRunResult over = dry_run(request(c, budget));
    EXPECT_FALSE(over.fits);
    EXPECT_GT(over.failed_request, 0u);
    const Measured oom = real_step(c, budget);
    EXPECT_FALSE(oom.step.has_value()) << "a real step at max + 1 fitted";
    EXPECT_FALSE(oom.oom.empty());
  }
}

TEST(DryRun, WorkCountsCoverEveryMicroBatchAndTheUnevenLastOne) {
  Case c{small_gpt(), DType::kBF16, "all", false, 4, 1, 0, 0};
  const DryRunResult one = dry_run(request(c, 0));
  c.accum = 5;
  const DryRunResult five = dry_run(request(c, 0));
  EXPECT_GT(one.gemm_flops, 0);
  EXPECT_DOUBLE_EQ(five.gemm_flops, 5 * one.gemm_flops);
  EXPECT_GT(five.bytes_moved, 4 * one.bytes_moved);
  Case l{small_gpt(), DType::kBF16, "all", false, 1, 1, 0, 0};
  const DryRunResult single = dry_run(request(l, 0));
  c.accum = 3;
  c.last = 1;
  const DryRunResult uneven = dry_run(request(c, 0));
  EXPECT_DOUBLE_EQ(uneven.gemm_flops, 2 * one.gemm_flops + single.gemm_flops);
  // Accumulating changes no peak: the gradients are there either way.
  EXPECT_EQ(five.peak_reserved, one.peak_reserved);
}

TEST(DryRun, OffloadKeepsNoOptimizerStateOnTheDeviceDuringTheStep) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Case c{small_gpt(), dt, "none", false, 4, 1, 0, 0};
    const DryRunResult on_device = dry_run(request(c, 0));
    c.offload = true;
    const DryRunResult off = dry_run(request(c, 0));
    const auto opt = category_index(Category::kOptimizerState);
    EXPECT_GT(on_device.peak_by_category[opt], 0u);
    EXPECT_EQ(off.peak_by_category[opt], 0u);
    EXPECT_LT(off.peak_allocated, on_device.peak_allocated);
  }
}

TEST(DryRun, ABudgetBelowTheWeightsFailsInSetupWithTheRequest) {
  Case c{small_gpt(), DType::kF32, "none", false, 1, 1, 0, 0};
  const DryRunResult d = dry_run(request(c, 1 << 20));  // below one 2 MiB small segment
  EXPECT_FALSE(d.fits);
  EXPECT_GT(d.failed_request, 0u);
  EXPECT_NE(d.failure.find("out of memory"), std::string::npos) << d.failure;
  EXPECT_EQ(d.peak_reserved, 0u);  // the step never started
}

TEST(DryRun, BadRequestsAreClearErrors) {
  const Case c{small_gpt(), DType::kF32, "none", false, 2, 2, 0, 0};
  auto expect_bad = [](DryRunRequest q, const std::string& needle) {
    try {
      (void)dry_run(q);
      ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  DryRunRequest q = request(c, 0);
  q.micro_batch = 0;
  expect_bad(q, "micro_batch 0");
  q = request(c, 0);
  q.accum = 0;
  expect_bad(q, "accum 0");
  q = request(c, 0);
  q.seq_len = 65;
  expect_bad(q, "seq_len 65");
  q = request(c, 0);
  q.last_micro_batch = 3;
  expect_bad(q, "last_micro_batch 3");
  q = request(c, 0);
  q.accum = 1;
  q.last_micro_batch = 1;
  expect_bad(q, "needs accum >= 2");
  q = request(c, 0);
  q.schedule = Schedule::none(5);
  EXPECT_THROW((void)dry_run(q), InvalidArgument);
}

}  // namespace
}  // namespace memfit
