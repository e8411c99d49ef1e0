// CpuBackend: streams and events, the elementwise ops against scalar references, sumsq's
// non-finite flag, and the argument checks every backend shares.
#include "core/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <string>

#include "core/cpu/scratch_pool.h"
#include "memory/allocator_event.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "tests/core/backend_testutil.h"

namespace memfit {
namespace {

using testing::HostBuf;
using testing::kAllDTypes;
using testing::expect_invalid;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Sizes around the 4096-element chunk and the 64K parallel threshold, and odd ones.
constexpr std::int64_t kSizes[] = {0, 1, 3, 17, 4095, 4097, 65536 + 67, 200003};

// v rounded to t by the scalar conversions (the reference for convert()).
float round_to(DType t, float v) {
  if (t == DType::kF16) return f16_to_f32(f32_to_f16(v));
  if (t == DType::kBF16) return bf16_to_f32(f32_to_bf16(v));
  return v;
}


TEST(CpuBackend, Identity) {
  CpuBackend be;
  EXPECT_EQ(be.device(), Device::kCpu);
  EXPECT_STREQ(be.name(), "cpu");
}

TEST(CpuBackend, StreamsAndEvents) {
  CpuBackend be;
  EXPECT_TRUE(be.has_stream(kDefaultStream));
  StreamId s1 = be.create_stream(), s2 = be.create_stream();
  EXPECT_NE(s1, s2);
  EXPECT_NE(s1, kDefaultStream);
  EXPECT_TRUE(be.has_stream(s1));
  EventHandle e = be.record_event(s1);
  EXPECT_NE(e, 0u);
  EXPECT_TRUE(be.query_event(e));  // inline: complete when recorded
  be.wait_event(s2, e);
  be.synchronize_event(e);
  be.release_event(e);
  expect_invalid([&] { be.query_event(e); }, {"query_event", "unknown event"});
  expect_invalid([&] { be.release_event(e); }, {"release_event"});
  expect_invalid([&] { be.release_event(0); }, {"unknown event 0"});
  be.synchronize(s1);
  be.destroy_stream(s1);
  EXPECT_FALSE(be.has_stream(s1));
  expect_invalid([&] { be.synchronize(s1); }, {"synchronize", "unknown stream"});
  expect_invalid([&] { be.record_event(s1); }, {"record_event"});
  expect_invalid([&] { be.destroy_stream(s1); }, {"destroy_stream"});
  expect_invalid([&] { be.destroy_stream(kDefaultStream); }, {"kDefaultStream"});
  HostBuf x(DType::kF32, 4);
  expect_invalid([&] { be.fill(s1, x.t(), 1.0f); }, {"fill", "unknown stream"});
  be.fill(s2, x.t(), 1.0f);
  be.destroy_stream(s2);
  EXPECT_EQ(be.live_events(), 0u);
}

TEST(CpuBackend, StreamSyncDrivesCachingAllocator) {
  // A block used on a second stream is reused there only after the backend's event says so;
  // inline events make that immediate, and every event the allocator records is released.
  CpuBackend be;
  HostProvider host;
  CachingAllocator alloc(host, {}, &be.stream_sync());
  StreamId side = be.create_stream();
  void* first = nullptr;
  {
    Block b = alloc.allocate(4096, Category::kActivation, kDefaultStream);
    first = b.data();
    b.record_stream(side);
  }
  Block again = alloc.allocate(4096, Category::kActivation, kDefaultStream);
  EXPECT_EQ(again.data(), first);
  again.reset();
  alloc.empty_cache();
  EXPECT_EQ(be.live_events(), 0u);
  // The allocator passes the stream ids it was given; an id the backend does not know is a
  // caller bug and surfaces as InvalidArgument from the backend.
  Block c = alloc.allocate(4096, Category::kActivation, kDefaultStream);
  c.record_stream(999);
  EXPECT_THROW(c.reset(), InvalidArgument);
}

TEST(CpuBackend, FillRoundsToDType) {
  CpuBackend be;
  for (DType dt : kAllDTypes) {
    for (std::int64_t n : kSizes) {
      HostBuf x(dt, n);
      x.fill(kNaN);
      be.fill(kDefaultStream, x.t(), 0.1f);
      for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(x.get(i), round_to(dt, 0.1f)) << dtype_name(dt) << " n=" << n << " i=" << i;
      }
    }
    HostBuf y(dt, 3);
    be.fill(kDefaultStream, y.t(), 1e30f);  // overflows f16 to inf, not a clamp
    EXPECT_EQ(y.get(2), round_to(dt, 1e30f));
  }
}

TEST(CpuBackend, CopyIsBitExact) {
  CpuBackend be;
  std::mt19937 rng(3);
  for (DType dt : kAllDTypes) {
    for (std::int64_t n : kSizes) {
      HostBuf src(dt, n), dst(dt, n);
      src.randomize(rng);
      if (n > 2) src.set(1, kNaN);
      be.copy(kDefaultStream, src.t(), dst.t(Shape{1, n}));  // shapes may differ
      ASSERT_EQ(std::memcmp(src.t().raw(), dst.t().raw(), src.t().nbytes()), 0);
    }
  }
}

TEST(CpuBackend, CastMatchesScalarConversion) {
  CpuBackend be;
  std::mt19937 rng(4);
  for (DType from : kAllDTypes) {
    for (DType to : kAllDTypes) {
      for (std::int64_t n : {std::int64_t{1}, std::int64_t{4097}, std::int64_t{200003}}) {
        HostBuf src(from, n), dst(to, n);
        src.randomize(rng, -70000.0f, 70000.0f);  // past f16's range too
        dst.fill(kNaN);
        be.cast(kDefaultStream, src.t(), dst.t());
        for (std::int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(dst.get(i), round_to(to, src.get(i)))
              << dtype_name(from) << "->" << dtype_name(to) << " i=" << i;
        }
      }
    }
  }
}

TEST(CpuBackend, AxpyAllDTypePairs) {
  CpuBackend be;
  std::mt19937 rng(5);
  for (DType dx : kAllDTypes) {
    for (DType dy : kAllDTypes) {
      for (std::int64_t n : kSizes) {
        HostBuf x(dx, n), y(dy, n), y0(DType::kF32, n);
        x.randomize(rng);
        y.randomize(rng);
        for (std::int64_t i = 0; i < n; ++i) y0.set(i, y.get(i));
        be.axpy(kDefaultStream, -0.375f, x.t(), y.t());
        for (std::int64_t i = 0; i < n; ++i) {
          // FP32 math, one rounding to y's dtype.
          const float want = round_to(dy, y0.get(i) + -0.375f * x.get(i));
          ASSERT_EQ(y.get(i), want) << dtype_name(dx) << "->" << dtype_name(dy) << " i=" << i;
        }
      }
    }
  }
  HostBuf z(DType::kBF16, 5);  // x == y: y += a*y
  z.fill(2.0f);
  be.axpy(kDefaultStream, 0.5f, z.t(), z.t());
  EXPECT_EQ(z.get(4), 3.0f);
}

TEST(CpuBackend, ScaleAllDTypes) {
  CpuBackend be;
  std::mt19937 rng(6);
  for (DType dt : kAllDTypes) {
    for (std::int64_t n : kSizes) {
      HostBuf x(dt, n), x0(DType::kF32, n);
      x.randomize(rng);
      for (std::int64_t i = 0; i < n; ++i) x0.set(i, x.get(i));
      be.scale(kDefaultStream, 1.0f / 3.0f, x.t());
      for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(x.get(i), round_to(dt, x0.get(i) * (1.0f / 3.0f))) << dtype_name(dt);
      }
    }
  }
}

TEST(CpuBackend, SumSqMatchesDoubleAndAccumulates) {
  CpuBackend be;
  std::mt19937 rng(7);
  for (DType dt : kAllDTypes) {
    for (std::int64_t n : kSizes) {
      HostBuf x(dt, n), out(DType::kF32, kSumSqSlots);
      x.randomize(rng, -3.0f, 3.0f);
      double want = 0;
      for (std::int64_t i = 0; i < n; ++i) want += double(x.get(i)) * x.get(i);
      be.fill(kDefaultStream, out.t(), 0.0f);
      be.sumsq(kDefaultStream, x.t(), out.t());
      be.synchronize(kDefaultStream);
      SumSqResult r = read_sumsq(out.t());
      EXPECT_NEAR(r.sum_sq, want, 1e-6 * want + 1e-30) << dtype_name(dt) << " n=" << n;
      EXPECT_FALSE(r.nonfinite);
      be.sumsq(kDefaultStream, x.t(), out.t());  // accumulates
      EXPECT_NEAR(read_sumsq(out.t()).sum_sq, 2 * want, 2e-6 * want + 1e-30);
    }
  }
}

TEST(CpuBackend, SumSqFlagsEveryNonFiniteKind) {
  CpuBackend be;
  for (DType dt : kAllDTypes) {
    for (float bad : {kNaN, kInf, -kInf}) {
      for (std::int64_t where : {std::int64_t{0}, std::int64_t{4096}, std::int64_t{199999}}) {
        HostBuf x(dt, 200003), out(DType::kF32, kSumSqSlots);
        x.fill(0.5f);
        x.set(where, bad);
        be.fill(kDefaultStream, out.t(), 0.0f);
        be.sumsq(kDefaultStream, x.t(), out.t());
        SumSqResult r = read_sumsq(out.t());
        EXPECT_TRUE(r.nonfinite) << dtype_name(dt) << " " << bad << " at " << where;
        EXPECT_EQ(out.get(1), 1.0f);  // a count
        // The finite elements still sum: 200002 * 0.25.
        EXPECT_DOUBLE_EQ(r.sum_sq, 200002 * 0.25);
      }
    }
  }
  // f16 overflow on store makes an inf that the flag then sees.
  HostBuf h(DType::kF16, 2), out(DType::kF32, kSumSqSlots);
  h.fill(70000.0f);
  be.fill(kDefaultStream, out.t(), 0.0f);
  be.sumsq(kDefaultStream, h.t(), out.t());
  EXPECT_EQ(out.get(1), 2.0f);
  // Finite elements whose squares overflow f32: the sum saturates, the flag stays clear.
  HostBuf big(DType::kF32, 2);
  big.fill(3e19f);
  be.fill(kDefaultStream, out.t(), 0.0f);
  be.sumsq(kDefaultStream, big.t(), out.t());
  EXPECT_EQ(out.get(0), kInf);
  EXPECT_EQ(out.get(1), 0.0f);
}

TEST(CpuBackend, RejectsBadArguments) {
  CpuBackend be;
  HostBuf f(DType::kF32, 8), g(DType::kF32, 8), h(DType::kBF16, 8), small(DType::kF32, 7);
  Tensor meta(reinterpret_cast<void*>(0x1000), Shape{8}, DType::kF32, Device::kMeta);
  Tensor null;  // default: a scalar view of nothing
  expect_invalid([&] { be.fill(kDefaultStream, meta, 0); }, {"fill (cpu)", "x", "meta", "valid"});
  expect_invalid([&] { be.scale(kDefaultStream, 2, null); }, {"scale", "no memory"});
  expect_invalid([&] { be.copy(kDefaultStream, f.t(), h.t()); }, {"copy", "same dtype", "cast"});
  expect_invalid([&] { be.copy(kDefaultStream, f.t(), small.t()); }, {"copy", "(7)", "(8)"});
  expect_invalid([&] { be.copy(kDefaultStream, f.at(0, 4), f.at(2, 4)); }, {"overlaps"});
  expect_invalid([&] { be.cast(kDefaultStream, f.t(), small.t()); }, {"cast", "same number"});
  Tensor f_as_bf16(static_cast<char*>(f.t().raw()) + 4, Shape{4}, DType::kBF16, Device::kCpu);
  expect_invalid([&] { be.cast(kDefaultStream, f.at(0, 4), f_as_bf16); }, {"cast", "overlaps"});
  expect_invalid([&] { be.axpy(kDefaultStream, 1, f.t(), small.t()); }, {"axpy"});
  expect_invalid([&] { be.axpy(kDefaultStream, 1, f.at(0, 4), f.at(1, 4)); }, {"axpy", "overlaps"});
  expect_invalid([&] { be.sumsq(kDefaultStream, f.t(), h.at(0, 2)); },
                 {"sumsq", "f32", "2 elements"});
  expect_invalid([&] { be.sumsq(kDefaultStream, f.t(), f.at(6, 2)); }, {"sumsq", "overlaps"});
  expect_invalid([&] { read_sumsq(meta); }, {"read_sumsq", "host"});
  // A rejected op has written nothing.
  g.fill(5.0f);
  EXPECT_THROW(be.axpy(kDefaultStream, 1, small.t(), g.t()), InvalidArgument);
  EXPECT_EQ(g.get(0), 5.0f);
}

TEST(CpuBackend, GemmRejectsBadShapes) {
  CpuBackend be;
  HostBuf a(DType::kF32, 6), b(DType::kBF16, 12), c(DType::kF16, 8);
  GemmDesc d;
  d.m = 2;
  d.n = 4;
  d.k = 3;                                          // A (2,3)=6, B (3,4)=12, C (2,4)=8
  be.gemm(kDefaultStream, d, a.t(), b.t(), c.t());  // fits exactly
  GemmDesc e = d;
  e.k = 4;
  expect_invalid([&] { be.gemm(kDefaultStream, e, a.t(), b.t(), c.t()); },
                 {"gemm (cpu)", "A is f32 (6)", "need 8", "valid"});
  e = d;
  e.batch = 2;
  expect_invalid([&] { be.gemm(kDefaultStream, e, a.t(), b.t(), c.t()); }, {"need 12"});
  e.stride_a = e.stride_b = 0;
  e.stride_c = 7;  // C's batch entries would overlap
  expect_invalid([&] { be.gemm(kDefaultStream, e, a.t(), b.t(), c.t()); }, {"stride_c"});
  e = d;
  e.m = -1;
  expect_invalid([&] { be.gemm(kDefaultStream, e, a.t(), b.t(), c.t()); }, {"m=-1", ">= 0"});
  e = d;
  e.stride_b = -5;
  expect_invalid([&] { be.gemm(kDefaultStream, e, a.t(), b.t(), c.t()); }, {"stride_b=-5"});
  e = d;
  e.k = std::int64_t{1} << 31;  // beyond CBLAS's 32-bit sizes
  expect_invalid([&] { be.gemm(kDefaultStream, e, a.t(), b.t(), c.t()); }, {"<= 2147483647"});
  e = d;
  e.batch = std::int64_t{1} << 31;  // beyond cuBLAS's 32-bit batch count, on every backend
  expect_invalid([&] { be.gemm(kDefaultStream, e, a.t(), b.t(), c.t()); },
                 {"batch=2147483648", "<= 2147483647"});
  e = d;
  e.m = e.n = e.k = std::int64_t{1} << 40;
  e.batch = std::int64_t{1} << 40;
  expect_invalid([&] { be.gemm(kDefaultStream, e, a.t(), b.t(), c.t()); }, {});
  // Output aliasing an input.
  HostBuf shared(DType::kF32, 20);
  GemmDesc s;
  s.m = 2;
  s.n = 2;
  s.k = 2;
  expect_invalid(
      [&] { be.gemm(kDefaultStream, s, shared.at(0, 4), shared.at(4, 4), shared.at(6, 4)); },
      {"C", "overlaps", "B"});
  be.gemm(kDefaultStream, s, shared.at(0, 4), shared.at(4, 4), shared.at(8, 4));  // adjacent: fine
  Tensor on_meta(reinterpret_cast<void*>(0x1000), Shape{8}, DType::kF16, Device::kMeta);
  expect_invalid([&] { be.gemm(kDefaultStream, d, a.t(), b.t(), on_meta); }, {"C is", "meta"});
}

TEST(CpuBackend, GemmScratchFromPoolOrWorkspaceAllocator) {
  // bf16 A and C need scratch (A: 3*5, C: 3*4 floats); B is f32 and is used in place.
  std::mt19937 rng(11);
  HostBuf a(DType::kBF16, 15), b(DType::kF32, 20), c1(DType::kBF16, 12), c2(DType::kBF16, 12);
  a.randomize(rng);
  b.randomize(rng);
  GemmDesc d;
  d.m = 3;
  d.n = 4;
  d.k = 5;
  CpuBackend pooled;
  EXPECT_EQ(pooled.scratch_bytes(), 0u);
  pooled.gemm(kDefaultStream, d, a.t(), b.t(), c1.t());
  EXPECT_EQ(pooled.scratch_bytes(), (15 + 12) * sizeof(float));
  pooled.gemm(kDefaultStream, d, a.t(), b.t(), c1.t());  // reused, not grown
  EXPECT_EQ(pooled.scratch_bytes(), (15 + 12) * sizeof(float));
  pooled.release_scratch();
  EXPECT_EQ(pooled.scratch_bytes(), 0u);

  CpuBackend be;
  HostProvider host;
  CachingAllocator alloc(host, {}, &be.stream_sync());
  be.set_workspace_allocator(&alloc);
  int workspace_allocs = 0;
  alloc.add_listener([&](const AllocatorEvent& e) {
    if (e.kind == EventKind::kAlloc && e.category == Category::kWorkspace &&
        e.tag == "cpu.gemm.scratch") {
      ++workspace_allocs;
    }
  });
  be.gemm(kDefaultStream, d, a.t(), b.t(), c2.t());
  EXPECT_EQ(workspace_allocs, 1);
  const AllocatorStats st = alloc.stats();
  EXPECT_EQ(st.requested_bytes[kStatAll].peak,
            static_cast<std::int64_t>((15 + 12) * sizeof(float)));
  EXPECT_EQ(st.allocated_bytes[kStatAll].current, 0);  // freed on return
  EXPECT_EQ(be.scratch_bytes(), 0u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(c1.get(i), c2.get(i));
  // Under a budget too small for the scratch, the GEMM fails as an OOM and writes nothing.
  c2.fill(7.0f);
  alloc.empty_cache();
  alloc.set_budget(64);
  EXPECT_THROW(be.gemm(kDefaultStream, d, a.t(), b.t(), c2.t()), OutOfMemory);
  EXPECT_EQ(c2.get(0), 7.0f);
}

TEST(ScratchPool, ReusesFittingBuffersAndBoundsIdle) {
  cpu::ScratchPool pool;
  float* first;
  {
    auto l = pool.take(100);
    first = l.data();
    EXPECT_GE(l.capacity(), 100u);
  }
  {
    auto l = pool.take(50);  // fits in the idle 100
    EXPECT_EQ(l.data(), first);
    auto m = pool.take(50);  // the 100 is leased: a new one
    EXPECT_NE(m.data(), first);
  }
  EXPECT_EQ(pool.held_bytes(), 150 * sizeof(float));
  std::vector<cpu::ScratchPool::Lease> many;
  for (int i = 0; i < 8; ++i) many.push_back(pool.take(1000 + i));
  many.clear();  // only kMaxIdle stay
  EXPECT_LE(pool.held_bytes(), cpu::ScratchPool::kMaxIdle * 1007 * sizeof(float));
  pool.release_idle();
  EXPECT_EQ(pool.held_bytes(), 0u);
  // A request no host can meet (its byte count does not even fit size_t) fails without
  // counting the memory it did not get.
  EXPECT_THROW(pool.take(SIZE_MAX / 2), std::bad_alloc);
  EXPECT_EQ(pool.held_bytes(), 0u);
}

}  // namespace
}  // namespace memfit
