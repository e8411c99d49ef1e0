#include "core/comm/nccl_communicator.h"

#include <mpi.h>
#include <nccl.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "core/comm/mpi_world.h"
#include "memory/cuda/cuda_check.h"
#include "memory/error.h"

static_assert(std::is_same_v<ncclComm_t, ncclComm*>, "nccl_communicator.h's forward declaration");

namespace memfit {
namespace {

void mpi_check(int code, const char* call, int rank) {
  memfit::mpi_check(code, std::string("nccl communicator: ") + call, rank);
}

// NCCL's message for `code`, and its last error's detail when it says more (for example
// "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device ...").
void nccl_check(ncclResult_t code, const std::string& call, int rank, ncclComm_t comm) {
  if (code == ncclSuccess) return;
  std::string msg =
      "nccl " + call + " failed on rank " + std::to_string(rank) + ": " + ncclGetErrorString(code);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') msg += " (" + std::string(last) + ")";
  throw CommError(msg);
}

std::string describe(const Tensor& t) {
  return t.shape().str() + " " + dtype_name(t.dtype()) + " on " + device_name(t.device());
}

}  // namespace

NcclCommunicator::NcclCommunicator(CudaBackend& backend)
    : backend_(backend), device_(backend.options().device) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  mpi_ = initialized != 0 || launch_info().world_size > 1;
  if (mpi_) {
    const MpiWorld w = mpi_world();  // with 2+ ranks a failing rank stops the others
    rank_ = w.rank;
    size_ = w.size;
  }
  ncclUniqueId id{};
  if (rank_ == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", rank_, nullptr);
  if (size_ > 1) {
    mpi_check(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD),
              "MPI_Bcast (ncclUniqueId)", rank_);
  }
  // NCCL binds the communicator to the current device: the backend's, whose streams it uses.
  cuda::DeviceGuard guard(device_);
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, size_, id, rank_),
             "ncclCommInitRank (" + std::to_string(size_) + " ranks, CUDA device " +
                 std::to_string(device_) + ")",
             rank_, comm);
  try {
    comm_stream_ = backend_.create_stream();
  } catch (...) {
    (void)ncclCommDestroy(comm);
    throw;
  }
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  // Errors are ignored: at exit the runtime may be unloading, and a broken communicator was
  // reported by the call that broke it. Events left behind go with the backend.
  try {
    backend_.destroy_stream(comm_stream_);  // waits for the started collectives first
    for (const Started& s : unfinished_) {
      if (s.event != 0) backend_.release_event(s.event);
    }
    if (finished_.event != 0) backend_.release_event(finished_.event);
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
  if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
}

bool NcclCommunicator::on_device(const char* call, const Tensor& t) const {
  if (t.device() == Device::kMeta) return false;
  if (t.device() != Device::kCuda) {
    throw InvalidArgument(std::string("nccl ") + call + " on rank " + std::to_string(rank_) +
                          ": a tensor in host memory (" + describe(t) +
                          "); valid: device memory (CPU ranks use MPI)");
  }
  return true;
}

// ---- streams of the blocking and the started collectives ----------------------------------

cudaStream_t NcclCommunicator::blocking_stream(StreamId stream) {
  if (!unfinished_.empty()) finish(stream, last_ticket());  // every rank: one order of calls
  return backend_.cuda_stream(stream);
}

cudaStream_t NcclCommunicator::started_stream(StreamId stream) {
  const EventHandle queued = backend_.record_event(stream);
  backend_.wait_event(comm_stream_, queued);
  backend_.release_event(queued);  // the wait has captured it; the pool may record it again
  return backend_.cuda_stream(comm_stream_);
}

Communicator::Ticket NcclCommunicator::started() {
  const EventHandle done = backend_.record_event(comm_stream_);
  const Ticket t = next_ticket();
  unfinished_.push_back({t, done});
  return t;
}

void NcclCommunicator::finish(StreamId stream, Ticket ticket) {
  check_ticket(ticket);
  // The newest event at or before `ticket` covers it and every earlier one: keep only that.
  while (!unfinished_.empty() && unfinished_.front().ticket <= ticket) {
    if (finished_.event != 0) backend_.release_event(finished_.event);
    finished_ = unfinished_.front();
    unfinished_.pop_front();
  }
  // A ticket older than finished_ waits for a little more than it needs: still correct.
  if (finished_.event != 0) backend_.wait_event(stream, finished_.event);
}

// ---- the collectives -----------------------------------------------------------------------

void NcclCommunicator::all_reduce_sum(StreamId stream, const Tensor& x) {
  check_all_reduce(x);
  if (!on_device("all_reduce_sum", x)) return;
  enqueue_all_reduce(x, blocking_stream(stream));
}

Communicator::Ticket NcclCommunicator::start_all_reduce_sum(StreamId stream, const Tensor& x) {
  check_all_reduce(x);
  if (!on_device("all_reduce_sum", x)) return next_ticket();
  enqueue_all_reduce(x, started_stream(stream));
  return started();
}

void NcclCommunicator::enqueue_all_reduce(const Tensor& x, cudaStream_t s) {
  if (x.numel() == 0) return;
  nccl_check(ncclAllReduce(x.raw(), x.raw(), static_cast<std::size_t>(x.numel()), ncclFloat,
                           ncclSum, comm_, s),
             "ncclAllReduce (all_reduce_sum)", rank_, comm_);
}

void NcclCommunicator::reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard) {
  check_reduce_scatter(in, shard);
  const bool in_dev = on_device("reduce_scatter_sum", in);
  const bool shard_dev = on_device("reduce_scatter_sum", shard);
  if (!in_dev || !shard_dev) return;
  enqueue_reduce_scatter(in, shard, blocking_stream(stream));
}

Communicator::Ticket NcclCommunicator::start_reduce_scatter_sum(StreamId stream, const Tensor& in,
                                                                const Tensor& shard) {
  check_reduce_scatter(in, shard);
  const bool in_dev = on_device("reduce_scatter_sum", in);
  const bool shard_dev = on_device("reduce_scatter_sum", shard);
  if (!in_dev || !shard_dev) return next_ticket();
  enqueue_reduce_scatter(in, shard, started_stream(stream));
  return started();
}

// One group of reduces, chunk r to root r: the uneven chunks need no padding (header).
void NcclCommunicator::enqueue_reduce_scatter(const Tensor& in, const Tensor& shard,
                                              cudaStream_t s) {
  const auto* src = static_cast<const float*>(in.raw());
  nccl_check(ncclGroupStart(), "ncclGroupStart (reduce_scatter_sum)", rank_, comm_);
  ncclResult_t first = ncclSuccess;
  for (int r = 0; r < size_ && first == ncclSuccess; ++r) {
    const Chunk c = chunk(in.numel(), size_, r);
    if (c.count == 0) continue;                       // every rank skips the same chunks
    void* recv = r == rank_ ? shard.raw() : nullptr;  // recvbuff is read on the root only
    first = ncclReduce(src + c.offset, recv, static_cast<std::size_t>(c.count), ncclFloat, ncclSum,
                       r, comm_, s);
  }
  const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after an error
  nccl_check(first, "ncclReduce (reduce_scatter_sum)", rank_, comm_);
  nccl_check(end, "ncclGroupEnd (reduce_scatter_sum)", rank_, comm_);
}

// One group of broadcasts, chunk r from root r, as bytes: any dtype, uneven chunks.
void NcclCommunicator::all_gather(StreamId stream, const Tensor& shard, const Tensor& out) {
  check_all_gather(shard, out);
  const bool shard_dev = on_device("all_gather", shard);
  const bool out_dev = on_device("all_gather", out);
  if (!shard_dev || !out_dev) return;
  const cudaStream_t s = blocking_stream(stream);
  const std::size_t elem = dtype_size(out.dtype());
  auto* dst = static_cast<char*>(out.raw());
  nccl_check(ncclGroupStart(), "ncclGroupStart (all_gather)", rank_, comm_);
  ncclResult_t first = ncclSuccess;
  for (int r = 0; r < size_ && first == ncclSuccess; ++r) {
    const Chunk c = chunk(out.numel(), size_, r);
    if (c.count == 0) continue;
    void* recv = dst + static_cast<std::size_t>(c.offset) * elem;
    // On the root, in place when the shard is its own chunk of `out`; elsewhere sendbuff is
    // not read, and recv stands in for it.
    const void* send = r == rank_ ? shard.raw() : recv;
    first =
        ncclBroadcast(send, recv, static_cast<std::size_t>(c.count) * elem, ncclChar, r, comm_, s);
  }
  const ncclResult_t end = ncclGroupEnd();
  nccl_check(first, "ncclBroadcast (all_gather)", rank_, comm_);
  nccl_check(end, "ncclGroupEnd (all_gather)", rank_, comm_);
}

void NcclCommunicator::broadcast(StreamId stream, const Tensor& x, int root) {
  check_broadcast(root);
  if (!on_device("broadcast", x) || x.nbytes() == 0) return;
  const cudaStream_t s = blocking_stream(stream);
  nccl_check(ncclBroadcast(x.raw(), x.raw(), x.nbytes(), ncclChar, root, comm_, s),
             "ncclBroadcast (broadcast)", rank_, comm_);
}

std::vector<double> NcclCommunicator::gather_values(double v) {
  std::vector<double> all(static_cast<std::size_t>(size_), v);
  (void)blocking_stream(kDefaultStream);  // finishes the started ones, as every collective
  if (mpi_ && size_ > 1) {
    mpi_check(MPI_Allgather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD),
              "MPI_Allgather (gather_values)", rank_);
  }
  return all;
}

void NcclCommunicator::barrier() {
  (void)blocking_stream(kDefaultStream);  // the started collectives are done too,
  if (finished_.event != 0) backend_.wait_event(kDefaultStream, finished_.event);  // finished ones
  backend_.synchronize(kDefaultStream);
  if (mpi_ && size_ > 1) mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier", rank_);
}

}  // namespace memfit
