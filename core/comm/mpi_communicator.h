// MpiCommunicator: Communicator (communicator.h) among the ranks of MPI_COMM_WORLD, for CPU
// ranks under mpirun (OpenMPI). Built only when CMake finds MPI (MEMFIT_HAVE_MPI).
//
//   mpirun -np 2 memfit train ... --ranks 2      // each process: make_communicator(backend)
//
// The first one initializes MPI (core/comm/mpi_world.h: MPI_THREAD_SERIALIZED, finalized at
// exit) unless the program did. Errors come back as CommError naming the call, the rank and
// MPI's message.
//
// Each collective waits for `stream`, then runs on the calling thread. A started one
// (start_all_reduce_sum, start_reduce_scatter_sum) waits for `stream`, then is queued for the
// communicator's own thread (made at the first start), which runs the queue in order while
// the caller goes on; finish() blocks until the ticket's collective is done. An error is
// sticky: the queued collectives after it are skipped and every later finish() and collective
// throws it, so the ranks stop rather than mismatch.
// A blocking collective first finishes every started one, so only one thread is ever inside
// MPI (MPI_THREAD_SERIALIZED). Where MPI was initialized with less (a program's own
// MPI_Init), started collectives run at once on the caller and overlaps() is false.
// Sums are deterministic (communicator.h): reduce_scatter_sum exchanges chunks with one
// MPI_Alltoallv and each rank adds the N copies of its chunk in rank order; all_reduce_sum is
// that then an all_gather. The exchange's receive buffer (the tensor's size) and
// all_reduce_sum's shard, on the heap, are kept between calls.
// Meta tensors (dry runs) are checked and not sent. With two or more ranks a failing rank
// stops the others (mpi_world()'s stop_all_ranks).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/comm/communicator.h"

namespace memfit {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(Backend& backend);
  ~MpiCommunicator() override;  // finishes the queue, then stops the thread
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }
  void all_reduce_sum(StreamId stream, const Tensor& x) override;
  void reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard) override;
  void all_gather(StreamId stream, const Tensor& shard, const Tensor& out) override;
  void broadcast(StreamId stream, const Tensor& x, int root) override;
  void barrier() override;
  Ticket start_all_reduce_sum(StreamId stream, const Tensor& x) override;
  Ticket start_reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard) override;
  void finish(StreamId stream, Ticket ticket) override;
  bool overlaps() const override { return threaded_; }

 private:
  Ticket start(std::function<void()> op);  // queued (or run now without the thread)
  void drain();                            // every started collective finished
  void throw_if_failed();                  // the sticky error, if any
  void run_queue();                        // the thread's loop
  void reduce_scatter(const float* in, std::int64_t n, float* shard);
  void gather_bytes(const void* shard, std::int64_t n, std::size_t elem, void* out);
  void ready(StreamId stream, const Tensor& t) const;  // host memory, stream drained

  Backend& backend_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<float> recv_;   // used by one collective at a time (the queue runs in order)
  std::vector<float> shard_;
  // Started collectives: queued ops, how many are done, the first error.
  bool threaded_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  Ticket done_ = 0;
  std::exception_ptr error_;  // sticky: the first collective that failed
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace memfit
