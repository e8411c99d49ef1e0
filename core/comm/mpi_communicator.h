// MpiCommunicator: Communicator (communicator.h) among the ranks of MPI_COMM_WORLD, for CPU
// ranks under mpirun (OpenMPI). Built only when CMake finds MPI (MEMFIT_HAVE_MPI).
//
//   mpirun -np 2 memfit train ... --ranks 2      // each process: make_communicator(backend)
//
// The first one initializes MPI (core/comm/mpi_world.h: MPI_THREAD_FUNNELED, finalized at
// exit) unless the program did. Errors come back as CommError naming the call, the rank and
// MPI's message.
//
// Each collective waits for `stream`, then runs on the calling thread. Sums are deterministic
// (communicator.h): reduce_scatter_sum exchanges chunks with one MPI_Alltoallv and each rank
// adds the N copies of its chunk in rank order; all_reduce_sum is that then an all_gather. The
// exchange's receive buffer (the tensor's size) and all_reduce_sum's shard, on the heap, are
// kept between calls.
// Meta tensors (dry runs) are checked and not sent. With two or more ranks a failing rank
// stops the others (mpi_world()'s stop_all_ranks).
#pragma once

#include <vector>

#include "core/comm/communicator.h"

namespace memfit {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(Backend& backend);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }
  void all_reduce_sum(StreamId stream, const Tensor& x) override;
  void reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard) override;
  void all_gather(StreamId stream, const Tensor& shard, const Tensor& out) override;
  void broadcast(StreamId stream, const Tensor& x, int root) override;
  void barrier() override;

 private:
  void reduce_scatter(const float* in, std::int64_t n, float* shard);
  void gather_bytes(const void* shard, std::int64_t n, std::size_t elem, void* out);
  void ready(StreamId stream, const Tensor& t) const;  // host memory, stream drained

  Backend& backend_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<float> recv_;
  std::vector<float> shard_;
};

}  // namespace memfit
