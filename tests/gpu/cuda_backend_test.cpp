// CudaBackend's core against the CPU backend (the numerical reference): copies, fill, cast,
// axpy, scale, sumsq and cuBLASLt GEMM on fresh random inputs, outputs poisoned with NaN
// first, dtype-aware tolerances (f32 1e-5 relative, f16 1e-3, bf16 1e-2; NaN never passes);
// streams and events ordering; workspace blocks in the allocator; errors as CudaError.
//
// Every test that needs a GPU starts with MEMFIT_REQUIRE_GPU() and skips without one. The
// error-macro tests at the end need no device and run everywhere.
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cpu/cpu_backend.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_lib_check.h"
#include "memory/caching_allocator.h"
#include "memory/cuda/cuda_provider.h"
#include "memory/error.h"
#include "memory/pinned_host_provider.h"
#include "tests/core/backend_testutil.h"
#include "tests/gpu/gpu_testutil.h"

namespace memfit {
namespace {

using testing::Gate;
using testing::GateOpener;
using testing::HostBuf;
using testing::kAllDTypes;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float tolerance(DType dt) {
  switch (dt) {
    case DType::kF32:
      return 1e-5f;
    case DType::kF16:
      return 1e-3f;
    case DType::kBF16:
      return 1e-2f;
  }
  return 0.0f;
}

// A CudaBackend with a caching allocator over device memory that also serves its workspace.
// Members go in reverse order: allocator, provider, backend.
struct Env {
  explicit Env(CudaBackendOptions o = {}) : be(o), gpu(o.device), alloc(gpu, {}, &be.stream_sync()) {
    be.set_workspace_allocator(&alloc);
  }
  CudaBackend be;
  CudaProvider gpu;
  CachingAllocator alloc;
};

// n elements of dt on the device (Category::kActivation).
struct DevBuf {
  DevBuf(Env& env, DType dt, std::int64_t n)
      : block(env.alloc.allocate(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) *
                                     dtype_size(dt),
                                 Category::kActivation)),
        t(block.data(), Shape{n}, dt, Device::kCuda) {}
  Block block;
  Tensor t;
};

void upload(Env& env, const HostBuf& h, const DevBuf& d) {
  env.be.copy(kDefaultStream, h.t(), d.t);
  env.be.synchronize(kDefaultStream);
}
HostBuf download(Env& env, const DevBuf& d) {
  HostBuf h(d.t.dtype(), d.t.numel());
  env.be.copy(kDefaultStream, d.t, h.t());
  env.be.synchronize(kDefaultStream);
  return h;
}
void poison(Env& env, const DevBuf& d) { env.be.fill(kDefaultStream, d.t, kNaN); }

// |got - want| <= tol * (|want| + floor) elementwise, and never NaN unless want is NaN.
// `scale` (optional) adds a per-element allowance for accumulation-order differences.
void expect_close(const HostBuf& got, const HostBuf& want, float tol, const std::string& what,
                  const std::vector<float>* scale = nullptr, float floor = 1e-6f) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < got.size(); ++i) {
    const float g = got.get(i);
    const float w = want.get(i);
    const float allow = tol * (std::fabs(w) + floor) +
                        (scale ? 1e-5f * (*scale)[static_cast<std::size_t>(i)] : 0.0f);
    const bool ok = std::isnan(w) ? std::isnan(g)
                                  : (g == w || (!std::isnan(g) && std::fabs(g - w) <= allow));
    if (!ok) {
      ++bad;
      if (reported++ < 5) ADD_FAILURE() << what << ": [" << i << "] got " << g << " want " << w;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ";
}

// ---- construction, context, streams, events ----------------------------------------------

TEST(CudaBackend, ConstructsOnTheDeviceAndMeasuresTheContext) {
  MEMFIT_REQUIRE_GPU();
  CudaBackend be;
  EXPECT_EQ(be.device(), Device::kCuda);
  EXPECT_STREQ(be.name(), "cuda");
  EXPECT_GT(be.sm_count(), 0);
  const ContextInfo& c = be.context_info();
  std::size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_EQ(c.total_bytes, total);
  EXPECT_GT(c.used_before_handles, 0u);  // a context costs memory
  EXPECT_LE(c.free_bytes, c.total_bytes);
  EXPECT_LE(c.used_before_handles + c.handle_bytes, c.total_bytes);
  testing::print_figure("cuda context used before handles (MiB)",
                        std::to_string(c.used_before_handles >> 20));
  testing::print_figure("cuBLASLt handle (MiB)", std::to_string(c.handle_bytes >> 20));
}

TEST(CudaBackend, RejectsADeviceThatDoesNotExist) {
  MEMFIT_REQUIRE_GPU();
  const int count = CudaProvider::cuda_device_count();
  testing::expect_invalid([&] { CudaBackend be({.device = count}); }, {"does not exist", "0.."});
  testing::expect_invalid([&] { CudaBackend be({.device = -1}); }, {"does not exist"});
}

TEST(CudaBackend, DefaultStreamIsANonBlockingStreamOfItsOwn) {
  MEMFIT_REQUIRE_GPU();
  CudaBackend be;
  const cudaStream_t s = be.cuda_stream(kDefaultStream);
  EXPECT_NE(s, nullptr);  // not the legacy NULL stream
  unsigned flags = 0;
  ASSERT_EQ(cudaStreamGetFlags(s, &flags), cudaSuccess);
  EXPECT_EQ(flags & cudaStreamNonBlocking, static_cast<unsigned>(cudaStreamNonBlocking));
  const StreamId other = be.create_stream();
  EXPECT_NE(other, kDefaultStream);
  EXPECT_NE(be.cuda_stream(other), s);
  be.destroy_stream(other);
  EXPECT_FALSE(be.has_stream(other));
  testing::expect_invalid([&] { be.cuda_stream(other); }, {"no such stream"});
}

TEST(CudaBackend, EventsOrderWorkAcrossStreams) {
  MEMFIT_REQUIRE_GPU();
  Env env;
  CudaBackend& be = env.be;
  const StreamId producer = be.create_stream();
  const StreamId consumer = be.create_stream();
  DevBuf x(env, DType::kF32, 1 << 20);
  DevBuf y(env, DType::kF32, 1 << 20);
  be.fill(consumer, y.t, -1.0f);
  be.synchronize(consumer);

  Gate gate;
  {
    GateOpener opener{gate};
    // The producer's queue is held shut: its fill cannot run before the gate opens.
    ASSERT_EQ(cudaLaunchHostFunc(be.cuda_stream(producer), &Gate::wait, &gate), cudaSuccess);
    be.fill(producer, x.t, 2.0f);
    const EventHandle done = be.record_event(producer);
    EXPECT_FALSE(be.query_event(done));
    be.wait_event(consumer, done);
    be.copy(consumer, x.t, y.t);  // must see the fill, not what x held before
    const EventHandle copied = be.record_event(consumer);
    EXPECT_FALSE(be.query_event(copied));
    gate.open();
    be.synchronize_event(copied);
    EXPECT_TRUE(be.query_event(done));
    EXPECT_TRUE(be.query_event(copied));
    be.release_event(done);
    be.release_event(copied);
    testing::expect_invalid([&] { be.query_event(done); }, {"unknown event"});
  }
  const HostBuf got = download(env, y);
  for (std::int64_t i = 0; i < got.size(); i += 4097) ASSERT_EQ(got.get(i), 2.0f) << i;

  // Released events are reused under new handles: a stale handle never reads as live.
  const EventHandle a = be.record_event(consumer);
  be.release_event(a);
  const EventHandle b = be.record_event(consumer);
  EXPECT_NE(a, b);
  be.synchronize_event(b);
  be.release_event(b);
  be.destroy_stream(producer);
  be.destroy_stream(consumer);
}

// ---- copies --------------------------------------------------------------------------------

TEST(CudaBackend, CopiesEveryWayWithPinnedAndPageableHostMemory) {
  MEMFIT_REQUIRE_GPU();
  Env env;
  PinnedHostProvider pinned(PinnedHostProvider::Mode::kCudaHostAlloc);
  CachingAllocator host(pinned);
  std::mt19937 rng(11);
  for (DType dt : kAllDTypes) {
    const std::int64_t n = 300007;
    HostBuf src(dt, n);
    src.randomize(rng);
    Block pin_a = host.allocate(static_cast<std::size_t>(n) * dtype_size(dt), Category::kTemporary);
    Block pin_b = host.allocate(static_cast<std::size_t>(n) * dtype_size(dt), Category::kTemporary);
    const Tensor pa(pin_a.data(), Shape{n}, dt, Device::kCpu);
    const Tensor pb(pin_b.data(), Shape{n}, dt, Device::kCpu);
    std::memset(pin_b.data(), 0xff, pin_b.size());  // NaN bits in every dtype
    DevBuf d1(env, dt, n);
    DevBuf d2(env, dt, n);
    poison(env, d1);
    poison(env, d2);
    const StreamId s = env.be.create_stream();
    env.be.copy(s, src.t(), pa);  // host to host
    env.be.copy(s, pa, d1.t);     // pinned to device
    env.be.copy(s, d1.t, d2.t);   // device to device
    env.be.copy(s, d2.t, pb);     // device to pinned
    env.be.synchronize(s);
    ASSERT_EQ(std::memcmp(pin_b.data(), src.t().raw(), pin_b.size()), 0) << dtype_name(dt);
    const HostBuf back = download(env, d2);  // device to pageable
    ASSERT_EQ(std::memcmp(back.t().raw(), src.t().raw(), src.t().nbytes()), 0) << dtype_name(dt);
    env.be.destroy_stream(s);
  }
}

// ---- elementwise -----------------------------------------------------------------------------

// Odd sizes past one grid's worth of elements (8192 blocks x 256 threads = 2M) exercise the
// grid-stride loops and the tails.
constexpr std::int64_t kSizes[] = {1, 1000, 2097152 + 333};

TEST(CudaBackend, FillMatchesTheCpuBackend) {
  MEMFIT_REQUIRE_GPU();
  Env env;
  CpuBackend cpu;
  for (DType dt : kAllDTypes) {
    for (std::int64_t n : kSizes) {
      for (float v : {0.0f, -1.5f, 3.14159265f, 70000.0f /* inf in f16 */}) {
        DevBuf d(env, dt, n);
        poison(env, d);
        env.be.fill(kDefaultStream, d.t, v);
        HostBuf want(dt, n);
        cpu.fill(kDefaultStream, want.t(), v);
        expect_close(download(env, d), want, 0.0f,
                     std::string("fill ") + dtype_name(dt) + " " + std::to_string(v));
      }
    }
  }
}

TEST(CudaBackend, CastMatchesTheCpuBackendForEveryDtypePair) {
  MEMFIT_REQUIRE_GPU();
  Env env;
  CpuBackend cpu;
  std::mt19937 rng(1);
  for (DType st : kAllDTypes) {
    for (DType dt : kAllDTypes) {
      for (std::int64_t n : kSizes) {
        HostBuf src(st, n);
        src.randomize(rng, -300.0f, 300.0f);
        DevBuf ds(env, st, n);
        DevBuf dd(env, dt, n);
        upload(env, src, ds);
        poison(env, dd);
        env.be.cast(kDefaultStream, ds.t, dd.t);
        HostBuf want(dt, n);
        cpu.cast(kDefaultStream, src.t(), want.t());
        // Same rounding (nearest even) on both: exact.
        expect_close(download(env, dd), want, 0.0f,
                     std::string("cast ") + dtype_name(st) + "->" + dtype_name(dt), nullptr, 0.0f);
      }
    }
  }
}

TEST(CudaBackend, AxpyAndScaleMatchTheCpuBackend) {
  MEMFIT_REQUIRE_GPU();
  Env env;
  CpuBackend cpu;
  std::mt19937 rng(2);
  for (DType xt : kAllDTypes) {
    for (DType yt : kAllDTypes) {
      for (std::int64_t n : kSizes) {
        HostBuf x(xt, n);
        HostBuf y(yt, n);
        x.randomize(rng);
        y.randomize(rng);
        DevBuf dx(env, xt, n);
        DevBuf dy(env, yt, n);
        upload(env, x, dx);
        upload(env, y, dy);
        env.be.axpy(kDefaultStream, -0.37f, dx.t, dy.t);
        env.be.scale(kDefaultStream, 1.7f, dy.t);
        cpu.axpy(kDefaultStream, -0.37f, x.t(), y.t());
        cpu.scale(kDefaultStream, 1.7f, y.t());
        expect_close(download(env, dy), y, tolerance(yt),
                     std::string("axpy+scale ") + dtype_name(xt) + "->" + dtype_name(yt));
      }
    }
  }
}

TEST(CudaBackend, SumsqMatchesTheCpuBackendCountsNonFiniteAndIsDeterministic) {
  MEMFIT_REQUIRE_GPU();
  Env env;
  CpuBackend cpu;
  std::mt19937 rng(3);
  for (DType dt : kAllDTypes) {
    for (std::int64_t n : kSizes) {
      HostBuf x(dt, n);
      x.randomize(rng, -4.0f, 4.0f);
      if (n > 10) {
        x.set(3, kNaN);
        x.set(n - 1, std::numeric_limits<float>::infinity());
      }
      DevBuf dx(env, dt, n);
      upload(env, x, dx);
      DevBuf out(env, DType::kF32, kSumSqSlots);
      HostBuf want(DType::kF32, kSumSqSlots);
      want.set(0, 0.25f);  // results accumulate into what out holds
      want.set(1, 1.0f);
      upload(env, want, out);
      env.be.sumsq(kDefaultStream, dx.t, out.t);
      env.be.sumsq(kDefaultStream, dx.t, out.t);  // twice: += both times
      cpu.sumsq(kDefaultStream, x.t(), want.t());
      cpu.sumsq(kDefaultStream, x.t(), want.t());
      const HostBuf got = download(env, out);
      const std::string what = std::string("sumsq ") + dtype_name(dt) + " n=" + std::to_string(n);
      expect_close(got, want, 1e-5f, what);
      EXPECT_EQ(got.get(1), n > 10 ? 5.0f : 1.0f) << what;

      // Same input, same bits, run after run.
      DevBuf again(env, DType::kF32, kSumSqSlots);
      for (int rep = 0; rep < 3; ++rep) {
        env.be.fill(kDefaultStream, again.t, 0.0f);
        env.be.sumsq(kDefaultStream, dx.t, again.t);
        const HostBuf r = download(env, again);
        if (rep == 0) {
          want.set(0, r.get(0));
        } else {
          const float a = r.get(0), b = want.get(0);
          EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << what << " run " << rep;
        }
      }
    }
  }
}

// ---- GEMM ------------------------------------------------------------------------------------

struct GemmCase {
  GemmDesc d;
  DType ta, tb, tc;
};

std::string describe(const GemmCase& g) {
  const GemmDesc& d = g.d;
  return "gemm m=" + std::to_string(d.m) + " n=" + std::to_string(d.n) + " k=" + std::to_string(d.k) +
         " batch=" + std::to_string(d.batch) + " ta=" + std::to_string(d.trans_a) +
         " tb=" + std::to_string(d.trans_b) + " beta=" + std::to_string(d.beta) +
         " strides=" + std::to_string(d.stride_a) + "/" + std::to_string(d.stride_b) + "/" +
         std::to_string(d.stride_c) + " " + dtype_name(g.ta) + "," + dtype_name(g.tb) + "->" +
         dtype_name(g.tc);
}

std::int64_t resolved(std::int64_t stride, std::int64_t size) {
  return stride == GemmDesc::kPacked ? size : stride;
}

// Runs one case on both backends and compares. C's gaps (strided batches) must be untouched.
void check_gemm(Env& env, CpuBackend& cpu, const GemmCase& g, std::mt19937& rng) {
  const GemmDesc& d = g.d;
  const std::int64_t size_a = d.m * d.k, size_b = d.k * d.n, size_c = d.m * d.n;
  const std::int64_t sa = resolved(d.stride_a, size_a), sb = resolved(d.stride_b, size_b),
                     sc = resolved(d.stride_c, size_c);
  const std::int64_t na = (d.batch - 1) * sa + size_a, nb = (d.batch - 1) * sb + size_b,
                     nc = (d.batch - 1) * sc + size_c;
  HostBuf a(g.ta, na), b(g.tb, nb), c(g.tc, nc);
  a.randomize(rng);
  b.randomize(rng);
  c.randomize(rng);
  DevBuf da(env, g.ta, na), db(env, g.tb, nb), dc(env, g.tc, nc);
  upload(env, a, da);
  upload(env, b, db);
  if (d.beta == 0.0f) {
    // C is write-only: poison its matrices, keep the gaps' values to check they survive.
    for (std::int64_t i = 0; i < d.batch; ++i) {
      for (std::int64_t j = 0; j < size_c; ++j) c.set(i * sc + j, kNaN);
    }
  }
  upload(env, c, dc);

  // Accumulation-order allowance: the same GEMM on |A|, |B|, |C| gives sum |a||b| (+|beta c|).
  HostBuf abs_a(DType::kF32, na), abs_b(DType::kF32, nb), abs_c(DType::kF32, nc);
  for (std::int64_t i = 0; i < na; ++i) abs_a.set(i, std::fabs(a.get(i)));
  for (std::int64_t i = 0; i < nb; ++i) abs_b.set(i, std::fabs(b.get(i)));
  for (std::int64_t i = 0; i < nc; ++i) abs_c.set(i, std::isnan(c.get(i)) ? 0.0f : std::fabs(c.get(i)));
  GemmDesc dabs = d;
  dabs.alpha = std::fabs(d.alpha);
  dabs.beta = std::fabs(d.beta);
  cpu.gemm(kDefaultStream, dabs, abs_a.t(), abs_b.t(), abs_c.t());
  std::vector<float> scale(static_cast<std::size_t>(nc));
  for (std::int64_t i = 0; i < nc; ++i) scale[static_cast<std::size_t>(i)] = abs_c.get(i);

  env.be.gemm(kDefaultStream, d, da.t, db.t, dc.t);
  cpu.gemm(kDefaultStream, d, a.t(), b.t(), c.t());
  const float tol = tolerance(g.tc);
  expect_close(download(env, dc), c, tol, describe(g), &scale);
}

TEST(CudaBackend, GemmMatchesTheCpuBackendOverDtypesTransposesAndBeta) {
  MEMFIT_REQUIRE_GPU();
  Env env;
  CpuBackend cpu;
  std::mt19937 rng(4);
  // Odd sizes (alignment 2 or 4 bytes: the heuristic must pick algorithms that accept that)
  // and a tensor-core friendly one.
  const std::int64_t shapes[][3] = {{37, 53, 71}, {64, 128, 96}};
  for (const auto& sh : shapes) {
    for (DType ta : kAllDTypes) {
      for (DType tb : kAllDTypes) {
        for (DType tc : kAllDTypes) {
          for (int t = 0; t < 4; ++t) {
            for (float beta : {0.0f, 0.5f}) {
              GemmCase g{};
              g.d.m = sh[0];
              g.d.n = sh[1];
              g.d.k = sh[2];
              g.d.trans_a = (t & 1) != 0;
              g.d.trans_b = (t & 2) != 0;
              g.d.alpha = 1.25f;
              g.d.beta = beta;
              g.ta = ta;
              g.tb = tb;
              g.tc = tc;
              check_gemm(env, cpu, g, rng);
            }
          }
        }
      }
    }
  }
}

TEST(CudaBackend, GemmBatchesPackedBroadcastAndGapped) {
  MEMFIT_REQUIRE_GPU();
  Env env;
  CpuBackend cpu;
  std::mt19937 rng(5);
  for (DType dt : kAllDTypes) {
    for (float beta : {0.0f, -1.0f}) {
      GemmCase packed{};
      packed.d = {.m = 24, .n = 40, .k = 64, .trans_b = true, .beta = beta, .batch = 5};
      packed.ta = packed.tb = packed.tc = dt;
      check_gemm(env, cpu, packed, rng);

      GemmCase broadcast = packed;  // one B for every batch entry
      broadcast.d.stride_b = 0;
      check_gemm(env, cpu, broadcast, rng);

      GemmCase gapped = packed;  // C's matrices apart; the gaps must stay as they were
      gapped.d.stride_c = 24 * 40 + 37;
      gapped.d.stride_a = 24 * 64 + 8;
      check_gemm(env, cpu, gapped, rng);

      GemmCase mixed_c = gapped;  // C computed in an f32 temporary, gaps still untouched
      mixed_c.tc = dt == DType::kF16 ? DType::kBF16 : DType::kF16;
      check_gemm(env, cpu, mixed_c, rng);
    }
  }
}

TEST(CudaBackend, GemmWithKZeroScalesC) {
  MEMFIT_REQUIRE_GPU();
  Env env;
  CpuBackend cpu;
  std::mt19937 rng(6);
  for (float beta : {0.0f, 0.5f, 1.0f}) {
    GemmCase g{};
    g.d = {.m = 7, .n = 9, .k = 0, .beta = beta, .batch = 2, .stride_c = 70};
    g.ta = g.tb = DType::kBF16;
    g.tc = DType::kF32;
    check_gemm(env, cpu, g, rng);
  }
}

TEST(CudaBackend, GemmWithTf32StaysWithinTf32Accuracy) {
  MEMFIT_REQUIRE_GPU();
  Env env({.allow_tf32 = true});
  CpuBackend cpu;
  std::mt19937 rng(7);
  const std::int64_t m = 128, n = 96, k = 256;
  HostBuf a(DType::kF32, m * k), b(DType::kF32, k * n), c(DType::kF32, m * n);
  a.randomize(rng);
  b.randomize(rng);
  DevBuf da(env, DType::kF32, m * k), db(env, DType::kF32, k * n), dc(env, DType::kF32, m * n);
  upload(env, a, da);
  upload(env, b, db);
  poison(env, dc);
  const GemmDesc d{.m = m, .n = n, .k = k};
  env.be.gemm(kDefaultStream, d, da.t, db.t, dc.t);
  cpu.gemm(kDefaultStream, d, a.t(), b.t(), c.t());
  // TF32 rounds inputs to 10 mantissa bits (2^-11 relative each); over k random products
  // the error stays well below 1e-2 of sqrt(k) (sum of |a||b| ~ k/4).
  const HostBuf got = download(env, dc);
  for (std::int64_t i = 0; i < m * n; ++i) {
    ASSERT_FALSE(std::isnan(got.get(i))) << i;
    ASSERT_NEAR(got.get(i), c.get(i), 1e-2f * std::sqrt(static_cast<float>(k))) << i;
  }
}

TEST(CudaBackend, GemmScratchAndWorkspaceAreWorkspaceBlocksInTheAllocator) {
  MEMFIT_REQUIRE_GPU();
  // Before env: the listener writes here until the allocator is gone.
  std::vector<std::string> tags;
  std::vector<Category> cats;
  Env env;
  env.alloc.add_listener([&](const AllocatorEvent& e) {
    if (e.kind != EventKind::kAlloc) return;
    tags.emplace_back(e.tag);
    cats.push_back(e.category);
  });
  const std::int64_t n = 1024;
  DevBuf a(env, DType::kF16, n * n), b(env, DType::kBF16, n * n), c(env, DType::kBF16, n * n);
  env.be.fill(kDefaultStream, a.t, 0.5f);
  env.be.fill(kDefaultStream, b.t, 0.25f);
  const auto before = tags.size();
  // f16 x bf16: both operands go to f32 scratch ("cuda.gemm.cast"), then any workspace the
  // algorithm asks for ("cuda.gemm.workspace").
  env.be.gemm(kDefaultStream, GemmDesc{.m = n, .n = n, .k = n}, a.t, b.t, c.t);
  env.be.synchronize(kDefaultStream);
  ASSERT_GT(tags.size(), before);
  int cast_blocks = 0;
  for (std::size_t i = before; i < tags.size(); ++i) {
    EXPECT_EQ(cats[i], Category::kWorkspace) << tags[i];
    EXPECT_EQ(tags[i].rfind("cuda.gemm.", 0), 0u) << tags[i];
    cast_blocks += tags[i] == "cuda.gemm.cast";
  }
  EXPECT_EQ(cast_blocks, 2);
  const AllocatorStats st = env.alloc.stats();
  EXPECT_EQ(st.category_bytes[category_index(Category::kWorkspace)].current, 0);  // all freed
  EXPECT_GE(st.category_bytes[category_index(Category::kWorkspace)].peak, 2 * n * n * 4);
  const HostBuf got = download(env, c);
  for (std::int64_t i = 0; i < n * n; i += 1031) ASSERT_EQ(got.get(i), 0.125f * n) << i;

  // Without an allocator the same GEMM takes its scratch from the runtime's pool.
  env.be.set_workspace_allocator(nullptr);
  env.be.fill(kDefaultStream, c.t, kNaN);
  const auto count = tags.size();
  env.be.gemm(kDefaultStream, GemmDesc{.m = n, .n = n, .k = n}, a.t, b.t, c.t);
  EXPECT_EQ(tags.size(), count);
  const HostBuf again = download(env, c);
  for (std::int64_t i = 0; i < n * n; i += 1031) ASSERT_EQ(again.get(i), 0.125f * n) << i;
}

// ---- errors ----------------------------------------------------------------------------------

// Stand-ins for failing library calls: the macros' conversion is what is tested (the test
// binary does not link cuBLAS or cuDNN itself).
cublasStatus_t failing_cublas_call(int) { return CUBLAS_STATUS_NOT_SUPPORTED; }

TEST(CudaLibCheck, CublasStatusBecomesCudaErrorNamingTheCallAndStatus) {
  try {
    MEMFIT_CUBLAS_CHECK(failing_cublas_call(42));
    ADD_FAILURE() << "no CudaError";
  } catch (const CudaError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("failing_cublas_call(42) failed"), std::string::npos) << m;
    EXPECT_NE(m.find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda_backend_test.cpp:"), std::string::npos) << m;
  }
}

#if MEMFIT_HAVE_CUDNN
cudnnStatus_t failing_cudnn_call() { return CUDNN_STATUS_BAD_PARAM; }

TEST(CudaLibCheck, CudnnStatusBecomesCudaError) {
  try {
    MEMFIT_CUDNN_CHECK(failing_cudnn_call());
    ADD_FAILURE() << "no CudaError";
  } catch (const CudaError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("failing_cudnn_call() failed"), std::string::npos) << m;
    EXPECT_NE(m.find("cudnnStatus " + std::to_string(static_cast<int>(CUDNN_STATUS_BAD_PARAM))),
              std::string::npos)
        << m;
  }
}
#endif

void leave_a_pending_error() { (void)cudaSetDevice(1 << 20); }

TEST(CudaLibCheck, LaunchCheckReportsAPendingErrorOnceAndClearsIt) {
  MEMFIT_REQUIRE_GPU();
  leave_a_pending_error();
  try {
    MEMFIT_CUDA_LAUNCH_CHECK();
    ADD_FAILURE() << "no CudaError";
  } catch (const CudaError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("kernel launch in "), std::string::npos) << m;
    EXPECT_NE(m.find("cudaErrorInvalidDevice"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(MEMFIT_CUDA_LAUNCH_CHECK());  // cleared: not reported twice
}

}  // namespace
}  // namespace memfit
