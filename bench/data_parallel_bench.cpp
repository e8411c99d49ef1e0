// Data-parallel step time on the CPU backend, one core per rank (issue 14's benchmark):
//
//   OMP_NUM_THREADS=1 build/bench/data_parallel_bench                      # N = 1
//   OMP_NUM_THREADS=1 mpirun -np 2 build/bench/data_parallel_bench          # N = 2
//   bench/data_parallel_bench.sh     # both, and the ratio between them, from one run
//
// Trains gpt-tiny (or --model) on the bundled corpus at a global batch (--batch, default 8)
// under ZeRO --zero (default 0), twice side by side in one process: one trainer with the
// gradient sums overlapping the backward (TrainerOptions::overlap_comm, the default) and one
// without, their steps alternating so both see the same machine. From rank 0 it prints the
// median step time of each after --warmup steps, tokens per second of the global batch, the
// seconds per step inside collectives (a timing wrapper around the communicator; without
// overlap every one runs on the computing thread), the seconds the overlapped run still
// waits for them (finish() and the blocking ones: the exposed part), and the share the
// backward hides, two ways: 1 - exposed / collectives, and the step time saved / collectives.
// The last line is machine-readable: `figure: ranks=N step_s=... step_off_s=... comm_s=...`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/cpu/cpu_backend.h"
#include "core/text_dataset.h"
#include "policies/run_setup.h"

namespace memfit {
namespace {

// Forwards every collective and adds up the wall time the caller spends inside them: the
// whole of a blocking one, the wait in finish() for a started one.
class TimedCommunicator final : public Communicator {
 public:
  explicit TimedCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* name() const override { return inner_.name(); }
  void all_reduce_sum(StreamId s, const Tensor& x) override {
    time([&] { inner_.all_reduce_sum(s, x); });
  }
  void reduce_scatter_sum(StreamId s, const Tensor& in, const Tensor& shard) override {
    time([&] { inner_.reduce_scatter_sum(s, in, shard); });
  }
  void all_gather(StreamId s, const Tensor& shard, const Tensor& out) override {
    time([&] { inner_.all_gather(s, shard, out); });
  }
  void broadcast(StreamId s, const Tensor& x, int root) override {
    time([&] { inner_.broadcast(s, x, root); });
  }
  void barrier() override {
    time([&] { inner_.barrier(); });
  }
  Ticket start_all_reduce_sum(StreamId s, const Tensor& x) override {
    Ticket t = 0;
    time([&] { t = inner_.start_all_reduce_sum(s, x); });
    return sync(t);
  }
  Ticket start_reduce_scatter_sum(StreamId s, const Tensor& in, const Tensor& shard) override {
    Ticket t = 0;
    time([&] { t = inner_.start_reduce_scatter_sum(s, in, shard); });
    return sync(t);
  }
  void finish(StreamId s, Ticket t) override {
    time([&] { inner_.finish(s, t); });
  }
  bool overlaps() const override { return inner_.overlaps(); }
  double seconds() const { return seconds_; }
  void reset() { seconds_ = 0; }

 private:
  template <typename F>
  void time(F f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Ticket sync(Ticket inner) {  // this wrapper's count follows the inner one's
    while (last_ticket() < inner) next_ticket();
    return inner;
  }
  Communicator& inner_;
  double seconds_ = 0;
};

const char* arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == name) return argv[i + 1];
  }
  return fallback;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int run(int argc, char** argv) {
  const LaunchInfo l = launch_info();
  RunSpec spec;
  spec.model = ModelSpec::preset(arg(argc, argv, "--model", "gpt-tiny"));
  spec.batch = std::atoll(arg(argc, argv, "--batch", "8"));
  spec.trainer.zero_stage = std::atoi(arg(argc, argv, "--zero", "0"));
  spec.ranks = l.world_size;
  spec.rank = l.rank;
  const int steps = std::atoi(arg(argc, argv, "--steps", "6"));
  const int warmup = std::atoi(arg(argc, argv, "--warmup", "1"));
  // The communicator is made here to time it. Its backend is only asked to synchronize the
  // default stream, which runs inline on the CPU backend without offload: a backend of its own
  // is the same as RunSetup's.
  CpuBackend sync_backend;
  const std::unique_ptr<Communicator> inner = make_communicator(sync_backend);
  TimedCommunicator comm(*inner);
  spec.trainer.comm = &comm;
  // [0]: every sum on the computing thread; [1]: overlapped with the backward.
  RunSpec off = spec;
  off.trainer.overlap_comm = false;
  RunSetup setups[2] = {RunSetup(off), RunSetup(spec)};
  const TextDataset data(std::string(MEMFIT_SOURCE_DIR) + "/data/corpus.txt");
  const std::int64_t seq_len = spec.resolved_seq_len();
  std::vector<double> step_s[2], comm_s[2];
  for (int i = 0; i < warmup + steps; ++i) {
    for (int m = 0; m < 2; ++m) {
      RunSetup& run = setups[m];
      const Batch b =
          rank_rows(data.sample(spec.batch, seq_len, run.trainer().rng()), spec.rank, spec.ranks);
      comm.reset();
      const StepResult r = run.step(b);
      if (i >= warmup) {
        step_s[m].push_back(r.seconds);
        comm_s[m].push_back(comm.seconds());
      }
    }
  }
  const double step_off = median(step_s[0]), step = median(step_s[1]);
  const double coll = median(comm_s[0]), exposed = median(comm_s[1]);
  const double tokens = static_cast<double>(spec.batch * seq_len) / step;
  // One rank overlaps nothing (its "collectives" are the local communicator's copies).
  const bool several = spec.ranks > 1 && coll > 0;
  const double hidden = several ? 1.0 - exposed / coll : 0.0;
  const double saved = several ? (step_off - step) / coll : 0.0;
  if (spec.rank == 0) {
    std::printf(
        "data_parallel_bench: %s, batch %lld x %lld, %d rank(s), ZeRO-%d, %s communicator%s\n",
        spec.model.name.c_str(), static_cast<long long>(spec.batch),
        static_cast<long long>(seq_len), spec.ranks, spec.trainer.zero_stage, comm.name(),
        comm.overlaps() ? " (started collectives on its own thread)" : "");
    std::printf(
        "  step %.3f s overlapped, %.3f s not (medians of %d after %d warm-up, "
        "alternating), %.0f tokens/s\n",
        step, step_off, steps, warmup, tokens);
    std::printf(
        "  collectives %.4f s per step (%.1f%% of the step without overlap); still "
        "waited for with overlap: %.4f s\n",
        coll, step_off > 0 ? 100.0 * coll / step_off : 0.0, exposed);
    if (several) {
      std::printf(
          "  hidden behind the backward: %.0f%% (1 - waited / collectives), step time "
          "saved: %.0f%% of the collectives\n",
          100.0 * hidden, 100.0 * saved);
    } else {
      std::printf("  one rank: no collectives to hide\n");
    }
    std::printf(
        "figure: ranks=%d step_s=%.4f step_off_s=%.4f tokens_per_s=%.1f comm_s=%.4f "
        "exposed_s=%.4f hidden=%.3f saved=%.3f\n",
        spec.ranks, step, step_off, tokens, coll, exposed, hidden, saved);
  }
  return 0;
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  try {
    return memfit::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_parallel_bench: %s\n", e.what());
    return 1;
  }
}
