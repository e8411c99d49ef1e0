// MetaBackend: validates exactly as the CPU backend does, counts the work, and never touches
// memory (its tensors carry NullProvider addresses; a dereference would crash the test).
#include "core/meta/meta_backend.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/tensor.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"
#include "tests/core/backend_testutil.h"

namespace memfit {
namespace {

// Address-only tensors on the meta device, as a dry run's executor makes them.
class MetaTensors {
 public:
  Tensor make(Shape s, DType dt) {
    const std::size_t bytes = static_cast<std::size_t>(s.numel()) * dtype_size(dt);
    void* p = null_.allocate(bytes == 0 ? 1 : bytes);
    ptrs_.push_back({p, bytes == 0 ? 1 : bytes});
    return Tensor(p, s, dt, Device::kMeta);
  }
  ~MetaTensors() {
    for (auto& [p, n] : ptrs_) null_.deallocate(p, n);
  }

 private:
  NullProvider null_;
  std::vector<std::pair<void*, std::size_t>> ptrs_;
};

TEST(MetaBackend, Identity) {
  MetaBackend be;
  EXPECT_EQ(be.device(), Device::kMeta);
  EXPECT_STREQ(be.name(), "meta");
  EXPECT_STREQ(meta_op_name(MetaOp::kSumSq), "sumsq");
}

TEST(MetaBackend, OpsCountWithoutTouchingMemory) {
  MetaBackend be;
  MetaTensors mt;
  Tensor a = mt.make({4, 3, 5}, DType::kBF16);  // batch 4 of (3,5)
  Tensor w = mt.make({7, 5}, DType::kF32);      // broadcast (7,5), used transposed
  Tensor c = mt.make({4, 3, 7}, DType::kF16);
  GemmDesc d;
  d.m = 3;
  d.n = 7;
  d.k = 5;
  d.trans_b = true;
  d.batch = 4;
  d.stride_b = 0;
  be.gemm(kDefaultStream, d, a, w, c);
  MetaStats s = be.stats();
  EXPECT_EQ(s.calls(MetaOp::kGemm), 1);
  EXPECT_EQ(s.gemm_flops, 2 * 3 * 7 * 5 * 4);
  EXPECT_EQ(s.bytes_read, 4 * 15 * 2 + 35 * 4);  // beta == 0: C is not read
  EXPECT_EQ(s.bytes_written, 4 * 21 * 2);
  d.beta = 1.0f;
  be.gemm(kDefaultStream, d, a, w, c);
  EXPECT_EQ(be.stats().bytes_read - s.bytes_read, 4 * 15 * 2 + 35 * 4 + 4 * 21 * 2);

  be.reset_stats();
  Tensor x = mt.make({1000}, DType::kBF16), y = mt.make({1000}, DType::kF32);
  Tensor y2 = mt.make({10, 100}, DType::kF32);
  Tensor out = mt.make({2}, DType::kF32);
  be.fill(kDefaultStream, x, 1.0f);
  be.copy(kDefaultStream, y, y2);
  be.cast(kDefaultStream, x, y);
  be.axpy(kDefaultStream, 0.5f, x, y);
  be.scale(kDefaultStream, 2.0f, x);
  be.sumsq(kDefaultStream, x, out);
  s = be.stats();
  for (MetaOp op : {MetaOp::kFill, MetaOp::kCopy, MetaOp::kCast, MetaOp::kAxpy, MetaOp::kScale,
                    MetaOp::kSumSq}) {
    EXPECT_EQ(s.calls(op), 1) << meta_op_name(op);
  }
  EXPECT_EQ(s.calls(MetaOp::kGemm), 0);
  EXPECT_EQ(s.total_calls(), 6);
  EXPECT_EQ(s.gemm_flops, 0);
  // fill 0 + copy 4000 + cast 2000 + axpy 6000 + scale 2000 + sumsq 2008
  EXPECT_EQ(s.bytes_read, 4000 + 2000 + 6000 + 2000 + 2008);
  EXPECT_EQ(s.bytes_written, 2000 + 4000 + 4000 + 4000 + 2000 + 8);
  EXPECT_EQ(s.bytes_moved(), s.bytes_read + s.bytes_written);
  EXPECT_EQ(s.host_copy_bytes, 0);
}

TEST(MetaBackend, HostTransfersCountSeparately) {
  MetaBackend be;
  MetaTensors mt;
  testing::HostBuf host(DType::kF32, 256);
  Tensor dev = mt.make({256}, DType::kF32);
  be.copy(kDefaultStream, host.t(), dev);  // the offload path: host <-> device
  be.copy(kDefaultStream, dev, host.t());
  EXPECT_EQ(be.stats().host_copy_bytes, 2 * 1024);
  // Only copy crosses devices; the other ops want meta tensors.
  EXPECT_THROW(be.scale(kDefaultStream, 1.0f, host.t()), InvalidArgument);
}

TEST(MetaBackend, StreamsEventsAndAllocator) {
  MetaBackend be;
  NullProvider null;
  CachingAllocator alloc(null, {}, &be.stream_sync());
  StreamId s = be.create_stream();
  {
    Block b = alloc.allocate(1 << 20, Category::kActivation, kDefaultStream);
    b.record_stream(s);
  }
  alloc.empty_cache();
  EventHandle e = be.record_event(s);
  EXPECT_TRUE(be.query_event(e));
  be.release_event(e);
  EXPECT_EQ(be.live_events(), 0u);  // the allocator released every event it recorded
  be.destroy_stream(s);
  EXPECT_THROW(be.fill(s, Tensor(), 0.0f), InvalidArgument);
}

// Every bad call is rejected by both backends with the same message (but the backend name):
// the checks live in Backend, so a plan that dry-runs on meta runs on the CPU.
TEST(MetaBackend, RejectsWhatCpuRejects) {
  MetaBackend meta;
  CpuBackend cpu;
  MetaTensors mt;
  testing::HostBuf h6(DType::kF32, 6), h12(DType::kF32, 12), h8(DType::kF16, 8), h7(DType::kF32, 7),
      h2(DType::kBF16, 2);
  struct Operands {
    Tensor a6, b12, c8, x7, o2;
  };
  Operands on_meta{mt.make({6}, DType::kF32), mt.make({12}, DType::kF32), mt.make({8}, DType::kF16),
                   mt.make({7}, DType::kF32), mt.make({2}, DType::kBF16)};
  Operands on_cpu{h6.t(), h12.t(), h8.t(), h7.t(), h2.t()};
  GemmDesc d;
  d.m = 2;
  d.n = 4;
  d.k = 3;
  std::vector<std::function<void(Backend&, const Operands&)>> bad = {
      [&](Backend& b, const Operands& o) {
        GemmDesc e = d;
        e.k = 4;
        b.gemm(kDefaultStream, e, o.a6, o.b12, o.c8);
      },
      [&](Backend& b, const Operands& o) {
        GemmDesc e = d;
        e.batch = 2;
        e.stride_c = 3;
        e.stride_a = e.stride_b = 0;
        b.gemm(kDefaultStream, e, o.a6, o.b12, o.c8);
      },
      [&](Backend& b, const Operands& o) {
        GemmDesc e = d;
        e.n = std::int64_t{1} << 31;
        b.gemm(kDefaultStream, e, o.a6, o.b12, o.c8);
      },
      [&](Backend& b, const Operands& o) { b.copy(kDefaultStream, o.a6, o.x7); },
      [&](Backend& b, const Operands& o) { b.copy(kDefaultStream, o.c8, o.b12); },
      [&](Backend& b, const Operands& o) { b.cast(kDefaultStream, o.a6, o.c8); },
      [&](Backend& b, const Operands& o) { b.axpy(kDefaultStream, 1, o.x7, o.b12); },
      [&](Backend& b, const Operands& o) { b.sumsq(kDefaultStream, o.a6, o.o2); },
      [&](Backend& b, const Operands& o) { b.fill(42, o.a6, 0.0f); },
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    std::string m_msg, c_msg;
    try {
      bad[i](meta, on_meta);
    } catch (const InvalidArgument& e) {
      m_msg = e.what();
    }
    try {
      bad[i](cpu, on_cpu);
    } catch (const InvalidArgument& e) {
      c_msg = e.what();
    }
    ASSERT_FALSE(m_msg.empty()) << "meta accepted bad call " << i;
    ASSERT_FALSE(c_msg.empty()) << "cpu accepted bad call " << i;
    EXPECT_NE(m_msg.find("(meta)"), std::string::npos) << m_msg;
    // Same text once the backend names, devices and addresses are set aside.
    auto strip = [](std::string s) {
      for (const char* w : {"(meta)", "(cpu)", " on meta", " on cpu"}) {
        for (std::size_t p; (p = s.find(w)) != std::string::npos;)
          s.erase(p, std::string(w).size());
      }
      return s;
    };
    EXPECT_EQ(strip(m_msg), strip(c_msg)) << "bad call " << i;
  }
  EXPECT_EQ(meta.stats().total_calls(), 0);  // rejected calls are not counted
  // CPU tensors are not meta tensors.
  EXPECT_THROW(meta.gemm(kDefaultStream, d, on_cpu.a6, on_cpu.b12, on_cpu.c8), InvalidArgument);
}

TEST(MetaBackend, LargeDryRunShapes) {
  // A GPT-2-XL-sized projection: the meta backend only does arithmetic on sizes
  // (24 * 1024 * 6400 * 1600 * 2 flops).
  MetaBackend be;
  MetaTensors mt;
  Tensor inp = mt.make({24, 1024, 1600}, DType::kBF16);
  Tensor w = mt.make({6400, 1600}, DType::kBF16);
  Tensor out = mt.make({24, 1024, 6400}, DType::kBF16);
  GemmDesc d;
  d.m = 24 * 1024;
  d.n = 6400;
  d.k = 1600;
  d.trans_b = true;
  be.gemm(kDefaultStream, d, inp, w, out);
  EXPECT_EQ(be.stats().gemm_flops, std::int64_t{2} * 24 * 1024 * 6400 * 1600);
}

TEST(MetaBackend, FullScaleDryRunTouchesNoMemory) {
  // Unfused attention scores of a 64K-token context, 8 sequences x 96 heads: 6 TiB of bf16,
  // more than any host holds. The dry run takes the real path (OwnedTensor::empty on a
  // CachingAllocator over a NullProvider, then Backend's checks) and only counts; a single
  // read or write of these addresses would crash, and an allocation proportional to the
  // tensors would fail.
  MetaBackend be;
  NullProvider null;
  CachingAllocator alloc(null, {}, &be.stream_sync());
  const std::int64_t heads = 8 * 96, t = 65536, hd = 128;
  const OwnedTensor q =
      OwnedTensor::empty(alloc, {heads, t, hd}, DType::kBF16, Device::kMeta, Category::kActivation);
  const OwnedTensor k =
      OwnedTensor::empty(alloc, {heads, t, hd}, DType::kBF16, Device::kMeta, Category::kActivation);
  const OwnedTensor scores =
      OwnedTensor::empty(alloc, {heads, t, t}, DType::kBF16, Device::kMeta, Category::kActivation);
  const std::int64_t score_bytes = heads * t * t * 2;
  EXPECT_GE(null.peak_in_use(), static_cast<std::size_t>(score_bytes));
  GemmDesc d;  // scores[h] = q[h] @ k[h]^T
  d.m = t;
  d.n = t;
  d.k = hd;
  d.trans_b = true;
  d.batch = heads;
  be.gemm(kDefaultStream, d, q, k, scores);
  be.scale(kDefaultStream, 0.088f, scores);
  const MetaStats s = be.stats();
  EXPECT_EQ(s.gemm_flops, 2 * t * t * hd * heads);
  EXPECT_EQ(s.bytes_written, 2 * score_bytes);
  EXPECT_EQ(s.bytes_read, 2 * heads * t * hd * 2 + score_bytes);
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// A dry run of a CPU run whose GEMM scratch counts against the budget must see that scratch:
// the meta backend, given the same workspace allocator role, makes the same allocations.
TEST(MetaBackend, WorkspaceAllocatorMirrorsCpuGemmScratch) {
  auto run = [](Backend& be, MemoryProvider& provider, auto set_ws) {
    CachingAllocator alloc(provider, {}, &be.stream_sync());
    set_ws(&alloc);
    const Device dev = be.device();
    {
      OwnedTensor a = OwnedTensor::empty(alloc, {64, 96}, DType::kBF16, dev, Category::kActivation);
      OwnedTensor b = OwnedTensor::empty(alloc, {128, 96}, DType::kF16, dev, Category::kParameter);
      OwnedTensor c =
          OwnedTensor::empty(alloc, {64, 128}, DType::kBF16, dev, Category::kActivation);
      OwnedTensor f = OwnedTensor::empty(alloc, {64, 128}, DType::kF32, dev, Category::kActivation);
      if (dev != Device::kMeta) {
        be.fill(kDefaultStream, a, 0.5f);
        be.fill(kDefaultStream, b, 0.25f);
      }
      GemmDesc d;
      d.m = 64;
      d.n = 128;
      d.k = 96;
      d.trans_b = true;
      be.gemm(kDefaultStream, d, a, b, c);  // scratch for A, B and C
      GemmDesc e = d;
      e.beta = 1.0f;
      be.gemm(kDefaultStream, e, a, b, f);  // scratch for A and B only
    }
    set_ws(nullptr);
    return alloc.stats();
  };
  CpuBackend cpu;
  HostProvider host;
  const AllocatorStats sc =
      run(cpu, host, [&](CachingAllocator* a) { cpu.set_workspace_allocator(a); });
  MetaBackend meta;
  NullProvider null;
  const AllocatorStats sm =
      run(meta, null, [&](CachingAllocator* a) { meta.set_workspace_allocator(a); });
  const auto ws = category_index(Category::kWorkspace);
  EXPECT_GT(sc.category_bytes[ws].allocated, 0);
  EXPECT_EQ(sm.category_bytes[ws].allocated, sc.category_bytes[ws].allocated);
  EXPECT_EQ(sm.category_bytes[ws].peak, sc.category_bytes[ws].peak);
  EXPECT_EQ(sm.allocation[0].allocated, sc.allocation[0].allocated);
  EXPECT_EQ(sm.allocated_bytes[0].peak, sc.allocated_bytes[0].peak);
  EXPECT_EQ(sm.reserved_bytes[0].peak, sc.reserved_bytes[0].peak);
}

}  // namespace
}  // namespace memfit
