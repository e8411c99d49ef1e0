// Worker streams: the CPU backend's streams on threads of their own. Ordering, real
// asynchrony (gated ops: the caller proceeds while a worker is held), events, wait_event on a
// worker and on the inline default stream, exceptions rethrown at the next synchronize, and
// destroy draining. The WorkerStreams tests gate ops with host latches, so they do not depend
// on timing; the CpuBackend tests check results against the inline reference.
#include "core/cpu/worker_streams.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "memory/caching_allocator.h"
#include "memory/check.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "tests/core/backend_testutil.h"

namespace memfit {
namespace {

using cpu::WorkerStreams;
using testing::HostBuf;

// A gate a worker op blocks on until the test opens it.
struct Gate {
  std::promise<void> open_p;
  std::shared_future<void> opened = open_p.get_future().share();
  void open() { open_p.set_value(); }
  std::function<void()> op(std::atomic<int>* entered = nullptr) {
    auto f = opened;
    return [f, entered] {
      if (entered) entered->fetch_add(1);
      f.wait();
    };
  }
};

TEST(WorkerStreams, InlineWithoutWorkers) {
  WorkerStreams s(false);
  StreamId a = s.create();
  EXPECT_TRUE(s.runs_inline(a));
  EXPECT_TRUE(s.runs_inline(kDefaultStream));
  EventHandle e = s.record(a);
  EXPECT_TRUE(s.query(e));
  s.wait(kDefaultStream, e);
  s.synchronize(a);
  s.release(e);
  s.destroy(a);
  EXPECT_FALSE(s.has(a));
}

TEST(WorkerStreams, FifoOrderOnOneStream) {
  WorkerStreams s(true);
  StreamId a = s.create();
  EXPECT_FALSE(s.runs_inline(a));
  EXPECT_TRUE(s.runs_inline(kDefaultStream));
  std::vector<int> order;  // touched only by the worker until synchronize
  for (int i = 0; i < 1000; ++i) s.enqueue(a, [&order, i] { order.push_back(i); });
  s.synchronize(a);
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);
  s.destroy(a);
}

TEST(WorkerStreams, CallerProceedsWhileWorkerIsHeld) {
  WorkerStreams s(true);
  StreamId a = s.create();
  Gate g;
  std::atomic<int> entered{0};
  std::atomic<bool> after{false};
  s.enqueue(a, g.op(&entered));
  s.enqueue(a, [&after] { after = true; });
  EventHandle e = s.record(a);
  // The caller is not blocked by the held op: it gets here, and the event is pending.
  EXPECT_FALSE(s.query(e));
  EXPECT_FALSE(after.load());
  while (entered.load() == 0) std::this_thread::yield();  // the worker really runs it
  EXPECT_FALSE(s.query(e));
  g.open();
  s.synchronize_event(e);
  EXPECT_TRUE(s.query(e));
  EXPECT_TRUE(after.load());
  s.release(e);
  s.destroy(a);
}

TEST(WorkerStreams, WaitOrdersAnotherWorker) {
  WorkerStreams s(true);
  StreamId a = s.create(), b = s.create();
  Gate g;
  std::atomic<int> step{0};
  s.enqueue(a, g.op());
  s.enqueue(a, [&step] { step.store(1); });
  EventHandle ea = s.record(a);
  s.wait(b, ea);
  s.release(ea);  // released at once: the queued wait still holds what it needs
  int seen_by_b = -1;
  s.enqueue(b, [&] { seen_by_b = step.load(); });
  EventHandle eb = s.record(b);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(s.query(eb));  // b is held behind a's gate
  g.open();
  s.synchronize_event(eb);
  EXPECT_EQ(seen_by_b, 1);
  s.release(eb);
  s.destroy(a);
  s.destroy(b);
}

TEST(WorkerStreams, WaitOnDefaultStreamBlocksCaller) {
  WorkerStreams s(true);
  StreamId a = s.create();
  Gate g;
  std::atomic<bool> done{false};
  s.enqueue(a, g.op());
  s.enqueue(a, [&done] { done = true; });
  EventHandle e = s.record(a);
  std::thread opener([&g] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    g.open();
  });
  s.wait(kDefaultStream, e);  // returns only once the worker has passed the event
  EXPECT_TRUE(done.load());
  EXPECT_TRUE(s.query(e));
  opener.join();
  s.release(e);
  s.destroy(a);
}

TEST(WorkerStreams, EventRecordedLaterCoversOnlyEarlierWork) {
  WorkerStreams s(true);
  StreamId a = s.create();
  EventHandle empty = s.record(a);
  EXPECT_TRUE(s.query(empty));  // nothing queued before it
  Gate g;
  s.enqueue(a, g.op());
  EventHandle held = s.record(a);
  EXPECT_TRUE(s.query(empty));
  EXPECT_FALSE(s.query(held));
  g.open();
  s.synchronize_event(held);
  s.release(empty);
  s.release(held);
  EXPECT_EQ(s.live_events(), 0u);
  s.destroy(a);
}

TEST(WorkerStreams, ExceptionRethrownAtSynchronizeThenStreamUsable) {
  WorkerStreams s(true);
  StreamId a = s.create();
  std::atomic<int> ran{0};
  s.enqueue(a, [] { throw InvalidArgument("bad token 7"); });
  s.enqueue(a, [] { throw ConfigError("second"); });  // only the first is reported
  s.enqueue(a, [&ran] { ++ran; });                    // later ops still run
  try {
    s.synchronize(a);
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bad token 7"), std::string::npos);
  }
  EXPECT_EQ(ran.load(), 1);
  s.synchronize(a);  // reported once; the stream works on
  s.enqueue(a, [&ran] { ++ran; });
  s.synchronize(a);
  EXPECT_EQ(ran.load(), 2);

  // A non-memfit exception arrives as CheckFailure naming the stream, via an event too.
  s.enqueue(a, [] { throw std::runtime_error("disk on fire"); });
  EventHandle e = s.record(a);
  try {
    s.synchronize_event(e);
    ADD_FAILURE() << "no exception";
  } catch (const CheckFailure& x) {
    EXPECT_NE(std::string(x.what()).find("disk on fire"), std::string::npos);
    EXPECT_NE(std::string(x.what()).find("stream " + std::to_string(a)), std::string::npos);
  }
  s.release(e);
  s.destroy(a);
}

TEST(WorkerStreams, DestroyDrainsAndRethrows) {
  WorkerStreams s(true);
  StreamId a = s.create();
  std::atomic<int> ran{0};
  Gate g;
  s.enqueue(a, g.op());
  for (int i = 0; i < 10; ++i) s.enqueue(a, [&ran] { ++ran; });
  EventHandle e = s.record(a);
  std::thread opener([&g] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    g.open();
  });
  s.destroy(a);  // waits for the gate and the ten ops
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(s.has(a));
  EXPECT_TRUE(s.query(e));  // events outlive their stream
  s.release(e);
  opener.join();

  StreamId b = s.create();
  s.enqueue(b, [] { throw OutOfMemory("no room", OomInfo{}); });
  EXPECT_THROW(s.destroy(b), OutOfMemory);
  EXPECT_FALSE(s.has(b));
}

TEST(WorkerStreams, DestructorDrainsPendingWork) {
  std::atomic<int> ran{0};
  {
    WorkerStreams s(true);
    StreamId a = s.create(), b = s.create();
    for (int i = 0; i < 100; ++i) {
      s.enqueue(a, [&ran] { ++ran; });
      s.enqueue(b, [&ran] { ++ran; });
    }
  }
  EXPECT_EQ(ran.load(), 200);
}

// ---- through CpuBackend ----------------------------------------------------------------------

TEST(CpuWorkerStreams, OptionsAndInlineDefault) {
  CpuBackend plain;
  EXPECT_FALSE(plain.options().worker_streams);
  CpuBackend be({.worker_streams = true});
  EXPECT_TRUE(be.options().worker_streams);
  // The default stream stays inline: done when the call returns.
  HostBuf x(DType::kF32, 8);
  be.fill(kDefaultStream, x.t(), 3.0f);
  EXPECT_EQ(x.get(7), 3.0f);
}

TEST(CpuWorkerStreams, ChainOfOpsRunsInOrder) {
  CpuBackend be({.worker_streams = true});
  StreamId s = be.create_stream();
  const std::int64_t n = 100000;  // above the OpenMP threshold: kernels thread from the worker
  HostBuf a(DType::kF32, n), b(DType::kBF16, n);
  be.fill(s, a.t(), 1.0f);
  for (int i = 0; i < 10; ++i) be.scale(s, 2.0f, a.t());  // 1024
  be.cast(s, a.t(), b.t());
  be.axpy(s, -1.0f, b.t(), a.t());  // 0
  be.axpy(s, 0.5f, b.t(), a.t());   // 512
  be.synchronize(s);
  for (std::int64_t i = 0; i < n; i += 9973) {
    ASSERT_EQ(a.get(i), 512.0f);
    ASSERT_EQ(b.get(i), 1024.0f);
  }
  be.destroy_stream(s);
  EXPECT_EQ(be.live_events(), 0u);
}

TEST(CpuWorkerStreams, LongOpDoesNotBlockTheCaller) {
  CpuBackend be({.worker_streams = true});
  StreamId s = be.create_stream();
  const std::int64_t d = 384;
  HostBuf a(DType::kBF16, d * d), b(DType::kBF16, d * d), c(DType::kF32, d * d);
  std::mt19937 rng(3);
  a.randomize(rng);
  b.randomize(rng);
  GemmDesc g;
  g.m = g.n = g.k = d;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 40; ++i) be.gemm(s, g, a.t(), b.t(), c.t());  // ~40 * 113 MFLOP
  EventHandle e = be.record_event(s);
  const double queued_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool pending = !be.query_event(e);
  be.synchronize_event(e);
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Queueing is bookkeeping; the GEMMs take orders of magnitude longer.
  EXPECT_TRUE(pending) << "queued in " << queued_s << " s, all done in " << total_s << " s";
  EXPECT_LT(queued_s, total_s);
  be.release_event(e);

  // Same result as the inline reference.
  HostBuf ref(DType::kF32, d * d);
  CpuBackend inline_be;
  inline_be.gemm(kDefaultStream, g, a.t(), b.t(), ref.t());
  for (std::int64_t i = 0; i < d * d; i += 101) ASSERT_EQ(c.get(i), ref.get(i));
}

TEST(CpuWorkerStreams, ConcurrentGemmsShareTheScratchPool) {
  // Two workers convert bf16 operands in the pool's buffers at the same time; each must get
  // buffers of its own (a shared one would mix the operands and change the results).
  CpuBackend be({.worker_streams = true});
  StreamId s1 = be.create_stream(), s2 = be.create_stream();
  const std::int64_t d = 96;
  std::mt19937 rng(5);
  HostBuf a1(DType::kBF16, d * d), b1(DType::kF16, d * d), a2(DType::kBF16, d * d),
      b2(DType::kF16, d * d);
  a1.randomize(rng);
  b1.randomize(rng);
  a2.randomize(rng);
  b2.randomize(rng);
  GemmDesc g;
  g.m = g.n = g.k = d;
  g.trans_b = true;
  std::vector<HostBuf> c1, c2;
  for (int i = 0; i < 20; ++i) {
    c1.emplace_back(DType::kBF16, d * d);
    c2.emplace_back(DType::kBF16, d * d);
  }
  for (int i = 0; i < 20; ++i) {
    be.gemm(s1, g, a1.t(), b1.t(), c1[static_cast<std::size_t>(i)].t());
    be.gemm(s2, g, a2.t(), b2.t(), c2[static_cast<std::size_t>(i)].t());
  }
  be.synchronize(s1);
  be.synchronize(s2);
  CpuBackend ref_be;
  HostBuf r1(DType::kBF16, d * d), r2(DType::kBF16, d * d);
  ref_be.gemm(kDefaultStream, g, a1.t(), b1.t(), r1.t());
  ref_be.gemm(kDefaultStream, g, a2.t(), b2.t(), r2.t());
  for (int i = 0; i < 20; ++i) {
    for (std::int64_t j = 0; j < d * d; j += 7) {
      ASSERT_EQ(c1[static_cast<std::size_t>(i)].get(j), r1.get(j));
      ASSERT_EQ(c2[static_cast<std::size_t>(i)].get(j), r2.get(j));
    }
  }
  EXPECT_GT(be.scratch_bytes(), 0u);
}

TEST(CpuWorkerStreams, WorkspaceAllocatorFromAWorker) {
  // GEMM scratch from a caching allocator built on the backend's own events: taken by the
  // caller, recorded on the worker's stream, reused only after the worker passed the GEMM.
  CpuBackend be({.worker_streams = true});
  HostProvider host;
  CachingAllocator alloc(host, {}, &be.stream_sync());
  be.set_workspace_allocator(&alloc);
  StreamId s = be.create_stream();
  const std::int64_t d = 64;
  std::mt19937 rng(9);
  HostBuf a(DType::kF16, d * d), b(DType::kBF16, d * d), c(DType::kF32, d * d),
      r(DType::kF32, d * d);
  a.randomize(rng);
  b.randomize(rng);
  GemmDesc g;
  g.m = g.n = g.k = d;
  for (int i = 0; i < 10; ++i) be.gemm(s, g, a.t(), b.t(), c.t());
  // empty_cache waits, under the allocator's lock, for the events of scratch still in use on
  // the worker; the worker must not need that lock to finish.
  alloc.empty_cache();
  be.synchronize(s);
  // Each GEMM took its scratch from the allocator (2 widened operands), as workspace.
  EXPECT_GE(alloc.stats().allocation[kStatAll].allocated, 10);
  EXPECT_GT(alloc.stats().category_bytes[static_cast<int>(Category::kWorkspace)].peak, 0);
  CpuBackend ref;
  ref.gemm(kDefaultStream, g, a.t(), b.t(), r.t());
  for (std::int64_t j = 0; j < d * d; ++j) ASSERT_EQ(c.get(j), r.get(j));
  be.set_workspace_allocator(nullptr);
  be.destroy_stream(s);
  alloc.empty_cache();
  EXPECT_EQ(be.live_events(), 0u);
}

TEST(CpuWorkerStreams, WaitEventOrdersCopyAfterCompute) {
  // The offload pattern: compute writes on the default stream, the copy stream waits on an
  // event and copies; then compute waits on the copy's event before overwriting the source.
  CpuBackend be({.worker_streams = true});
  StreamId copy = be.create_stream();
  const std::int64_t n = 1 << 18;
  HostBuf grad(DType::kF32, n), host(DType::kF32, n);
  for (int step = 1; step <= 5; ++step) {
    be.fill(kDefaultStream, grad.t(), static_cast<float>(step));
    EventHandle produced = be.record_event(kDefaultStream);
    be.wait_event(copy, produced);
    be.release_event(produced);
    be.copy(copy, grad.t(), host.t());
    EventHandle copied = be.record_event(copy);
    be.wait_event(kDefaultStream, copied);  // inline: blocks until the copy is done
    EXPECT_TRUE(be.query_event(copied));
    for (std::int64_t i = 0; i < n; i += 4099) ASSERT_EQ(host.get(i), static_cast<float>(step));
    be.release_event(copied);
  }
  be.destroy_stream(copy);
  EXPECT_EQ(be.live_events(), 0u);
}

TEST(CpuWorkerStreams, OpErrorSurfacesAtSynchronize) {
  CpuBackend be({.worker_streams = true});
  StreamId s = be.create_stream();
  // A token id outside the vocabulary is data, checked when the op runs: on a worker that is
  // after the call returned, so the error comes with the next synchronize.
  std::vector<std::int32_t> tok = {0, 1, 99};
  IndexTensor tokens{tok.data(), Shape{1, 3}, Device::kCpu};
  HostBuf wte(DType::kF32, 4 * 8), wpe(DType::kF32, 3 * 8), out(DType::kF32, 3 * 8);
  be.embedding_forward(s, tokens, wte.t(Shape{4, 8}), wpe.t(Shape{3, 8}), out.t(Shape{1, 3, 8}));
  EXPECT_THROW(be.synchronize(s), InvalidArgument);
  // The stream is usable afterwards, and the error was reported once.
  HostBuf x(DType::kF32, 16);
  be.fill(s, x.t(), 2.0f);
  be.synchronize(s);
  EXPECT_EQ(x.get(15), 2.0f);
  be.destroy_stream(s);
}

TEST(CpuWorkerStreams, CachingAllocatorWaitsForWorkerEvents) {
  // A block used on the worker is recorded there; after the free the allocator hands it to
  // another stream only once the worker's event completes, so the memory is never written by
  // the new owner while the worker still reads it.
  CpuBackend be({.worker_streams = true});
  HostProvider host;
  CachingAllocator alloc(host, {}, &be.stream_sync());
  StreamId w = be.create_stream();
  const std::int64_t n = 1 << 20;
  HostBuf dst(DType::kF32, n);
  for (int round = 0; round < 5; ++round) {
    Block b = alloc.allocate(n * sizeof(float), Category::kActivation, kDefaultStream);
    Tensor t(b.data(), Shape{n}, DType::kF32, Device::kCpu);
    be.fill(kDefaultStream, t, static_cast<float>(round));
    EventHandle e = be.record_event(kDefaultStream);
    be.wait_event(w, e);
    be.release_event(e);
    be.copy(w, t, dst.t());
    b.record_stream(w);
    b.reset();
    // A new block for the default stream: either other memory, or this one after the copy.
    Block c = alloc.allocate(n * sizeof(float), Category::kActivation, kDefaultStream);
    Tensor u(c.data(), Shape{n}, DType::kF32, Device::kCpu);
    be.fill(kDefaultStream, u, -1.0f);
    be.synchronize(w);
    for (std::int64_t i = 0; i < n; i += 65537) ASSERT_EQ(dst.get(i), static_cast<float>(round));
  }
  be.destroy_stream(w);
  alloc.empty_cache();
  EXPECT_EQ(be.live_events(), 0u);
}

}  // namespace
}  // namespace memfit
