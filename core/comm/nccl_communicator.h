// NcclCommunicator: Communicator (communicator.h) among CUDA ranks, one process and one GPU per
// rank, over NCCL, bootstrapped through MPI as llm.c does. Built only when CMake finds CUDA,
// MPI and NCCL (MEMFIT_HAVE_NCCL); make_communicator() returns it for a CudaBackend under
// mpirun with more than one rank.
//
//   CudaBackend be({.device = launch_info().local_rank % device_count});   // one GPU per rank
//   NcclCommunicator comm(be);                   // mpirun -np N: every rank, the same order
//   comm.all_reduce_sum(kDefaultStream, grad);   // enqueued on the stream; returns at once
//
// Bootstrap. With more than one rank (mpirun's environment, launch_info()) or with MPI already
// initialized, MPI is initialized unless the program did (MPI_Init_thread, SERIALIZED, finalized
// at exit, as MpiCommunicator), rank 0 makes the ncclUniqueId and MPI_Bcast sends its bytes to
// the others, and every rank calls ncclCommInitRank(size, id, rank) with MPI_COMM_WORLD's rank
// and size. A lone process (no mpirun) makes a 1-rank communicator without MPI at all.
//
// Device. The communicator runs on the backend's device (CudaBackendOptions::device), made
// current before ncclCommInitRank: NCCL binds a communicator to the current device and its
// collectives must run on streams of that device, which are the backend's. Choosing one GPU
// per rank, local_rank % device count, is therefore the backend's creator's job. NCCL refuses
// two ranks of one communicator on one GPU ("Duplicate GPU detected", ncclInvalidUsage: init.cc
// of NCCL 2.x), which surfaces here as CommError.
//
// Collectives are enqueued on the cudaStream_t of `stream` (ordered after the work queued
// before them, before the work queued after them) and return without waiting:
// - all_reduce_sum: ncclAllReduce(ncclSum, ncclFloat), in place.
// - reduce_scatter_sum: memfit's chunks may be uneven (chunk(): the first n % N chunks hold one
//   element more), ncclReduceScatter takes equal counts only. It is done as one NCCL group of
//   ncclReduce calls, one per non-empty chunk r with rank r as root, each writing straight into
//   rank r's shard (in place when the shard is this rank's chunk of `in`). Chosen over padding
//   into a scratch buffer because it allocates nothing: padding would need up to the tensor's
//   size again in device memory per call, outside the caching allocator's accounting, and the
//   dry run (SimulatedCommunicator, which allocates nothing) predicts every rank's peak to the
//   byte. The group runs as one fused operation, and each rank sends about what a ring
//   reduce-scatter sends, (N-1)/N of n elements (its own chunk stays put), in N smaller pieces.
// - all_gather: one NCCL group of ncclBroadcast calls, one per non-empty chunk r with rank r as
//   root, from rank r's shard into chunk r of `out` on every rank, in place when the shard is
//   this rank's chunk of `out`. Any dtype, sent as bytes (ncclChar).
// - broadcast: ncclBroadcast of x's bytes (ncclChar) from root, in place.
// - barrier: waits for the default stream, then MPI_Barrier (one rank: the wait alone).
// Tensors must be contiguous; a shard aliasing `in`/`out` anywhere but this rank's chunk is not
// supported (as for the other implementations).
//
// Overlap (overlaps() is true), as PyTorch DDP does it. The communicator owns a stream of its
// own, made by the backend on its device. start_all_reduce_sum / start_reduce_scatter_sum make
// that stream wait (an event) for the work queued on `stream` so far, enqueue there the same
// NCCL calls as the blocking forms, and record the ticket's event behind them; finish(stream, t)
// makes `stream` wait for t's event, which covers every earlier ticket (one stream completes in
// order), and hands the events up to t back to the backend's pool. A blocking collective first
// makes its stream wait for every unfinished started one. Memory a started collective uses must
// not be freed or reused before finish(): the caching allocator gets this right when the caller
// frees only after finish(stream, t), because its stream-ordered reuse then comes behind the
// communicator's stream.
//
// Order and bits. NCCL sums in its own order (ring or tree, chosen per size and topology), not
// memfit's rank order, so results across N differ from the CPU ranks' by reduction order only
// (DESIGN.md's "within 1e-6 relative"), and reduce_scatter_sum (a reduce per chunk) and
// all_reduce_sum may round differently from each other. Every rank gets the same bits (NCCL
// transmits the finished sum unchanged: NVIDIA/nccl#855). NCCL's documentation makes no
// promise of bitwise reproducibility; what its maintainers say is that a fixed configuration
// (sizes, rank-to-GPU mapping, topology, NCCL version, algorithm and protocol) reduces in a
// fixed order and so repeats its bits (NVIDIA/nccl#157, where they also note that only a
// reduce to a fixed root fixes the order across layouts), except for NVLS (NVLink SHARP,
// in-switch reductions), which is not deterministic between calls (NVIDIA/nccl#1497): set
// NCCL_NVLS_ENABLE=0, and pin NCCL_ALGO/NCCL_PROTO, where repeated bits matter.
//
// Memory. Meta tensors (dry runs) are checked and left alone (a started one still gets a
// ticket). Host tensors (Device::kCpu, pinned or not) are refused with InvalidArgument naming
// the call: NCCL needs device memory, CPU ranks use MPI. gather_values() (host figures) goes
// through MPI_Allgather. NCCL's own buffers (per peer, set by NCCL_BUFFSIZE, ~4 MiB per channel
// by default) are device memory outside the caching allocator, taken at ncclCommInitRank and
// when peers connect.
//
// Errors: InvalidArgument for shapes, dtypes and host tensors; CommError naming the call, this
// rank and ncclGetErrorString (or MPI's / the CUDA runtime's message) when a call fails. NCCL
// reports some failures only asynchronously (a peer gone); those show at the next call or as a
// hang, as with NCCL anywhere.
//
// Thread safety: one thread uses a communicator (NCCL communicators are not thread-safe, and
// MPI calls come from that thread). The destructor waits for its own stream, then calls
// ncclCommDestroy: destroy the communicator once the blocking collectives it queued are done
// (synchronize the streams they ran on, or barrier()).
//
// Not yet run: this file compiles in every CUDA+MPI+NCCL build, but no GPU has run it when it
// was written. tests/gpu/nccl_communicator_test.cpp checks one rank on one GPU against the
// local communicator; more than one rank (the uneven chunks for real) needs one GPU per rank.
#pragma once

#include <deque>

#include "core/comm/communicator.h"
#include "core/cuda/cuda_backend.h"

struct ncclComm;  // nccl.h's ncclComm_t is `struct ncclComm*`; its users need no NCCL headers

namespace memfit {

class NcclCommunicator final : public Communicator {
 public:
  // Bootstraps as above; CommError when MPI, the CUDA runtime or NCCL fails (naming the call).
  explicit NcclCommunicator(CudaBackend& backend);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }
  int device() const { return device_; }
  void all_reduce_sum(StreamId stream, const Tensor& x) override;
  void reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard) override;
  void all_gather(StreamId stream, const Tensor& shard, const Tensor& out) override;
  void broadcast(StreamId stream, const Tensor& x, int root) override;
  void barrier() override;
  std::vector<double> gather_values(double v) override;  // MPI_Allgather (host values)

  Ticket start_all_reduce_sum(StreamId stream, const Tensor& x) override;
  Ticket start_reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard) override;
  void finish(StreamId stream, Ticket ticket) override;
  bool overlaps() const override { return true; }

 private:
  struct Started {
    Ticket ticket = 0;
    EventHandle event = 0;  // on comm_stream_, behind the ticket's NCCL calls; 0: none
  };

  // False for meta tensors (nothing to do); InvalidArgument for host tensors.
  bool on_device(const char* call, const Tensor& t) const;
  // The NCCL calls of the blocking and the started forms, enqueued on `s`.
  void enqueue_all_reduce(const Tensor& x, cudaStream_t s);
  void enqueue_reduce_scatter(const Tensor& in, const Tensor& shard, cudaStream_t s);
  // A blocking collective's stream: `stream`, made to wait for every unfinished started one.
  cudaStream_t blocking_stream(StreamId stream);
  // A started collective's stream: comm_stream_, made to wait for the work queued on `stream`.
  cudaStream_t started_stream(StreamId stream);
  // Records the event of the collective just enqueued on comm_stream_; its ticket.
  Ticket started();

  CudaBackend& backend_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  bool mpi_ = false;  // MPI bootstrapped this communicator (barrier uses it)
  ncclComm* comm_ = nullptr;
  StreamId comm_stream_ = kDefaultStream;  // the started collectives' own stream
  std::deque<Started> unfinished_;         // oldest first
  Started finished_;  // the newest finished: a later finish() of an earlier ticket waits on it
};

}  // namespace memfit
