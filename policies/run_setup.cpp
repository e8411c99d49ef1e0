#include "policies/run_setup.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "memory/check.h"
#include "memory/size.h"
#include "policies/dry_run.h"
#include "profiler/scoped_range.h"

#if MEMFIT_HAVE_CUDA
#include "profiler/cuda/cupti_tracer.h"
#endif

namespace memfit {

// ---- the budget diagnosis -----------------------------------------------------------------

BudgetDiagnosis diagnose_budget(const RunSpec& spec, const std::string& failure) {
  BudgetDiagnosis d;
  d.budget = spec.alloc.budget;
  d.failure = failure;
  auto unbudgeted = [](RunSpec s) {
    s.alloc.budget = 0;
    return dry_run(s).need_reserved();
  };
  try {
    d.need = unbudgeted(spec);
    using Change = BudgetDiagnosis::Change;
    auto add = [&](Change c, std::string label, auto change) {
      RunSpec s = spec;
      change(s.trainer.policy);
      const std::size_t need = unbudgeted(s);
      d.alternatives.push_back({c, std::move(label), s, need, need <= d.budget});
    };
    const MemoryPolicy& p = spec.trainer.policy;
    if (p.checkpoint.kind() != Checkpointing::Kind::kAll) {
      add(Change::kCheckpointAll, "checkpoint all",
          [](MemoryPolicy& q) { q.checkpoint = Checkpointing::all(); });
    }
    const std::int64_t mb = std::max<std::int64_t>(1, spec.batch / 4);
    if (spec.batch > 1) {
      add(Change::kMicroBatch, "micro-batch " + std::to_string(mb), [mb](MemoryPolicy& q) {
        q.micro_batch = mb;
        q.accum = 0;
      });
    }
    const bool f32 = p.dtype == DType::kF32;
    // The spec's dtype is the model's: a bf16 model is another RunSpec, dry-run the same way.
    if (f32) add(Change::kBF16, "bf16", [](MemoryPolicy& q) { q.dtype = DType::kBF16; });
    const OffloadSwitches everything{.optimizer = true, .gradients = true, .weights = true};
    if (!(p.offload.gradients && p.offload.weights)) {
      add(Change::kOffload, "optimizer, gradient and weight offload",
          [&](MemoryPolicy& q) { q.offload = everything; });
    }
    add(Change::kAllOfThese, "all of these", [&](MemoryPolicy& q) {
      q.checkpoint = Checkpointing::all();
      q.micro_batch = 1;
      q.accum = 0;
      if (f32) q.dtype = DType::kBF16;
      q.offload = everything;
    });
  } catch (const Error& e) {
    d.dry_run_error = e.what();
  }
  return d;
}

std::string diagnosis_text(
    const BudgetDiagnosis& d, const RunSpec& spec, const std::string& budget,
    const std::function<std::string(const BudgetDiagnosis::Alternative&)>& label) {
  std::string msg =
      budget + " is too small for " + d.when + " of " + spec.describe() + " (" + d.failure + ")";
  if (!d.dry_run_error.empty()) {
    return msg + "\n  (the dry run failed too: " + d.dry_run_error + ")";
  }
  msg += "\n  a dry run of this run reserves " + format_bytes(d.need) +
         " at its peak: a budget of " + std::to_string((d.need + kMiB - 1) / kMiB) +
         "MiB or more, or another policy (dry-run peaks):";
  for (const BudgetDiagnosis::Alternative& a : d.alternatives) {
    msg += "\n    " + (label ? label(a) : a.label) + ": " + format_bytes(a.need) +
           (a.fits ? " (fits)" : "");
  }
  return msg;
}

// ---- the tracer -----------------------------------------------------------------------------

#if MEMFIT_HAVE_CUDA
class RunSetup::Tracer {
 public:
  Tracer() { tracer_.start(); }
  void finish(ProfileReport& r) {
    tracer_.stop();
    r.gpu = tracer_.take();
    r.gpu_dropped = tracer_.dropped();
  }

 private:
  CuptiTracer tracer_;
};
#else
class RunSetup::Tracer {
 public:
  void finish(ProfileReport&) {}
};
#endif

// ---- the run ------------------------------------------------------------------------------

RunSetup::RunSetup(const RunSpec& spec, RunSetupOptions options) : spec_(spec) {
  spec_.validate();
  const MemoryPolicy& p = spec_.trainer.policy;
  env_ = make_runtime(spec_.device, spec_.alloc, {.worker_streams = p.offload.any()});
  if (options.record) {
    recorder_ = std::make_unique<Recorder>(*env_.alloc);
#if MEMFIT_HAVE_CUDA
    if (env_.kind == DeviceKind::kCuda) {
      std::string why;
      if (CuptiTracer::available(&why)) {
        try {
          tracer_ = std::make_unique<Tracer>();
        } catch (const Error& e) {  // the run is still worth recording without GPU activity
          notes_.push_back(std::string("no GPU activity in the report: CUPTI failed to start: ") +
                           e.what());
        }
      } else {
        notes_.push_back("no GPU activity in the report: CUPTI unavailable: " + why);
      }
    }
#endif
  }
  ctx_ = std::make_unique<LayerContext>(
      LayerContext{*env_.backend, *env_.alloc, kDefaultStream, p.dtype});
  if (spec_.ranks > 1 && spec_.trainer.comm == nullptr) {
    if (options.simulate_ranks) {
      comm_ = std::make_unique<SimulatedCommunicator>(*env_.backend, spec_.ranks, spec_.rank);
    } else {
      comm_ = make_communicator(*env_.backend);  // MPI under mpirun
    }
    spec_.trainer.comm = comm_.get();
  }
  if (const Communicator* c = spec_.trainer.comm;
      spec_.ranks > 1 && (c->size() != spec_.ranks || c->rank() != spec_.rank)) {
    throw InvalidArgument(spec_.describe() + ": this process is rank " + std::to_string(c->rank()) +
                          " of " + std::to_string(c->size()) + " (" + c->name() +
                          "); valid: a spec of as many ranks as the launch has (mpirun -np " +
                          std::to_string(spec_.ranks) + "), for this process's rank");
  }
  try {
    // What the model and optimizer allocate is the "setup" phase in a recording; the steps'
    // own peak (what a dry run predicts) is told apart from it (profiler/recorder.h).
    const ScopedRange setup(RangeKind::kSetup);
    model_ = std::make_unique<Model>(spec_.model, *ctx_, Trainer::placement(spec_.trainer.policy,
                                                                   spec_.trainer.zero_stage));
    trainer_ = std::make_unique<Trainer>(*model_, *ctx_, spec_.trainer);
  } catch (const OutOfMemory& e) {
    trainer_.reset();
    model_.reset();
    budget_failure(e);
  }
}

RunSetup::~RunSetup() {
  // The trainer and model free their blocks into the allocator; the recorder stops listening
  // before the allocator goes (env_ is destroyed last).
  trainer_.reset();
  model_.reset();
  tracer_.reset();
  recorder_.reset();
}

void RunSetup::budget_failure(const OutOfMemory& e) const {
  if (e.info().host) {
    const std::size_t need = e.info().requested_bytes, budget = e.info().budget_bytes;
    const auto params = static_cast<double>(spec_.model.parameter_count());
    char per[64];
    std::snprintf(per, sizeof per, "%.1f bytes per parameter", static_cast<double>(need) / params);
    throw HostBudgetError(
        spec_.describe() + ": offload needs " + format_bytes(need) + " of pinned host memory (" +
            per + ")" +
            (budget > 0 ? ", over the host budget of " + format_bytes(budget) +
                              "; valid: a host budget of " + format_bytes(need) +
                              " or more, or less offload"
                        : std::string(", which this host does not have (") + e.what() + ")"),
        need, budget);
  }
  BudgetDiagnosis d = diagnose_budget(spec_, e.what());
  d.when = model_ ? "step one" : "the model and optimizer";
  std::string msg = diagnosis_text(d, spec_, "budget " + format_bytes(d.budget));
  throw BudgetError(std::move(msg), std::move(d));
}

StepResult RunSetup::step(const Batch& batch) {
  try {
    StepResult r = trainer_->step(batch);
    ++steps_;
    return r;
  } catch (const OutOfMemory& e) {
    if (steps_ > 0) throw;
    budget_failure(e);
  }
}

ProfileReport RunSetup::finish_report(std::int64_t steps) {
  MEMFIT_CHECK(recorder_ != nullptr) << "finish_report needs RunSetupOptions::record";
  // Queued work (worker streams, GPU kernels) finishes before the figures are read.
  env_.backend->synchronize(kDefaultStream);
  recorder_->stop();
  ProfileReport r = make_report(recorder_->recording(), *env_.alloc, spec_.model.name, env_.name());
  r.steps = steps;
  r.device_total_bytes = env_.device_total_bytes;
  if (tracer_) tracer_->finish(r);
  return r;
}

}  // namespace memfit
