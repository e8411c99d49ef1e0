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
// argument that names an existing state file).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/cpu/cpu_backend.h"
#include "core/model.h"
#include "core/text_dataset.h"
#include "memory/alloc_conf.h"
#include "memory/caching_allocator.h"
#include "memory/host_provider.h"
#include "memory/size.h"
#include "policies/trainer.h"

using namespace memfit;

int main(int argc, char** argv) {
  const std::string data_path = argc > 1 ? argv[1] : "data/corpus.txt";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 10;
  const std::string state = argc > 3 ? argv[3] : "train_gpt.mfstate";
  constexpr std::int64_t kBatch = 8, kSeqLen = 128;

  try {
    // The CPU "device": worker streams make the offload's copy stream a real thread.
    CpuBackend be({.worker_streams = true});
    HostProvider host;
    AllocatorConfig conf = alloc_conf_from_env();
    conf.budget = 128 * kMiB;
    CachingAllocator alloc(host, conf, &be.stream_sync());
    be.set_workspace_allocator(&alloc);  // GEMM scratch counts against the budget too
    LayerContext ctx{be, alloc, kDefaultStream, DType::kBF16};

    Model model(ModelSpec::preset("gpt-tiny"), ctx);
    TrainerOptions opt;
    opt.checkpoint = "every:2";
    opt.micro_batch = 4;
    opt.offload = true;
    opt.adamw.lr = 1e-3;
    Trainer trainer(model, ctx, opt);  // initializes the model from opt.seed
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
      const StepResult r = trainer.step(b);
      std::printf("step %3lld  loss %.4f  %6.0f tok/s  peak %s reserved, %s activations\n",
                  static_cast<long long>(r.step), r.loss, double(r.tokens) / r.seconds,
                  format_bytes(r.peak_reserved).c_str(),
                  format_bytes(r.peak_by_category[static_cast<std::size_t>(Category::kActivation)])
                      .c_str());
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
