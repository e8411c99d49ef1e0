// MpiCommunicator under mpirun (tests/CMakeLists.txt runs this binary with 2 and 3 ranks):
// every collective against the sum or gather computed here from what each rank contributes,
// rank-order sums bit for bit, uneven chunks, in-place forms, repeatability, and the checks.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/communicator.h"
#include "core/cpu/cpu_backend.h"
#include "memory/error.h"

namespace memfit {
namespace {

// What rank r contributes at element i: values whose float sums depend on the order.
float value(int r, std::int64_t i) {
  return 1.0f / static_cast<float>(3 + i % 97) + static_cast<float>(r) * 1e-3f +
         (i % 2 ? 1e4f : -1e-4f) * static_cast<float>(r % 2);
}

// The sum over ranks in rank order, as the communicator promises.
float rank_order_sum(int ranks, std::int64_t i) {
  float s = value(0, i);
  for (int r = 1; r < ranks; ++r) s += value(r, i);
  return s;
}

class Mpi : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = make_communicator(be_);
    ASSERT_STREQ(comm_->name(), "mpi") << "run this test under mpirun with 2 or more ranks";
  }
  CpuBackend be_;
  std::unique_ptr<Communicator> comm_;
};

TEST_F(Mpi, RankAndSizeMatchTheLaunch) {
  const LaunchInfo l = launch_info();
  EXPECT_EQ(comm_->size(), l.world_size);
  EXPECT_EQ(comm_->rank(), l.rank);
  EXPECT_GE(comm_->size(), 2);
}

TEST_F(Mpi, AllReduceSumsInRankOrderBitForBitOnEveryRank) {
  const int n_ranks = comm_->size(), me = comm_->rank();
  for (std::int64_t n : {1, 2, 5, 1000, 65537}) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) x[i] = value(me, i);
    comm_->all_reduce_sum(kDefaultStream, Tensor(x.data(), Shape{n}, DType::kF32, Device::kCpu));
    for (std::int64_t i = 0; i < n; ++i) {
      const float want = rank_order_sum(n_ranks, i);
      ASSERT_EQ(std::memcmp(&x[i], &want, sizeof(float)), 0)
          << "n " << n << " element " << i << ": " << x[i] << " vs " << want;
    }
  }
}

TEST_F(Mpi, ReduceScatterGivesEachRankItsChunkAndAllGatherPutsThemBack) {
  const int n_ranks = comm_->size(), me = comm_->rank();
  const std::int64_t n = 1001;  // uneven over 2 and 3 ranks
  std::vector<float> x(n);
  for (std::int64_t i = 0; i < n; ++i) x[i] = value(me, i);
  const Chunk c = chunk(n, n_ranks, me);
  std::vector<float> shard(static_cast<std::size_t>(c.count));
  comm_->reduce_scatter_sum(kDefaultStream, Tensor(x.data(), Shape{n}, DType::kF32, Device::kCpu),
                            Tensor(shard.data(), Shape{c.count}, DType::kF32, Device::kCpu));
  for (std::int64_t i = 0; i < c.count; ++i) {
    EXPECT_EQ(shard[i], rank_order_sum(n_ranks, c.offset + i)) << i;
  }
  std::vector<float> full(n, -1.0f);
  comm_->all_gather(kDefaultStream, Tensor(shard.data(), Shape{c.count}, DType::kF32, Device::kCpu),
                    Tensor(full.data(), Shape{n}, DType::kF32, Device::kCpu));
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(full[i], rank_order_sum(n_ranks, i)) << i;
}

TEST_F(Mpi, AllGatherInPlaceAndOfSixteenBitValues) {
  const int n_ranks = comm_->size(), me = comm_->rank();
  const std::int64_t n = 37;
  std::vector<std::uint16_t> out(n, 0);
  const Chunk c = chunk(n, n_ranks, me);
  for (std::int64_t i = 0; i < c.count; ++i) {
    out[c.offset + i] = static_cast<std::uint16_t>(1000 * me + i);  // this rank's chunk, in place
  }
  const Tensor whole(out.data(), Shape{n}, DType::kBF16, Device::kCpu);
  comm_->all_gather(kDefaultStream, whole.slice0(c.offset, c.offset + c.count), whole);
  for (int r = 0; r < n_ranks; ++r) {
    const Chunk rc = chunk(n, n_ranks, r);
    for (std::int64_t i = 0; i < rc.count; ++i) {
      EXPECT_EQ(out[rc.offset + i], static_cast<std::uint16_t>(1000 * r + i)) << r << " " << i;
    }
  }
}

TEST_F(Mpi, BroadcastFromEveryRoot) {
  for (int root = 0; root < comm_->size(); ++root) {
    std::vector<float> x(100, static_cast<float>(comm_->rank()));
    comm_->broadcast(kDefaultStream, Tensor(x.data(), Shape{100}, DType::kF32, Device::kCpu), root);
    for (float v : x) ASSERT_EQ(v, static_cast<float>(root));
  }
  comm_->barrier();
}

TEST_F(Mpi, RepeatsItsBitsAndRefusesBadShapesBeforeSendingAnything) {
  const int me = comm_->rank();
  std::vector<float> a(999), b(999);
  for (int k = 0; k < 2; ++k) {
    std::vector<float>& x = k == 0 ? a : b;
    for (std::int64_t i = 0; i < 999; ++i) x[i] = value(me, i);
    comm_->all_reduce_sum(kDefaultStream, Tensor(x.data(), Shape{999}, DType::kF32, Device::kCpu));
  }
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // The checks run on every rank alike before any transfer, so no rank is left waiting.
  std::vector<float> wrong(5);
  try {
    comm_->reduce_scatter_sum(kDefaultStream,
                              Tensor(a.data(), Shape{999}, DType::kF32, Device::kCpu),
                              Tensor(wrong.data(), Shape{5}, DType::kF32, Device::kCpu));
    ADD_FAILURE() << "a 5-element shard of 999 elements was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(me)), std::string::npos)
        << e.what();
  }
  comm_->barrier();  // still in step
}

TEST_F(Mpi, StartedCollectivesRunBesideTheCallerAndGiveTheBlockingCallsBits) {
  EXPECT_TRUE(comm_->overlaps()) << "MPI did not give MPI_THREAD_SERIALIZED";
  const int n_ranks = comm_->size(), me = comm_->rank();
  // Three started at once: an all-reduce, a reduce-scatter into a shard, an in-place one.
  const std::int64_t n = 4099;  // uneven over 2 and 3 ranks
  const Chunk c = chunk(n, n_ranks, me);
  std::vector<float> a(n), b(n), inplace(n), shard(static_cast<std::size_t>(c.count));
  for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] = inplace[i] = value(me, i);
  const auto host = [](std::vector<float>& v) {
    return Tensor(v.data(), Shape{static_cast<std::int64_t>(v.size())}, DType::kF32, Device::kCpu);
  };
  const Communicator::Ticket first = comm_->last_ticket();
  const Communicator::Ticket t1 = comm_->start_all_reduce_sum(kDefaultStream, host(a));
  const Communicator::Ticket t2 =
      comm_->start_reduce_scatter_sum(kDefaultStream, host(b), host(shard));
  const Tensor mine = chunk_view(host(inplace), n_ranks, me);
  const Communicator::Ticket t3 =
      comm_->start_reduce_scatter_sum(kDefaultStream, host(inplace), mine);
  EXPECT_EQ(t1, first + 1);
  EXPECT_EQ(t2, first + 2);
  EXPECT_EQ(t3, first + 3);
  comm_->finish(kDefaultStream, t1);  // t1's result, whatever t2 and t3 are doing
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], rank_order_sum(n_ranks, i)) << i;
  comm_->finish(kDefaultStream, t3);  // covers t2
  for (std::int64_t i = 0; i < c.count; ++i) {
    ASSERT_EQ(shard[i], rank_order_sum(n_ranks, c.offset + i)) << i;
    ASSERT_EQ(inplace[c.offset + i], rank_order_sum(n_ranks, c.offset + i)) << i;
  }
  EXPECT_THROW(comm_->finish(kDefaultStream, t3 + 1), InvalidArgument);  // not started
  // A blocking call with started ones in flight runs after them, in the order called.
  std::vector<float> x(n), y(n);
  for (std::int64_t i = 0; i < n; ++i) x[i] = y[i] = value(me, i);
  comm_->start_all_reduce_sum(kDefaultStream, host(x));
  comm_->all_reduce_sum(kDefaultStream, host(y));
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
  comm_->barrier();
}

// A started collective returns before the other ranks have even joined it: the last rank joins
// half a second late, and the others' start calls come back long before that.
TEST_F(Mpi, AStartedCollectiveReturnsBeforeTheOtherRanksJoin) {
  const int n_ranks = comm_->size(), me = comm_->rank();
  std::vector<float> x(1000, 1.0f);
  const Tensor t(x.data(), Shape{1000}, DType::kF32, Device::kCpu);
  comm_->barrier();
  if (me == n_ranks - 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto t0 = std::chrono::steady_clock::now();
  const Communicator::Ticket ticket = comm_->start_all_reduce_sum(kDefaultStream, t);
  const double started =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  comm_->finish(kDefaultStream, ticket);
  const double finished =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (me != n_ranks - 1) {
    EXPECT_LT(started, 0.25) << "start waited for the late rank";
    EXPECT_GT(finished, 0.25) << "finish did not wait for the late rank";
  }
  for (float v : x) ASSERT_EQ(v, static_cast<float>(n_ranks));
}

TEST_F(Mpi, AStartedCollectiveWithABadShapeIsRefusedAtOnceOnEveryRank) {
  std::vector<float> a(999), wrong(5);
  const Communicator::Ticket before = comm_->last_ticket();
  EXPECT_THROW(comm_->start_reduce_scatter_sum(
                   kDefaultStream, Tensor(a.data(), Shape{999}, DType::kF32, Device::kCpu),
                   Tensor(wrong.data(), Shape{5}, DType::kF32, Device::kCpu)),
               InvalidArgument);
  EXPECT_EQ(comm_->last_ticket(), before);  // nothing started
  comm_->barrier();
}

}  // namespace
}  // namespace memfit
