#include "core/comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "memory/error.h"

#ifdef MEMFIT_HAVE_MPI
#include "core/comm/mpi_communicator.h"
#endif

namespace memfit {
namespace {

std::string describe(const Tensor& t) {
  return t.shape().str() + " " + dtype_name(t.dtype());
}

Tensor flat(const Tensor& t) { return t.reshape(Shape{t.numel()}); }

// An environment variable as a non-negative int; -1 when unset or not one.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 24)) return -1;
  return static_cast<int>(x);
}

}  // namespace

Chunk chunk(std::int64_t n, int ranks, int r) {
  if (n < 0 || ranks < 1 || r < 0 || r >= ranks) {
    throw InvalidArgument("chunk: n = " + std::to_string(n) + ", ranks = " +
                          std::to_string(ranks) + ", r = " + std::to_string(r) +
                          "; valid: n >= 0, ranks >= 1, 0 <= r < ranks");
  }
  const std::int64_t base = n / ranks, extra = n % ranks;
  return {r * base + std::min<std::int64_t>(r, extra), base + (r < extra ? 1 : 0)};
}

Communicator::~Communicator() = default;

void Communicator::check_all_reduce(const Tensor& x) const {
  if (x.dtype() != DType::kF32) {
    throw InvalidArgument(std::string(name()) + " all_reduce_sum: x is " + describe(x) +
                          "; valid: float32 (sums run in float32)");
  }
}

void Communicator::check_reduce_scatter(const Tensor& in, const Tensor& shard) const {
  const Chunk c = chunk(in.numel(), size(), rank());
  if (in.dtype() != DType::kF32 || shard.dtype() != DType::kF32 || shard.numel() != c.count) {
    throw InvalidArgument(std::string(name()) + " reduce_scatter_sum on rank " +
                          std::to_string(rank()) + " of " + std::to_string(size()) + ": in " +
                          describe(in) + ", shard " + describe(shard) + "; valid: both float32, " +
                          "shard of " + std::to_string(c.count) + " elements (chunk " +
                          std::to_string(rank()) + ")");
  }
}

void Communicator::check_all_gather(const Tensor& shard, const Tensor& out) const {
  const Chunk c = chunk(out.numel(), size(), rank());
  if (shard.dtype() != out.dtype() || shard.numel() != c.count) {
    throw InvalidArgument(std::string(name()) + " all_gather on rank " + std::to_string(rank()) +
                          " of " + std::to_string(size()) + ": shard " + describe(shard) +
                          ", out " + describe(out) + "; valid: the same dtype, shard of " +
                          std::to_string(c.count) + " elements (chunk " + std::to_string(rank()) +
                          ")");
  }
}

void Communicator::check_broadcast(int root) const {
  if (root < 0 || root >= size()) {
    throw InvalidArgument(std::string(name()) + " broadcast: root " + std::to_string(root) +
                          "; valid: 0 <= root < " + std::to_string(size()));
  }
}

void LocalCommunicator::all_reduce_sum(StreamId, const Tensor& x) { check_all_reduce(x); }

void LocalCommunicator::reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard) {
  check_reduce_scatter(in, shard);
  if (in.raw() != shard.raw()) backend_.copy(stream, flat(in), flat(shard));
}

void LocalCommunicator::all_gather(StreamId stream, const Tensor& shard, const Tensor& out) {
  check_all_gather(shard, out);
  if (shard.raw() != out.raw()) backend_.copy(stream, flat(shard), flat(out));
}

void LocalCommunicator::broadcast(StreamId, const Tensor&, int root) { check_broadcast(root); }

void LocalCommunicator::barrier() { backend_.synchronize(kDefaultStream); }

LaunchInfo launch_info() {
  LaunchInfo l;
  const int ompi_size = env_int("OMPI_COMM_WORLD_SIZE");
  const int pmi_size = env_int("PMI_SIZE");
  if (ompi_size >= 1) {
    l.world_size = ompi_size;
    l.rank = std::max(0, env_int("OMPI_COMM_WORLD_RANK"));
    l.local_rank = std::max(0, env_int("OMPI_COMM_WORLD_LOCAL_RANK"));
    l.launcher = "mpirun";
  } else if (pmi_size >= 1) {
    l.world_size = pmi_size;
    l.rank = std::max(0, env_int("PMI_RANK"));
    l.local_rank = std::max(0, env_int("MPI_LOCALRANKID"));
    l.launcher = "mpirun";
  }
  return l;
}

std::unique_ptr<Communicator> make_communicator(Backend& backend) {
  const LaunchInfo l = launch_info();
  if (l.world_size <= 1) return std::make_unique<LocalCommunicator>(backend);
#ifdef MEMFIT_HAVE_MPI
  return std::make_unique<MpiCommunicator>(backend);
#else
  throw InvalidArgument("launched by " + l.launcher + " as rank " + std::to_string(l.rank) +
                        " of " + std::to_string(l.world_size) +
                        ", but this memfit was built without MPI; valid: a build with OpenMPI "
                        "(Debian libopenmpi-dev, found by CMake's FindMPI: MEMFIT_MPI=AUTO), or "
                        "one rank");
#endif
}

}  // namespace memfit
