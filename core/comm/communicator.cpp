#include "core/comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "memory/error.h"

#ifdef MEMFIT_HAVE_MPI
#include "core/comm/mpi_communicator.h"
#endif
#ifdef MEMFIT_HAVE_NCCL
#include "core/comm/nccl_communicator.h"
#endif

namespace memfit {
namespace {

std::string describe(const Tensor& t) { return t.shape().str() + " " + dtype_name(t.dtype()); }

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
    throw InvalidArgument("chunk: n = " + std::to_string(n) + ", ranks = " + std::to_string(ranks) +
                          ", r = " + std::to_string(r) +
                          "; valid: n >= 0, ranks >= 1, 0 <= r < ranks");
  }
  const std::int64_t base = n / ranks, extra = n % ranks;
  return {r * base + std::min<std::int64_t>(r, extra), base + (r < extra ? 1 : 0)};
}

Tensor chunk_view(const Tensor& t, int ranks, int r) {
  const Chunk c = chunk(t.numel(), ranks, r);
  return flat(t).slice0(c.offset, c.offset + c.count);
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

SimulatedCommunicator::SimulatedCommunicator(Backend& backend, int size, int rank)
    : backend_(backend), size_(size), rank_(rank) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgument("simulated communicator: rank " + std::to_string(rank) + " of " +
                          std::to_string(size) + "; valid: size >= 1 and 0 <= rank < size");
  }
}

namespace {

// x *= n on the host (the sum of n equal copies, as float32 adds them in rank order).
void times_ranks(const Tensor& x, int n) {
  float* v = static_cast<float*>(x.raw());
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    float sum = v[i];
    for (int r = 1; r < n; ++r) sum += v[i];
    v[i] = sum;
  }
}

}  // namespace

// Host tensors only get values (memcpy after the stream's work); the meta device none.
void SimulatedCommunicator::all_reduce_sum(StreamId stream, const Tensor& x) {
  check_all_reduce(x);
  if (x.device() != Device::kCpu) return;
  backend_.synchronize(stream);
  times_ranks(x, size_);
}

void SimulatedCommunicator::reduce_scatter_sum(StreamId stream, const Tensor& in,
                                               const Tensor& shard) {
  check_reduce_scatter(in, shard);
  if (in.device() != Device::kCpu || shard.device() != Device::kCpu) return;
  backend_.synchronize(stream);
  const Tensor mine = chunk_view(in, size_, rank_);
  if (mine.raw() != shard.raw() && mine.numel() > 0) {
    std::memmove(shard.raw(), mine.raw(), static_cast<std::size_t>(mine.numel()) * sizeof(float));
  }
  times_ranks(shard, size_);
}

void SimulatedCommunicator::all_gather(StreamId stream, const Tensor& shard, const Tensor& out) {
  check_all_gather(shard, out);
  if (shard.device() != Device::kCpu || out.device() != Device::kCpu) return;
  backend_.synchronize(stream);
  const Tensor mine = chunk_view(out, size_, rank_);
  if (mine.raw() != shard.raw() && mine.numel() > 0) {
    std::memmove(mine.raw(), shard.raw(), mine.nbytes());
  }
}

void SimulatedCommunicator::broadcast(StreamId, const Tensor&, int root) { check_broadcast(root); }

void SimulatedCommunicator::barrier() { backend_.synchronize(kDefaultStream); }

std::vector<double> Communicator::gather_values(double v) {
  Communicator& comm = *this;
  const int n = comm.size();
  // Every slot starts as v: a real gather overwrites each; a simulated one (which leaves the
  // other ranks' chunks as they are) then reads as every rank holding this one's value.
  std::vector<double> all(static_cast<std::size_t>(n), v);
  static_assert(sizeof(double) == 2 * sizeof(float));
  const Tensor whole(all.data(), Shape{2 * static_cast<std::int64_t>(n)}, DType::kF32,
                     Device::kCpu);
  comm.all_gather(kDefaultStream, whole.slice0(2 * comm.rank(), 2 * comm.rank() + 2), whole);
  return all;
}

Communicator::Ticket Communicator::start_all_reduce_sum(StreamId stream, const Tensor& x) {
  all_reduce_sum(stream, x);
  return next_ticket();
}

Communicator::Ticket Communicator::start_reduce_scatter_sum(StreamId stream, const Tensor& in,
                                                            const Tensor& shard) {
  reduce_scatter_sum(stream, in, shard);
  return next_ticket();
}

void Communicator::finish(StreamId, Ticket ticket) { check_ticket(ticket); }

void Communicator::check_ticket(Ticket ticket) const {
  if (ticket < 1 || ticket > last_ticket_) {
    throw InvalidArgument(std::string(name()) + " finish: ticket " + std::to_string(ticket) +
                          " on rank " + std::to_string(rank()) + "; valid: 1 to " +
                          std::to_string(last_ticket_) + " (the tickets started so far)");
  }
}

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
  if (backend.device() == Device::kCuda) {  // CUDA ranks: NCCL (tensors in device memory)
#ifdef MEMFIT_HAVE_NCCL
    auto* cuda = dynamic_cast<CudaBackend*>(&backend);
    if (cuda == nullptr) {
      throw InvalidArgument(std::string("make_communicator: backend '") + backend.name() +
                            "' says its device is cuda but is not a CudaBackend; valid: "
                            "CudaBackend for NCCL ranks");
    }
    return std::make_unique<NcclCommunicator>(*cuda);
#else
    throw InvalidArgument("launched by " + l.launcher + " as rank " + std::to_string(l.rank) +
                          " of " + std::to_string(l.world_size) + " on the " + backend.name() +
                          " backend, but this memfit was built without NCCL; valid: a build "
                          "with the CUDA backend, MPI and NCCL (nccl.h and libnccl in the CUDA "
                          "toolkit or under NCCL_ROOT, found by CMake: see its \"memfit: NCCL "
                          "communicator\" line), or the CPU backend (MPI), or one rank");
#endif
  }
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
