// Communicator (core/comm/communicator.h) in one process: chunking, the local communicator's
// collectives and checks, what mpirun's environment says, and make_communicator's choice.
// The MPI communicator runs under mpirun in communicator_mpi_test.cpp.
#include "core/comm/communicator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "memory/error.h"

namespace memfit {
namespace {

TEST(Chunk, SplitsEvenlyWithTheRemainderFirstAndCoversEveryElement) {
  for (std::int64_t n : {0, 1, 7, 8, 9, 1000003}) {
    for (int ranks : {1, 2, 3, 4, 7}) {
      std::int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const Chunk c = chunk(n, ranks, r);
        EXPECT_EQ(c.offset, next) << n << " " << ranks << " " << r;
        EXPECT_TRUE(c.count == n / ranks || c.count == n / ranks + 1);
        EXPECT_EQ(c.count, n / ranks + (r < n % ranks ? 1 : 0));
        next += c.count;
      }
      EXPECT_EQ(next, n);
    }
  }
  EXPECT_THROW(chunk(10, 0, 0), InvalidArgument);
  EXPECT_THROW(chunk(10, 2, 2), InvalidArgument);
  EXPECT_THROW(chunk(-1, 2, 0), InvalidArgument);
}

TEST(LocalCommunicator, EveryCollectiveIsTheIdentityOnOneRank) {
  CpuBackend be;
  LocalCommunicator c(be);
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  std::vector<float> x(10);
  std::iota(x.begin(), x.end(), 1.0f);
  const std::vector<float> x0 = x;
  const Tensor t(x.data(), Shape{2, 5}, DType::kF32, Device::kCpu);
  c.all_reduce_sum(kDefaultStream, t);
  EXPECT_EQ(x, x0);
  std::vector<float> shard(10, 0.0f);
  c.reduce_scatter_sum(kDefaultStream, t, Tensor(shard.data(), Shape{10}, DType::kF32, Device::kCpu));
  EXPECT_EQ(shard, x0);
  std::vector<float> out(10, 0.0f);
  c.all_gather(kDefaultStream, Tensor(shard.data(), Shape{10}, DType::kF32, Device::kCpu),
               Tensor(out.data(), Shape{5, 2}, DType::kF32, Device::kCpu));
  EXPECT_EQ(out, x0);
  c.broadcast(kDefaultStream, t, 0);
  EXPECT_EQ(x, x0);
  c.barrier();
}

TEST(LocalCommunicator, RefusesWhatDoesNotFitTheCall) {
  CpuBackend be;
  LocalCommunicator c(be);
  std::vector<float> a(8), b(6);
  std::vector<std::uint16_t> h(8);
  const Tensor f8(a.data(), Shape{8}, DType::kF32, Device::kCpu);
  const Tensor f6(b.data(), Shape{6}, DType::kF32, Device::kCpu);
  const Tensor b8(h.data(), Shape{8}, DType::kBF16, Device::kCpu);
  const auto says = [](auto&& call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected: " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  says([&] { c.all_reduce_sum(kDefaultStream, b8); }, "valid: float32");
  says([&] { c.reduce_scatter_sum(kDefaultStream, f8, f6); }, "shard of 8 elements");
  says([&] { c.all_gather(kDefaultStream, b8, f8); }, "the same dtype");
  says([&] { c.broadcast(kDefaultStream, f8, 1); }, "valid: 0 <= root < 1");
}

// Sets (or, with nullptr, clears) an environment variable for one test.
class Env {
 public:
  Env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1); else unsetenv(name);
  }
  ~Env() {
    if (had_) setenv(name_, old_.c_str(), 1); else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(LaunchInfo, ReadsWhatMpirunSetsAndDefaultsToOneRank) {
  {
    Env a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr);
    const LaunchInfo l = launch_info();
    EXPECT_EQ(l.world_size, 1);
    EXPECT_EQ(l.rank, 0);
    EXPECT_EQ(l.launcher, "");
  }
  {
    Env a("OMPI_COMM_WORLD_SIZE", "4"), b("OMPI_COMM_WORLD_RANK", "3"),
        c("OMPI_COMM_WORLD_LOCAL_RANK", "1");
    const LaunchInfo l = launch_info();
    EXPECT_EQ(l.world_size, 4);
    EXPECT_EQ(l.rank, 3);
    EXPECT_EQ(l.local_rank, 1);
    EXPECT_EQ(l.launcher, "mpirun");
  }
  {
    Env a("OMPI_COMM_WORLD_SIZE", "two"), b("PMI_SIZE", nullptr);  // not a number: not launched
    EXPECT_EQ(launch_info().world_size, 1);
  }
}

TEST(MakeCommunicator, OneRankIsLocal) {
  Env a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr);
  CpuBackend be;
  EXPECT_STREQ(make_communicator(be)->name(), "local");
}

}  // namespace
}  // namespace memfit
