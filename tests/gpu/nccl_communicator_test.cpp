// NcclCommunicator (core/comm/nccl_communicator.h) as one rank on one GPU, in one process (no
// mpirun, no MPI): every collective against the CPU reference, the local communicator on the
// CPU backend (sums over one rank are the identity, scatters and gathers copy), to the bit, on
// uneven sizes and every dtype, in place and not; on a stream of its own; host tensors refused
// naming the call; meta tensors left alone; bad shapes refused as by the other implementations.
// The started collectives (start_*, finish) against the blocking ones, and their stream order.
//
// More than one rank needs one GPU per rank (NCCL refuses two ranks on one device: "Duplicate
// GPU detected"), so the uneven chunks of several ranks are not run here.
//
// Skips with the reason without a GPU (MEMFIT_REQUIRE_GPU), without NCCL in this build, and
// when launched by mpirun with more than one rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/cpu/cpu_backend.h"
#include "core/cuda/cuda_backend.h"
#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_provider.h"
#include "memory/error.h"
#include "tests/core/backend_testutil.h"
#include "tests/gpu/gpu_testutil.h"

#ifdef MEMFIT_HAVE_NCCL
#include "core/comm/nccl_communicator.h"
#endif

namespace memfit {
namespace {

#ifndef MEMFIT_HAVE_NCCL

TEST(NcclCommunicator, NeedsABuildWithNccl) {
  GTEST_SKIP() << "no NCCL: this build has no NCCL communicator (it needs the CUDA backend, MPI "
                  "and nccl.h + libnccl found by CMake; see its \"memfit: NCCL communicator\" "
                  "line)";
}

#else

using testing::expect_invalid;
using testing::Gate;
using testing::GateOpener;
using testing::HostBuf;
using testing::kAllDTypes;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Sizes: empty, one element, odd, and one large odd size (NCCL splits it into many steps).
constexpr std::int64_t kSizes[] = {0, 1, 7, 1000, 1000003};

// Skips without a GPU, and under mpirun with more than one rank: there the communicator would
// span every rank, and these expectations are one rank's.
#define MEMFIT_REQUIRE_ONE_RANK()                                                         \
  do {                                                                                    \
    MEMFIT_REQUIRE_GPU();                                                                 \
    if (launch_info().world_size > 1) {                                                   \
      GTEST_SKIP() << "launched as one of " << launch_info().world_size                   \
                   << " ranks: these are one-rank tests (run the binary without mpirun)"; \
    }                                                                                     \
  } while (0)

// A CudaBackend on device 0, device memory from a caching allocator, the 1-rank communicator,
// and the CPU reference; the communicator goes before the allocator and the backend.
struct Env {
  Env()
      : be(CudaBackendOptions{.device = 0}),
        gpu(0),
        alloc(gpu, {}, &be.stream_sync()),
        comm(be),
        ref(cpu) {}
  CudaBackend be;
  CudaProvider gpu;
  CachingAllocator alloc;
  NcclCommunicator comm;
  CpuBackend cpu;
  LocalCommunicator ref;
};

// n elements of dt on the device.
struct DevBuf {
  DevBuf(Env& env, DType dt, std::int64_t n)
      : block(env.alloc.allocate(
            static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * dtype_size(dt),
            Category::kActivation)),
        t(block.data(), Shape{n}, dt, Device::kCuda) {}
  Block block;
  Tensor t;
};

void upload(Env& env, const HostBuf& h, const Tensor& d, StreamId s = kDefaultStream) {
  env.be.copy(s, h.t(), d);
  env.be.synchronize(s);
}
HostBuf download(Env& env, const Tensor& d, StreamId s = kDefaultStream) {
  HostBuf h(d.dtype(), d.numel());
  env.be.copy(s, d, h.t());
  env.be.synchronize(s);
  return h;
}
HostBuf random_host(DType dt, std::int64_t n, unsigned seed) {
  HostBuf h(dt, n);
  std::mt19937 rng(seed);
  h.randomize(rng, -4.0f, 4.0f);
  return h;
}
HostBuf nan_host(DType dt, std::int64_t n) {
  HostBuf h(dt, n);
  h.fill(kNaN);
  return h;
}
// Bitwise equality: the one-rank sums and copies add no rounding.
void expect_same_bits(const HostBuf& got, const HostBuf& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const std::size_t bytes = want.t().nbytes();
  if (bytes == 0) return;
  if (std::memcmp(got.t().raw(), want.t().raw(), bytes) == 0) return;
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < got.size(); ++i) {
    const float g = got.get(i), w = want.get(i);
    if (std::memcmp(&g, &w, sizeof g) != 0 && bad++ < 5) {
      ADD_FAILURE() << what << ": [" << i << "] got " << g << " want " << w;
    }
  }
  ADD_FAILURE() << what << ": " << bad << " of " << got.size() << " elements differ";
}

TEST(NcclCommunicator, OneProcessIsOneRankOnTheBackendsDevice) {
  MEMFIT_REQUIRE_ONE_RANK();
  Env env;
  EXPECT_EQ(env.comm.rank(), 0);
  EXPECT_EQ(env.comm.size(), 1);
  EXPECT_STREQ(env.comm.name(), "nccl");
  EXPECT_EQ(env.comm.device(), 0);
  env.comm.barrier();
  // One process, one rank: make_communicator keeps to the local communicator, NCCL or not.
  EXPECT_STREQ(make_communicator(env.be)->name(), "local");
}

TEST(NcclCommunicator, AllReduceSumMatchesTheLocalCommunicator) {
  MEMFIT_REQUIRE_ONE_RANK();
  Env env;
  for (std::int64_t n : kSizes) {
    const HostBuf x = random_host(DType::kF32, n, 1u + static_cast<unsigned>(n));
    DevBuf d(env, DType::kF32, n);
    upload(env, x, d.t);
    env.comm.all_reduce_sum(kDefaultStream, d.t);
    HostBuf want = x;
    env.ref.all_reduce_sum(kDefaultStream, want.t());
    expect_same_bits(download(env, d.t), want, "all_reduce_sum n=" + std::to_string(n));
  }
}

TEST(NcclCommunicator, ReduceScatterSumMatchesTheLocalCommunicatorInPlaceAndNot) {
  MEMFIT_REQUIRE_ONE_RANK();
  Env env;
  for (std::int64_t n : kSizes) {
    const std::string what = "reduce_scatter_sum n=" + std::to_string(n);
    const HostBuf x = random_host(DType::kF32, n, 2u + static_cast<unsigned>(n));
    HostBuf want = nan_host(DType::kF32, n);
    env.ref.reduce_scatter_sum(kDefaultStream, x.t(), want.t());

    DevBuf in(env, DType::kF32, n), shard(env, DType::kF32, n);
    upload(env, x, in.t);
    upload(env, nan_host(DType::kF32, n), shard.t);  // every element must be written
    env.comm.reduce_scatter_sum(kDefaultStream, in.t, shard.t);
    expect_same_bits(download(env, shard.t), want, what);
    expect_same_bits(download(env, in.t), x, what + ": in unchanged");

    // In place: the shard is this rank's chunk of `in` (all of it, on one rank).
    env.comm.reduce_scatter_sum(kDefaultStream, in.t, chunk_view(in.t, 1, 0));
    expect_same_bits(download(env, in.t), want, what + " in place");
  }
}

TEST(NcclCommunicator, AllGatherMatchesTheLocalCommunicatorForEveryDtype) {
  MEMFIT_REQUIRE_ONE_RANK();
  Env env;
  for (DType dt : kAllDTypes) {
    for (std::int64_t n : kSizes) {
      const std::string what =
          std::string("all_gather ") + dtype_name(dt) + " n=" + std::to_string(n);
      const HostBuf x = random_host(dt, n, 3u + static_cast<unsigned>(n));
      HostBuf want = nan_host(dt, n);
      env.ref.all_gather(kDefaultStream, x.t(), want.t());

      DevBuf shard(env, dt, n), out(env, dt, n);
      upload(env, x, shard.t);
      upload(env, nan_host(dt, n), out.t);
      env.comm.all_gather(kDefaultStream, shard.t, out.t);
      expect_same_bits(download(env, out.t), want, what);

      // In place: the shard is this rank's chunk of `out`.
      upload(env, x, out.t);
      env.comm.all_gather(kDefaultStream, chunk_view(out.t, 1, 0), out.t);
      expect_same_bits(download(env, out.t), want, what + " in place");
    }
  }
}

TEST(NcclCommunicator, BroadcastFromTheOnlyRootLeavesEveryDtypeAsItIs) {
  MEMFIT_REQUIRE_ONE_RANK();
  Env env;
  for (DType dt : kAllDTypes) {
    for (std::int64_t n : kSizes) {
      const HostBuf x = random_host(dt, n, 4u + static_cast<unsigned>(n));
      DevBuf d(env, dt, n);
      upload(env, x, d.t);
      env.comm.broadcast(kDefaultStream, d.t, 0);
      expect_same_bits(download(env, d.t), x,
                       std::string("broadcast ") + dtype_name(dt) + " n=" + std::to_string(n));
    }
  }
  DevBuf d(env, DType::kF32, 4);
  expect_invalid([&] { env.comm.broadcast(kDefaultStream, d.t, 1); }, {"nccl", "root 1"});
}

// Enqueued on the given stream: ordered after the work before it there, and returning without
// waiting for that stream (a gate holds it shut while the collective is queued).
TEST(NcclCommunicator, CollectivesQueueOnTheirStreamWithoutWaitingForIt) {
  MEMFIT_REQUIRE_ONE_RANK();
  Env env;
  const StreamId s = env.be.create_stream();
  const std::int64_t n = 4099;
  DevBuf in(env, DType::kF32, n), shard(env, DType::kF32, n);
  env.comm.all_reduce_sum(s, in.t);  // a first collective: NCCL's one-time setup is behind us
  env.be.synchronize(s);

  Gate gate;
  {
    GateOpener opener{gate};
    ASSERT_EQ(cudaLaunchHostFunc(env.be.cuda_stream(s), Gate::wait, &gate), cudaSuccess);
    env.be.fill(s, in.t, 3.0f);
    env.comm.reduce_scatter_sum(s, in.t, shard.t);  // must return while the gate is shut
    env.comm.all_reduce_sum(s, shard.t);
    EXPECT_EQ(cudaStreamQuery(env.be.cuda_stream(s)), cudaErrorNotReady)
        << "the stream ran past the gate: the collectives did not queue behind it";
  }  // the gate opens
  HostBuf want(DType::kF32, n);
  want.fill(3.0f);
  expect_same_bits(download(env, shard.t, s), want, "reduce_scatter_sum after fill on stream");
  env.be.destroy_stream(s);
}

TEST(NcclCommunicator, RefusesHostTensorsNamingTheCall) {
  MEMFIT_REQUIRE_ONE_RANK();
  Env env;
  HostBuf h(DType::kF32, 8);
  DevBuf d(env, DType::kF32, 8);
  const char* why = "device memory (CPU ranks use MPI)";
  expect_invalid([&] { env.comm.all_reduce_sum(kDefaultStream, h.t()); },
                 {"all_reduce_sum", "rank 0", why});
  expect_invalid([&] { env.comm.reduce_scatter_sum(kDefaultStream, h.t(), d.t); },
                 {"reduce_scatter_sum", why});
  expect_invalid([&] { env.comm.reduce_scatter_sum(kDefaultStream, d.t, h.t()); },
                 {"reduce_scatter_sum", why});
  expect_invalid([&] { env.comm.all_gather(kDefaultStream, h.t(), d.t); }, {"all_gather", why});
  expect_invalid([&] { env.comm.all_gather(kDefaultStream, d.t, h.t()); }, {"all_gather", why});
  expect_invalid([&] { env.comm.broadcast(kDefaultStream, h.t(), 0); }, {"broadcast", why});
  // gather_values() (host figures) goes through MPI instead: one rank gets its own value.
  EXPECT_EQ(gather_values(env.comm, 1.5), std::vector<double>{1.5});
}

TEST(NcclCommunicator, LeavesMetaTensorsAloneAndChecksShapesAsTheOthers) {
  MEMFIT_REQUIRE_ONE_RANK();
  Env env;
  const Tensor meta(nullptr, Shape{1 << 20}, DType::kF32, Device::kMeta);
  env.comm.all_reduce_sum(kDefaultStream, meta);
  env.comm.reduce_scatter_sum(kDefaultStream, meta, meta);
  env.comm.all_gather(kDefaultStream, meta, meta);
  env.comm.broadcast(kDefaultStream, meta, 0);

  DevBuf f32(env, DType::kF32, 10), f16(env, DType::kF16, 10), small(env, DType::kF32, 9);
  expect_invalid([&] { env.comm.all_reduce_sum(kDefaultStream, f16.t); },
                 {"nccl all_reduce_sum", "f16"});
  expect_invalid([&] { env.comm.reduce_scatter_sum(kDefaultStream, f32.t, small.t); },
                 {"nccl reduce_scatter_sum", "10 elements"});
  expect_invalid([&] { env.comm.all_gather(kDefaultStream, small.t, f32.t); },
                 {"nccl all_gather", "10 elements"});
  expect_invalid([&] { env.comm.all_gather(kDefaultStream, f16.t, f32.t); },
                 {"nccl all_gather", "the same dtype"});
}

// The started forms give the blocking forms' bits, with tickets counting up from 1.
TEST(NcclCommunicator, StartedCollectivesMatchTheBlockingOnesAfterFinish) {
  MEMFIT_REQUIRE_ONE_RANK();
  Env env;
  EXPECT_TRUE(env.comm.overlaps());
  EXPECT_EQ(env.comm.last_ticket(), 0u);
  const StreamId s = env.be.create_stream();
  Communicator::Ticket expected = 1;
  for (std::int64_t n : kSizes) {
    const std::string what = " n=" + std::to_string(n);
    const HostBuf x = random_host(DType::kF32, n, 5u + static_cast<unsigned>(n));
    DevBuf reduced(env, DType::kF32, n), want_reduced(env, DType::kF32, n);
    DevBuf in(env, DType::kF32, n), shard(env, DType::kF32, n), want_shard(env, DType::kF32, n);
    upload(env, x, reduced.t, s);
    upload(env, x, want_reduced.t, s);
    upload(env, x, in.t, s);
    upload(env, nan_host(DType::kF32, n), shard.t, s);
    upload(env, nan_host(DType::kF32, n), want_shard.t, s);
    env.comm.all_reduce_sum(s, want_reduced.t);
    env.comm.reduce_scatter_sum(s, in.t, want_shard.t);

    const Communicator::Ticket first = env.comm.start_all_reduce_sum(s, reduced.t);
    const Communicator::Ticket second = env.comm.start_reduce_scatter_sum(s, in.t, shard.t);
    EXPECT_EQ(first, expected);
    EXPECT_EQ(second, expected + 1);
    EXPECT_EQ(env.comm.last_ticket(), second);
    expected += 2;
    env.comm.finish(s, second);
    expect_same_bits(download(env, reduced.t, s), download(env, want_reduced.t, s),
                     "start_all_reduce_sum" + what);
    expect_same_bits(download(env, shard.t, s), download(env, want_shard.t, s),
                     "start_reduce_scatter_sum" + what);
  }
  env.be.destroy_stream(s);
}

// A started collective runs behind the work queued on its stream and returns at once; a
// blocking collective waits for the unfinished started ones, and finish() orders its stream.
TEST(NcclCommunicator, StartedCollectivesRunBehindTheirStreamAndFinishOrdersTheCaller) {
  MEMFIT_REQUIRE_ONE_RANK();
  Env env;
  const StreamId s = env.be.create_stream(), after = env.be.create_stream();
  const StreamId blocking = env.be.create_stream();
  const std::int64_t n = 4099;
  DevBuf x(env, DType::kF32, n), copy(env, DType::kF32, n), other(env, DType::kF32, n);
  env.comm.all_reduce_sum(s, x.t);  // a first collective: NCCL's one-time setup is behind us
  env.be.synchronize(s);

  Gate gate;
  {
    GateOpener opener{gate};
    ASSERT_EQ(cudaLaunchHostFunc(env.be.cuda_stream(s), Gate::wait, &gate), cudaSuccess);
    env.be.fill(s, x.t, 3.0f);
    env.comm.start_all_reduce_sum(s, x.t);       // returns with the gate shut
    env.comm.all_reduce_sum(blocking, other.t);  // behind the unfinished started one
    const Communicator::Ticket t = env.comm.start_all_reduce_sum(s, x.t);
    env.comm.finish(after, t);
    env.be.copy(after, x.t, copy.t);
    EXPECT_EQ(cudaStreamQuery(env.be.cuda_stream(blocking)), cudaErrorNotReady)
        << "a blocking collective did not wait for the unfinished started one";
    EXPECT_EQ(cudaStreamQuery(env.be.cuda_stream(after)), cudaErrorNotReady)
        << "finish() did not order its stream behind the started collective";
  }  // the gate opens
  HostBuf want(DType::kF32, n);
  want.fill(3.0f);
  expect_same_bits(download(env, copy.t, after), want, "copy after finish");
  env.be.synchronize(blocking);
  for (StreamId id : {s, after, blocking}) env.be.destroy_stream(id);
}

// Meta tensors: checked, nothing enqueued, still a ticket; unstarted tickets are refused.
TEST(NcclCommunicator, StartedMetaCollectivesGetTicketsAndBadTicketsAreRefused) {
  MEMFIT_REQUIRE_ONE_RANK();
  Env env;
  const Tensor meta(nullptr, Shape{1 << 20}, DType::kF32, Device::kMeta);
  EXPECT_EQ(env.comm.start_all_reduce_sum(kDefaultStream, meta), 1u);
  EXPECT_EQ(env.comm.start_reduce_scatter_sum(kDefaultStream, meta, meta), 2u);
  env.comm.finish(kDefaultStream, 2);
  env.comm.finish(kDefaultStream, 1);  // finishing again, or an earlier one, is allowed

  DevBuf f16(env, DType::kF16, 10), f32(env, DType::kF32, 10), small(env, DType::kF32, 9);
  expect_invalid([&] { env.comm.start_all_reduce_sum(kDefaultStream, f16.t); },
                 {"nccl all_reduce_sum", "f16"});
  expect_invalid([&] { env.comm.start_reduce_scatter_sum(kDefaultStream, f32.t, small.t); },
                 {"nccl reduce_scatter_sum", "10 elements"});
  expect_invalid([&] { env.comm.finish(kDefaultStream, 3); }, {"nccl finish", "ticket 3"});
  expect_invalid([&] { env.comm.finish(kDefaultStream, 0); }, {"nccl finish", "ticket 0"});
  EXPECT_EQ(env.comm.last_ticket(), 2u);
}

#endif  // MEMFIT_HAVE_NCCL

}  // namespace
}  // namespace memfit
