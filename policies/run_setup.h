// RunSetup: everything one training run stands on, built from a RunSpec in the order its
// memory needs: the backend and the budgeted caching allocator (policies/runtime_env.h; the
// GEMM workspace inside the budget), optionally a Recorder (and on CUDA the CUPTI tracer) from
// before the first allocation, the model, and the Trainer (with its pinned host memory for
// offload). `memfit train` and `memfit profile` are this plus printing; a program of your own
// gets exactly the same setup and budget accounting:
//
//   RunSpec spec = Plan::load("plan.yaml").run_spec();   // or fill one (policies/run_spec.h)
//   RunSetup run(spec);
//   for (int i = 0; i < 100; ++i) {
//     StepResult r = run.step(data.sample(spec.batch, spec.resolved_seq_len(),
//     run.trainer().rng()));
//   }
//   run.trainer().save("run.mfstate");
//
// A budget that the model or the first step does not fit is a BudgetError (an
// InvalidArgument) whose message and diagnosis() say what a dry run of this spec reserves and
// what the usual alternatives would (each a dry run, policies/dry_run.h). Offload's pinned
// host memory over the host budget (checked before anything is pinned) is a HostBudgetError. Later
// steps' errors pass through unchanged (the Trainer leaves its state as it was). Teardown order:
// trainer, model, tracer, recorder, then the runtime (allocator, provider, backend). Not
// thread-safe; one run per RunSetup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/model.h"
#include "memory/error.h"
#include "policies/run_spec.h"
#include "policies/runtime_env.h"
#include "policies/trainer.h"
#include "profiler/recorder.h"
#include "profiler/report.h"

namespace memfit {

// What each usual alternative to a spec that does not fit would reserve (dry runs).
struct BudgetDiagnosis {
  enum class Change : std::uint8_t { kCheckpointAll, kMicroBatch, kBF16, kOffload, kAllOfThese };
  struct Alternative {
    Change change;
    std::string label;     // in policy terms: "checkpoint all", "micro-batch 4", ...
    RunSpec spec;          // the spec with that change
    std::size_t need = 0;  // its dry run's reserved peak (setup included)
    bool fits = false;     // need <= budget
  };
  std::string when;  // "step one", "the model and optimizer"
  std::size_t budget = 0;
  std::size_t need = 0;       // this spec's dry-run reserved peak (setup included); 0: failed
  std::string failure;        // the OutOfMemory message that started it
  std::string dry_run_error;  // a dry run that failed on its own (empty otherwise)
  std::vector<Alternative> alternatives;
};

// Dry-runs `spec` without its budget and the usual changes to it: checkpoint all, a quarter
// of the batch per micro-batch, bf16, optimizer offload, all of these.
BudgetDiagnosis diagnose_budget(const RunSpec& spec, const std::string& failure);

// The diagnosis as a message: "<budget> is too small for <when> of <spec> (<failure>)", what a
// dry run reserves, then one line per alternative. `budget` names the budget ("budget 64.00
// MiB"; the CLI says which flag); `label` names each alternative (default: a.label, in
// policy terms; the CLI gives the flags that make it).
std::string diagnosis_text(
    const BudgetDiagnosis& d, const RunSpec& spec, const std::string& budget,
    const std::function<std::string(const BudgetDiagnosis::Alternative&)>& label = {});

class BudgetError : public InvalidArgument {
 public:
  BudgetError(std::string message, BudgetDiagnosis d)
      : InvalidArgument(std::move(message)), diagnosis_(std::move(d)) {}
  const BudgetDiagnosis& diagnosis() const { return diagnosis_; }

 private:
  BudgetDiagnosis diagnosis_;
};

// The pinned host memory offload needs is over the host budget (RunSpec's
// trainer.host_budget) or not there; the message says how much, and what would be valid.
class HostBudgetError : public InvalidArgument {
 public:
  HostBudgetError(std::string message, std::size_t need, std::size_t budget)
      : InvalidArgument(std::move(message)), need_(need), budget_(budget) {}
  std::size_t need() const { return need_; }
  std::size_t budget() const { return budget_; }  // 0: no budget (the memory was not there)

 private:
  std::size_t need_, budget_;
};

struct RunSetupOptions {
  bool record = false;  // a Recorder (and on cuda the CUPTI tracer, when it starts)
  // spec.rank of spec.ranks in this one process, its collectives simulated
  // (SimulatedCommunicator: as if every other rank held what this one holds): the rank's
  // memory is a real rank's, to the byte; its values are not a real run's.
  bool simulate_ranks = false;
};

class RunSetup {
 public:
  // Validates `spec` (RunSpec::validate), builds everything above. BudgetError when the model
  // and trainer do not fit the budget. spec.ranks > 1: the ranks' communicator is
  // spec.trainer.comm, else make_communicator() (MPI under mpirun); InvalidArgument when its
  // size and rank are not spec.ranks and spec.rank. step() then takes this rank's samples.
  explicit RunSetup(const RunSpec& spec, RunSetupOptions options = {});
  ~RunSetup();
  RunSetup(const RunSetup&) = delete;
  RunSetup& operator=(const RunSetup&) = delete;

  // One training step. The first step's OutOfMemory becomes a BudgetError.
  StepResult step(const Batch& batch);

  const RunSpec& spec() const { return spec_; }
  const RuntimeEnv& runtime() const { return env_; }
  Backend& backend() { return *env_.backend; }
  CachingAllocator& allocator() { return *env_.alloc; }
  LayerContext& context() { return *ctx_; }
  Model& model() { return *model_; }
  Trainer& trainer() { return *trainer_; }
  Recorder* recorder() { return recorder_.get(); }
  // What did not work out but did not stop the run ("CUPTI unavailable: ..."), for printing.
  const std::vector<std::string>& notes() const { return notes_; }

  // record = true: waits for queued work, stops the recorder (and tracer) and returns what
  // they saw, with the allocator's figures; the caller adds plan vs measured.
  ProfileReport finish_report(std::int64_t steps);

 private:
  class Tracer;  // CUDA builds: the CUPTI tracer
  [[noreturn]] void budget_failure(const OutOfMemory& e) const;

  RunSpec spec_;
  RuntimeEnv env_;
  std::unique_ptr<Communicator> comm_;  // ranks > 1 without spec.trainer.comm: make_communicator
  std::unique_ptr<Recorder> recorder_;
  std::unique_ptr<Tracer> tracer_;
  std::unique_ptr<LayerContext> ctx_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Trainer> trainer_;
  std::vector<std::string> notes_;
  std::int64_t steps_ = 0;
};

}  // namespace memfit
