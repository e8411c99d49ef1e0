// train_gpt: the training loop behind `memfit train`, as a program to copy and change.
//
//   build/examples/example_train_gpt [data/corpus.txt] [steps] [state file]
//
// Trains the bundled gpt-tiny (6 blocks of width 256, byte-level vocabulary) on a text file on
// the CPU backend with bf16 weights and activations, every second block checkpointed,
// micro-batches of 4 accumulated into a batch of 8, and the optimizer offloaded (FP32 masters
// and Adam moments in pinned host memory, CPU AdamW overlapping the backward on a copy stream),
// all under a 128 MiB budget. Each step prints its loss, tokens/s and the allocator's peaks;
// the end evaluates a held-out batch and saves the training state (resume with a third
// argument that names an existing state file). The setup (backend, budgeted allocator with the
// GEMM scratch inside the budget, pinned host memory, model, trainer) is RunSetup's: exactly
// what `memfit train` builds, and what its dry run predicts (printed beside the measured peak).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/text_dataset.h"
#include "memory/alloc_conf.h"
#include "memory/size.h"
#include "policies/dry_run.h"
#include "policies/run_setup.h"

using namespace memfit;

int main(int argc, char** argv) {
  const std::string data_path = argc > 1 ? argv[1] : "data/corpus.txt";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 10;
  const std::string state = argc > 3 ? argv[3] : "train_gpt.mfstate";
  constexpr std::int64_t kBatch = 8, kSeqLen = 128;

  try {
    RunSpec spec;
    spec.model = ModelSpec::preset("gpt-tiny");
    spec.trainer.policy.dtype = DType::kBF16;
    spec.trainer.policy.checkpoint = Checkpointing::every(2);
    spec.trainer.policy.micro_batch = 4;
    spec.trainer.policy.offload.optimizer = true;
    spec.trainer.adamw.lr = 1e-3;
    spec.batch = kBatch;
    spec.seq_len = kSeqLen;
    spec.alloc = alloc_conf_from_env();
    spec.alloc.budget = 128 * kMiB;
    spec.device = DeviceKind::kCpu;  // worker streams make offload's copy stream a real thread
    const DryRunResult predicted = dry_run(spec);

    RunSetup run(spec);  // initializes the model from spec.trainer.seed
    Trainer& trainer = run.trainer();
    Model& model = run.model();
    if (::access(state.c_str(), R_OK) == 0 && argc > 3) {
      trainer.load(state);
      std::printf("resumed from %s at step %lld\n", state.c_str(),
                  static_cast<long long>(trainer.steps_attempted()));
    }

    const TextDataset data(data_path);
    const Batch held_out = data.sequential(kBatch, kSeqLen, data.size() / 2);
    std::printf("gpt-tiny, %lld parameters; held-out loss %.4f\n",
                static_cast<long long>(model.parameter_count()), trainer.evaluate(held_out));
    for (int i = 0; i < steps; ++i) {
      const Batch b = data.sample(kBatch, kSeqLen, trainer.rng());
      const StepResult r = run.step(b);
      std::printf(
          "step %3lld  loss %.4f  %6.0f tok/s  peak %s reserved (predicted %s), %s "
          "activations at the peak\n",
          static_cast<long long>(r.step), r.loss, double(r.tokens) / r.seconds,
          format_bytes(r.peaks.reserved).c_str(), format_bytes(predicted.step.reserved).c_str(),
          format_bytes(r.peaks.at_peak_of(Category::kActivation)).c_str());
    }
    std::printf("held-out loss %.4f\n", trainer.evaluate(held_out));
    trainer.save(state);
    std::printf("state saved to %s\n", state.c_str());
  } catch (const Error& e) {  // bad input, a budget too small: the message says what to change
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 2;
  }
  return 0;
}
