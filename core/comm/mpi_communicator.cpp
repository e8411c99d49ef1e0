#include "core/comm/mpi_communicator.h"

#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/comm/mpi_world.h"
#include "memory/error.h"

namespace memfit {
namespace {

// MPI counts are ints: a chunk of more than INT_MAX elements is refused, naming the sizes.
int count_of(std::int64_t n, const char* what) {
  if (n > INT_MAX) {
    throw InvalidArgument(std::string("mpi ") + what + ": " + std::to_string(n) +
                          " elements in one rank's chunk; valid: at most " +
                          std::to_string(INT_MAX));
  }
  return static_cast<int>(n);
}

}  // namespace

MpiCommunicator::MpiCommunicator(Backend& backend) : backend_(backend) {
  const MpiWorld w = mpi_world();
  rank_ = w.rank;
  size_ = w.size;
  threaded_ = w.serialized;
}

MpiCommunicator::~MpiCommunicator() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MpiCommunicator::run_queue() {
  for (;;) {
    std::function<void()> op;
    bool skip = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped, and nothing left
      op = std::move(queue_.front());
      queue_.pop_front();
      skip = error_ != nullptr;  // the ranks are out of step: run nothing more
    }
    std::exception_ptr error;
    if (!skip) {
      try {
        op();
      } catch (...) {
        error = std::current_exception();
      }
    }
    {
      const std::lock_guard<std::mutex> lock(mu_);
      ++done_;
      if (error && !error_) error_ = error;
    }
    cv_.notify_all();
  }
}

Communicator::Ticket MpiCommunicator::start(std::function<void()> op) {
  if (!threaded_) {  // MPI allows one thread only: run it now (the earlier ones ran so too)
    throw_if_failed();
    const Ticket t = next_ticket();
    std::exception_ptr error;
    try {
      op();
    } catch (...) {
      error = std::current_exception();
    }
    const std::lock_guard<std::mutex> lock(mu_);
    done_ = t;
    if (error) {
      if (!error_) error_ = error;
      std::rethrow_exception(error);
    }
    return t;
  }
  // The thread and the queue's room first: the ticket is taken only once the op is queued.
  if (!thread_.joinable()) thread_ = std::thread([this] { run_queue(); });
  {
    const std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(op));
  }
  const Ticket t = next_ticket();
  cv_.notify_all();
  return t;
}

void MpiCommunicator::finish(StreamId, Ticket ticket) {
  check_ticket(ticket);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket; });
  if (error_) std::rethrow_exception(error_);
}

void MpiCommunicator::throw_if_failed() {
  const std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

void MpiCommunicator::drain() {
  if (last_ticket() > 0) finish(kDefaultStream, last_ticket());
}

Communicator::Ticket MpiCommunicator::start_all_reduce_sum(StreamId stream, const Tensor& x) {
  check_all_reduce(x);
  if (x.device() == Device::kMeta) return start([] {});
  ready(stream, x);
  float* data = static_cast<float*>(x.raw());
  const std::int64_t n = x.numel();
  return start([this, data, n] {
    shard_.resize(static_cast<std::size_t>(chunk(n, size_, rank_).count));
    reduce_scatter(data, n, shard_.data());
    gather_bytes(shard_.data(), n, sizeof(float), data);
  });
}

Communicator::Ticket MpiCommunicator::start_reduce_scatter_sum(StreamId stream, const Tensor& in,
                                                               const Tensor& shard) {
  check_reduce_scatter(in, shard);
  if (in.device() == Device::kMeta) return start([] {});
  ready(stream, in);
  const float* src = static_cast<const float*>(in.raw());
  float* dst = static_cast<float*>(shard.raw());
  const std::int64_t n = in.numel();
  return start([this, src, n, dst] { reduce_scatter(src, n, dst); });
}

void MpiCommunicator::ready(StreamId stream, const Tensor& t) const {
  if (t.device() == Device::kCuda) {
    throw InvalidArgument("mpi communicator: a tensor in CUDA device memory on rank " +
                          std::to_string(rank_) + "; valid: host memory (CUDA ranks use NCCL)");
  }
  backend_.synchronize(stream);
}

void MpiCommunicator::reduce_scatter(const float* in, std::int64_t n, float* shard) {
  const Chunk mine = chunk(n, size_, rank_);
  std::vector<int> send_counts(size_), send_offsets(size_), recv_counts(size_), recv_offsets(size_);
  for (int r = 0; r < size_; ++r) {
    const Chunk c = chunk(n, size_, r);
    send_counts[r] = count_of(c.count, "reduce_scatter_sum");
    send_offsets[r] = count_of(c.offset, "reduce_scatter_sum");
    recv_counts[r] = count_of(mine.count, "reduce_scatter_sum");
    recv_offsets[r] = count_of(r * mine.count, "reduce_scatter_sum");
  }
  recv_.resize(static_cast<std::size_t>(size_ * mine.count));
  mpi_check(MPI_Alltoallv(in, send_counts.data(), send_offsets.data(), MPI_FLOAT, recv_.data(),
                          recv_counts.data(), recv_offsets.data(), MPI_FLOAT, MPI_COMM_WORLD),
            "MPI_Alltoallv (reduce_scatter_sum)", rank_);
  // Rank order, one element at a time: ((x0 + x1) + x2) + ...
  const std::size_t k = static_cast<std::size_t>(mine.count);
  std::memcpy(shard, recv_.data(), k * sizeof(float));
  for (int r = 1; r < size_; ++r) {
    const float* src = recv_.data() + static_cast<std::size_t>(r) * k;
    for (std::size_t i = 0; i < k; ++i) shard[i] += src[i];
  }
}

void MpiCommunicator::gather_bytes(const void* shard, std::int64_t n, std::size_t elem, void* out) {
  std::vector<int> counts(size_), offsets(size_);
  for (int r = 0; r < size_; ++r) {
    const Chunk c = chunk(n, size_, r);
    counts[r] = count_of(c.count * static_cast<std::int64_t>(elem), "all_gather");
    offsets[r] = count_of(c.offset * static_cast<std::int64_t>(elem), "all_gather");
  }
  // A shard that is this rank's chunk of `out` itself is gathered in place.
  const void* send = shard == static_cast<const char*>(out) + offsets[rank_] ? MPI_IN_PLACE : shard;
  mpi_check(MPI_Allgatherv(send, counts[rank_], MPI_BYTE, out, counts.data(), offsets.data(),
                           MPI_BYTE, MPI_COMM_WORLD),
            "MPI_Allgatherv (all_gather)", rank_);
}

void MpiCommunicator::all_reduce_sum(StreamId stream, const Tensor& x) {
  check_all_reduce(x);
  drain();
  if (x.device() == Device::kMeta) return;
  ready(stream, x);
  float* data = static_cast<float*>(x.raw());
  const Chunk mine = chunk(x.numel(), size_, rank_);
  shard_.resize(static_cast<std::size_t>(mine.count));
  reduce_scatter(data, x.numel(), shard_.data());
  gather_bytes(shard_.data(), x.numel(), sizeof(float), data);
}

void MpiCommunicator::reduce_scatter_sum(StreamId stream, const Tensor& in, const Tensor& shard) {
  check_reduce_scatter(in, shard);
  drain();
  if (in.device() == Device::kMeta) return;
  ready(stream, in);
  reduce_scatter(static_cast<const float*>(in.raw()), in.numel(), static_cast<float*>(shard.raw()));
}

void MpiCommunicator::all_gather(StreamId stream, const Tensor& shard, const Tensor& out) {
  check_all_gather(shard, out);
  drain();
  if (out.device() == Device::kMeta) return;
  ready(stream, out);
  gather_bytes(shard.raw(), out.numel(), dtype_size(out.dtype()), out.raw());
}

void MpiCommunicator::broadcast(StreamId stream, const Tensor& x, int root) {
  check_broadcast(root);
  drain();
  if (x.device() == Device::kMeta) return;
  ready(stream, x);
  char* p = static_cast<char*>(x.raw());
  std::size_t left = x.nbytes();
  while (left > 0) {  // MPI counts are ints
    const int n = static_cast<int>(std::min<std::size_t>(left, INT_MAX));
    mpi_check(MPI_Bcast(p, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast (broadcast)", rank_);
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void MpiCommunicator::barrier() {
  drain();
  backend_.synchronize(kDefaultStream);
  mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier", rank_);
}

}  // namespace memfit
