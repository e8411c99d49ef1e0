// Communicator: the collectives that ranks of a data-parallel run use, behind one narrow
// interface (as MemoryProvider is for memory): a sum over ranks, its scattered form, a gather,
// a broadcast and a barrier. Implementations: LocalCommunicator (one rank: every collective is
// the identity), MpiCommunicator (core/comm/mpi_communicator.h, CPU ranks under mpirun; built
// when OpenMPI is found), and NCCL for CUDA ranks (bootstrapped through MPI).
//
//   std::unique_ptr<Communicator> c = make_communicator(backend);  // MPI under mpirun, else local
//   c->all_reduce_sum(kDefaultStream, grad);       // every rank: the same sum, the same bits
//   c->reduce_scatter_sum(kDefaultStream, grad, shard);   // rank r: the sum of chunk r
//   c->all_gather(kDefaultStream, shard, full);           // chunk r from rank r, in rank order
//
// Chunks. A tensor of n elements split over N ranks: chunk r holds elements
// [offset(r), offset(r) + count(r)), count = n / N, the first n % N chunks one more (chunk()).
// Uneven n is allowed everywhere; `shard`/`in` tensors hold count(rank) elements.
//
// Order and bits. Sums run in float32 in rank order, ((x0 + x1) + x2) + ..., each element by
// the rank that owns its chunk, then gathered: every rank gets the same bits, a run repeats
// its bits at the same N, and N = 1 returns the input unchanged. Across N only that order
// differs (what DESIGN.md's "within 1e-6 relative" allows).
//
// Streams. A collective is ordered after the work queued before it on `stream` and before the
// work queued after it (the MPI implementation waits for the stream, runs the collective on
// the calling thread, and returns when it is done; NCCL enqueues it). Tensors must live in
// memory the implementation reaches (host memory for MPI); the meta device does nothing.
//
// Overlap. start_all_reduce_sum / start_reduce_scatter_sum begin the same sums behind the work
// queued on `stream` so far and return at once with a ticket, so the collective runs beside the
// caller's later work (the backward's next stage); finish(stream, t) orders the work queued on
// `stream` after it behind every collective started up to ticket t. Until then the tensors
// must stay alive, their inputs unwritten and their outputs unread. Tickets count up from 1 in
// the order started; a collective called without start_ first finishes every started one (so
// the ranks' collectives run in one order, the order they were called in). Every rank starts
// and finishes the same collectives in the same order. overlaps() says whether started ones
// really run beside the caller: MPI runs them on a thread of its own, NCCL on a stream of its
// own; the local and simulated communicators run them at once, finish() has nothing to wait for.
// Where they finish is the caller's choice and the same in a dry run as in the real run, so
// the memory they hold until then is predicted exactly.
//
// Errors: InvalidArgument for shapes or dtypes that do not fit the call (naming both), and
// CommError when the transport fails, naming the call, this rank and the transport's message.
// A started collective's error is thrown by finish() (or the next collective) instead.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"

namespace memfit {

// Chunk r of n elements over `ranks`: its first element and its length.
struct Chunk {
  std::int64_t offset = 0;
  std::int64_t count = 0;
};
Chunk chunk(std::int64_t n, int ranks, int r);
// Chunk r of `t` over `ranks`, as a flat view (Shape{count}) of its elements.
Tensor chunk_view(const Tensor& t, int ranks, int r);

class Communicator {
 public:
  virtual ~Communicator();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;  // "local", "mpi", "nccl"

  // x (float32, every rank the same numel) becomes the sum over ranks of x, in place.
  virtual void all_reduce_sum(StreamId stream, const Tensor& x) = 0;
  // shard (float32, chunk(in.numel(), size(), rank()).count elements) = the sum over ranks of
  // chunk rank() of `in` (float32, every rank the same numel).
  virtual void reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard) = 0;
  // out (any dtype, every rank the same numel n) gets chunk r of n from rank r's `shard` (the
  // same dtype, chunk(n, size(), rank()).count elements), for every r.
  virtual void all_gather(StreamId stream, const Tensor& shard, const Tensor& out) = 0;
  // x (any dtype) becomes root's x on every rank.
  virtual void broadcast(StreamId stream, const Tensor& x, int root) = 0;
  // Returns once every rank has called it (and its queued work on the default stream is done).
  virtual void barrier() = 0;
  // Every rank's `v`, in rank order, the same on every rank: the few host-side figures ranks
  // must agree on (batch rows, losses, gradient norms). By default one all_gather of a host
  // tensor (each double as the bits of two float32 slots); NCCL, which gathers device memory
  // only, does it through MPI.
  virtual std::vector<double> gather_values(double v);

  // ---- overlap (see above) ----
  using Ticket = std::uint64_t;
  // Check as the calls above do (InvalidArgument at once), then begin. By default: run the
  // blocking call now and return the next ticket.
  virtual Ticket start_all_reduce_sum(StreamId stream, const Tensor& x);
  virtual Ticket start_reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard);
  // InvalidArgument for a ticket not yet started. By default nothing is left to wait for.
  virtual void finish(StreamId stream, Ticket ticket);
  virtual bool overlaps() const { return false; }
  // The last ticket started (0 before the first).
  Ticket last_ticket() const { return last_ticket_; }

 protected:
  // The next ticket, counted by the implementation that starts one.
  Ticket next_ticket() { return ++last_ticket_; }
  void check_ticket(Ticket ticket) const;
  // The shape and dtype checks every implementation makes first (InvalidArgument).
  void check_all_reduce(const Tensor& x) const;
  void check_reduce_scatter(const Tensor& in, const Tensor& shard) const;
  void check_all_gather(const Tensor& shard, const Tensor& out) const;
  void check_broadcast(int root) const;

 private:
  Ticket last_ticket_ = 0;
};

// One rank: all_reduce_sum and broadcast leave x as it is, reduce_scatter_sum and all_gather
// copy (on `backend`, in stream order).
class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(Backend& backend) : backend_(backend) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "local"; }
  void all_reduce_sum(StreamId stream, const Tensor& x) override;
  void reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard) override;
  void all_gather(StreamId stream, const Tensor& shard, const Tensor& out) override;
  void broadcast(StreamId stream, const Tensor& x, int root) override;
  void barrier() override;

 private:
  Backend& backend_;
};

// A dry run's stand-in for rank `rank` of `size` (policies/dry_run.h), and a test's: every
// collective checks its shapes as a real one would, then acts as if every other rank held
// what this one holds: all_reduce_sum and reduce_scatter_sum give size() times this rank's
// values (added in rank order, as the real sums), all_gather writes this rank's chunk and
// leaves the other chunks as they were. Tensors on the meta device are not touched; tensors
// in host memory (the CPU backend's, the trainer's figures) get those values. It allocates
// nothing, as the MPI communicator allocates nothing from the caching allocator, so a dry run
// with it reserves what that rank of a real run reserves.
class SimulatedCommunicator final : public Communicator {
 public:
  // InvalidArgument unless size >= 1 and 0 <= rank < size.
  SimulatedCommunicator(Backend& backend, int size, int rank);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "simulated"; }
  void all_reduce_sum(StreamId stream, const Tensor& x) override;
  void reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard) override;
  void all_gather(StreamId stream, const Tensor& shard, const Tensor& out) override;
  void broadcast(StreamId stream, const Tensor& x, int root) override;
  void barrier() override;

 private:
  Backend& backend_;
  int size_, rank_;
};

// comm.gather_values(v): every rank's `v`, in rank order, the same on every rank.
inline std::vector<double> gather_values(Communicator& comm, double v) {
  return comm.gather_values(v);
}

// What launched this process: the world size and this rank as mpirun (OpenMPI's
// OMPI_COMM_WORLD_SIZE/RANK, or PMI_SIZE/PMI_RANK, PMIX_RANK) says, {1, 0} when nothing did.
struct LaunchInfo {
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;
  std::string launcher;  // "mpirun", or "" when not launched by one
};
LaunchInfo launch_info();

// The communicator for this process on `backend`: MPI when launched by mpirun with more than
// one rank (InvalidArgument when this build has no MPI, saying how to get it), else local.
// A CUDA backend's ranks get NCCL instead (core/comm/nccl_communicator.h; InvalidArgument when
// this build has no NCCL, saying how to get it).
std::unique_ptr<Communicator> make_communicator(Backend& backend);

}  // namespace memfit
