#include "profiler/cuda/cupti_tracer.h"

#include <cuda_runtime_api.h>
#include <cupti.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>

#include "memory/cuda/cuda_provider.h"
#include "memory/error.h"

namespace memfit {

namespace {

// ---- record layouts -------------------------------------------------------------------------
// CUPTI hands back the newest record version of the library in use, which is the newest the
// header declares. Versions by toolkit: CUDA 12.0 brought Kernel9, 12.8 Memcpy6 (CUPTI API
// version 26), 13.0 Kernel10 and Memory4; Memset4 and Marker2 span both.
#if CUPTI_API_VERSION >= 130000
using KernelRecord = CUpti_ActivityKernel10;
using MemcpyRecord = CUpti_ActivityMemcpy6;
using MemoryRecord = CUpti_ActivityMemory4;
#elif CUPTI_API_VERSION >= 26
using KernelRecord = CUpti_ActivityKernel9;
using MemcpyRecord = CUpti_ActivityMemcpy6;
using MemoryRecord = CUpti_ActivityMemory3;
#else
using KernelRecord = CUpti_ActivityKernel9;
using MemcpyRecord = CUpti_ActivityMemcpy5;
using MemoryRecord = CUpti_ActivityMemory3;
#endif
using MemsetRecord = CUpti_ActivityMemset4;
using MarkerRecord = CUpti_ActivityMarker2;

#if CUPTI_API_VERSION >= 130000
// The fields read here sit at the same offsets in the CUDA 12 versions (declared in CUDA 13's
// cupti_activity_deprecated.h), so a 12.x minor whose newest version differs from the choice
// above still reads them right.
#define MEMFIT_SAME_OFFSET(A, B, f) static_assert(offsetof(A, f) == offsetof(B, f), #A "." #f)
MEMFIT_SAME_OFFSET(CUpti_ActivityKernel9, KernelRecord, start);
MEMFIT_SAME_OFFSET(CUpti_ActivityKernel9, KernelRecord, end);
MEMFIT_SAME_OFFSET(CUpti_ActivityKernel9, KernelRecord, streamId);
MEMFIT_SAME_OFFSET(CUpti_ActivityKernel9, KernelRecord, name);
MEMFIT_SAME_OFFSET(CUpti_ActivityMemcpy5, MemcpyRecord, start);
MEMFIT_SAME_OFFSET(CUpti_ActivityMemcpy5, MemcpyRecord, end);
MEMFIT_SAME_OFFSET(CUpti_ActivityMemcpy5, MemcpyRecord, streamId);
MEMFIT_SAME_OFFSET(CUpti_ActivityMemcpy5, MemcpyRecord, bytes);
MEMFIT_SAME_OFFSET(CUpti_ActivityMemcpy5, MemcpyRecord, copyKind);
MEMFIT_SAME_OFFSET(CUpti_ActivityMemory3, MemoryRecord, timestamp);
MEMFIT_SAME_OFFSET(CUpti_ActivityMemory3, MemoryRecord, address);
MEMFIT_SAME_OFFSET(CUpti_ActivityMemory3, MemoryRecord, bytes);
MEMFIT_SAME_OFFSET(CUpti_ActivityMemory3, MemoryRecord, memoryOperationType);
MEMFIT_SAME_OFFSET(CUpti_ActivityMemory3, MemoryRecord, memoryKind);
MEMFIT_SAME_OFFSET(CUpti_ActivityMemory3, MemoryRecord, streamId);
#undef MEMFIT_SAME_OFFSET
#endif

constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_MEMORY2, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,  CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_MARKER,
};
const char* kind_call(CUpti_ActivityKind k) {
  switch (k) {
    case CUPTI_ACTIVITY_KIND_MEMORY2:
      return "(CUPTI_ACTIVITY_KIND_MEMORY2)";
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return "(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)";
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return "(CUPTI_ACTIVITY_KIND_MEMCPY)";
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return "(CUPTI_ACTIVITY_KIND_MEMSET)";
    case CUPTI_ACTIVITY_KIND_MARKER:
      return "(CUPTI_ACTIVITY_KIND_MARKER)";
    default:
      return "(?)";
  }
}

std::string result_text(CUptiResult r) {
  const char* s = nullptr;
  if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || s == nullptr) s = "unknown CUPTI result";
  return std::string(s) + " (" + std::to_string(static_cast<int>(r)) + ")";
}

void check(CUptiResult r, const std::string& call) {
  if (r != CUPTI_SUCCESS) throw CudaError("CuptiTracer: " + call + " failed: " + result_text(r));
}

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* memcpy_name(std::uint32_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "PtoP";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:
      return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
      return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
      return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
      return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
      return "DtoA";
    default:
      return "memcpy";
  }
}

const char* memory_kind_name(std::uint32_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE:
      return "device";
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED:
      return "pinned";
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE:
      return "pageable";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED:
      return "managed";
    case CUPTI_ACTIVITY_MEMORY_KIND_ARRAY:
      return "array";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC:
      return "device_static";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC:
      return "managed_static";
    default:
      return "unknown";
  }
}

// ---- the process-wide side: buffer pool, callbacks, the running tracer ----------------------
constexpr std::size_t kBufferBytes = std::size_t{4} << 20;
constexpr std::size_t kBufferAlign = 64;  // CUPTI needs 8
constexpr std::size_t kMaxBuffers = 64;

struct Global {
  std::mutex mu;  // guards everything here and the running tracer's records
  std::vector<std::uint8_t*> free_buffers;
  std::size_t buffers = 0;  // obtained so far (free or with CUPTI)
  bool callbacks_registered = false;
  CuptiTracer::Impl* running = nullptr;
};

Global& global() {
  static Global* g = new Global();  // leaked: CUPTI may call back during static destruction
  return *g;
}

}  // namespace

struct CuptiTracer::Impl {
  std::vector<GpuActivity> records;                     // guarded by global().mu
  std::unordered_map<std::uint32_t, GpuActivity> open;  // marker id -> its start
  std::uint64_t cupti_dropped = 0;
  std::uint64_t buffers_missing = 0;
  std::int64_t offset_ns = 0;  // steady_clock ns - CUPTI ns
  bool started = false;

  std::int64_t to_steady(std::uint64_t cupti_ns) const {
    return static_cast<std::int64_t>(cupti_ns) + offset_ns;
  }

  void add(const CUpti_Activity* rec) {
    GpuActivity a;
    std::uint64_t raw_start = 1, raw_end = 1;  // CUPTI's own start/end, where a record has them
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const KernelRecord*>(rec);
        a.kind = GpuActivityKind::kKernel;
        a.name = k->name != nullptr ? k->name : "kernel";
        raw_start = k->start;
        raw_end = k->end;
        a.start_ns = to_steady(k->start);
        a.end_ns = to_steady(k->end);
        a.stream = k->streamId;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const MemcpyRecord*>(rec);
        a.kind = GpuActivityKind::kMemcpy;
        a.name = memcpy_name(m->copyKind);
        raw_start = m->start;
        raw_end = m->end;
        a.start_ns = to_steady(m->start);
        a.end_ns = to_steady(m->end);
        a.stream = m->streamId;
        a.bytes = m->bytes;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const MemsetRecord*>(rec);
        a.kind = GpuActivityKind::kMemset;
        a.name = "memset";
        raw_start = m->start;
        raw_end = m->end;
        a.start_ns = to_steady(m->start);
        a.end_ns = to_steady(m->end);
        a.stream = m->streamId;
        a.bytes = m->bytes;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMORY2: {
        const auto* m = reinterpret_cast<const MemoryRecord*>(rec);
        if (m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION) {
          a.kind = GpuActivityKind::kMalloc;
        } else if (m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE) {
          a.kind = GpuActivityKind::kFree;
        } else {
          return;
        }
        a.name = memory_kind_name(m->memoryKind);
        a.start_ns = a.end_ns = to_steady(m->timestamp);
        a.stream = m->streamId;
        a.bytes = m->bytes;
        a.address = m->address;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MARKER: {
        const auto* m = reinterpret_cast<const MarkerRecord*>(rec);
        const std::int64_t t = to_steady(m->timestamp);
        if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_START) {
          GpuActivity& o = open[m->id];
          o.kind = GpuActivityKind::kMarker;
          o.name = m->name != nullptr ? m->name : "";
          o.start_ns = o.end_ns = t;
          return;
        }
        if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_END) {
          auto it = open.find(m->id);
          if (it == open.end()) return;  // began before start()
          a = std::move(it->second);
          open.erase(it);
          a.end_ns = std::max(t, a.start_ns);
          break;
        }
        if (m->flags & CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS) {
          a.kind = GpuActivityKind::kMarker;
          a.name = m->name != nullptr ? m->name : "";
          a.start_ns = a.end_ns = t;
          break;
        }
        return;
      }
      default:
        return;
    }
    // cuptiActivityGetNextRecord's documentation: kernel records (and records of some other
    // kinds) may carry 0 timestamps when CUPTI had no device memory to time them. Converted,
    // those would land at an arbitrary steady_clock time; count them as lost instead.
    if ((a.kind == GpuActivityKind::kKernel || a.kind == GpuActivityKind::kMemcpy ||
         a.kind == GpuActivityKind::kMemset) &&
        (raw_start == 0 || raw_end == 0)) {
      ++cupti_dropped;
      return;
    }
    records.push_back(std::move(a));
  }
};

namespace {

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  Global& g = global();
  std::lock_guard lock(g.mu);
  std::uint8_t* b = nullptr;
  if (!g.free_buffers.empty()) {
    b = g.free_buffers.back();
    g.free_buffers.pop_back();
  } else if (g.buffers < kMaxBuffers) {
    b = static_cast<std::uint8_t*>(
        ::operator new (kBufferBytes, std::align_val_t{kBufferAlign}, std::nothrow));
    if (b != nullptr) ++g.buffers;
  }
  // No buffer: CUPTI drops the records that needed it and counts them too; we count the miss.
  if (b == nullptr && g.running != nullptr) ++g.running->buffers_missing;
  *buffer = b;
  *size = b != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext ctx, std::uint32_t stream_id, std::uint8_t* buffer,
                               std::size_t /*size*/, std::size_t valid_size) {
  Global& g = global();
  std::lock_guard lock(g.mu);
  CuptiTracer::Impl* t = g.running;
  // A C callback: nothing may escape. Records that cannot be stored count as dropped.
  try {
    if (t != nullptr && valid_size > 0) {
      CUpti_Activity* rec = nullptr;
      while (cuptiActivityGetNextRecord(buffer, valid_size, &rec) == CUPTI_SUCCESS) {
        try {
          t->add(rec);
        } catch (...) {
          ++t->cupti_dropped;
        }
      }
    }
    std::size_t dropped = 0;
    if (t != nullptr &&
        cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == CUPTI_SUCCESS) {
      t->cupti_dropped += dropped;
    }
  } catch (...) {
  }
  if (buffer == nullptr) return;
  try {
    g.free_buffers.push_back(buffer);
  } catch (...) {
    ::operator delete (buffer, std::align_val_t{kBufferAlign});
    --g.buffers;
  }
}

// NVTX binds its tool at the process's first NVTX call, from NVTX_INJECTION64_PATH: point it at
// the CUPTI library this process uses, unless the user (or Nsight) chose one.
void offer_cupti_to_nvtx() {
  if (std::getenv("NVTX_INJECTION64_PATH") != nullptr) return;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuptiActivityEnable), &info) != 0 &&
      info.dli_fname != nullptr) {
    setenv("NVTX_INJECTION64_PATH", info.dli_fname, 0);
  }
}

}  // namespace

CuptiTracer::CuptiTracer() : impl_(std::make_unique<Impl>()) {}

CuptiTracer::~CuptiTracer() {
  try {
    stop();
  } catch (...) {  // a destructor reports nothing; CUPTI is left disabled as far as it could be
  }
}

void CuptiTracer::start() {
  Global& g = global();
  {
    std::lock_guard lock(g.mu);
    if (g.running != nullptr) {
      throw InvalidArgument(std::string("CuptiTracer::start: ") +
                            (g.running == impl_.get() ? "this tracer is already running"
                                                      : "another CuptiTracer is running") +
                            "; CUPTI's activity callbacks are process-wide: stop() it first");
    }
  }
  offer_cupti_to_nvtx();
  if (!g.callbacks_registered) {
    check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
          "cuptiActivityRegisterCallbacks");
    g.callbacks_registered = true;
  }
  // CUPTI's clock against steady_clock: the midpoint of two steady readings around one CUPTI
  // reading (a few hundred ns apart, which bounds the offset's error).
  std::uint64_t cupti_now = 0;
  const std::int64_t before = steady_ns();
  check(cuptiGetTimestamp(&cupti_now), "cuptiGetTimestamp");
  const std::int64_t after = steady_ns();
  {
    std::lock_guard lock(g.mu);
    impl_->records.clear();
    impl_->open.clear();
    impl_->cupti_dropped = impl_->buffers_missing = 0;
    impl_->offset_ns = before + (after - before) / 2 - static_cast<std::int64_t>(cupti_now);
    g.running = impl_.get();
  }
  impl_->started = true;
  std::size_t enabled = 0;
  try {
    for (CUpti_ActivityKind k : kKinds) {
      check(cuptiActivityEnable(k), std::string("cuptiActivityEnable") + kind_call(k));
      ++enabled;
    }
  } catch (...) {
    for (std::size_t i = 0; i < enabled; ++i) cuptiActivityDisable(kKinds[i]);
    std::lock_guard lock(g.mu);
    g.running = nullptr;
    impl_->started = false;
    throw;
  }
}

void CuptiTracer::stop() {
  if (!impl_->started) return;
  impl_->started = false;
  Global& g = global();
  // Records of work still in flight arrive once it ends.
  const cudaError_t sync = cudaDeviceSynchronize();
  // Flush (the completion callback runs for every buffer, partial ones too), disable, and flush
  // again for whatever landed between the two. The tracer stops running even if one fails.
  CUptiResult first_error = CUPTI_SUCCESS;
  std::string failed_call;
  auto note = [&](CUptiResult r, std::string call) {
    if (r != CUPTI_SUCCESS && first_error == CUPTI_SUCCESS) {
      first_error = r;
      failed_call = std::move(call);
    }
  };
  note(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  for (CUpti_ActivityKind k : kKinds) {
    note(cuptiActivityDisable(k), std::string("cuptiActivityDisable") + kind_call(k));
  }
  note(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  {
    std::lock_guard lock(g.mu);
    g.running = nullptr;
  }
  check(first_error, failed_call);
  if (sync != cudaSuccess) {
    throw CudaError(std::string("CuptiTracer::stop: cudaDeviceSynchronize failed: ") +
                    cudaGetErrorName(sync) + ": " + cudaGetErrorString(sync) +
                    " (the records of work before the failure were flushed)");
  }
}

std::vector<GpuActivity> CuptiTracer::take() {
  Global& g = global();
  std::vector<GpuActivity> out;
  {
    std::lock_guard lock(g.mu);
    out.swap(impl_->records);
    if (!impl_->started) {  // stopped: markers never closed will not close now
      for (auto& [id, a] : impl_->open) out.push_back(std::move(a));
      impl_->open.clear();
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const GpuActivity& a, const GpuActivity& b) {
    return a.start_ns < b.start_ns;
  });
  return out;
}

std::uint64_t CuptiTracer::dropped() const {
  std::lock_guard lock(global().mu);
  return impl_->cupti_dropped + impl_->buffers_missing;
}

bool CuptiTracer::available(std::string* why) {
  std::string reason;
  if (CudaProvider::cuda_device_count(&reason) == 0) {
    if (why != nullptr) *why = "no CUDA device: " + reason;
    return false;
  }
  std::uint32_t version = 0;
  const CUptiResult r = cuptiGetVersion(&version);
  if (r != CUPTI_SUCCESS) {
    if (why != nullptr) *why = "CUPTI is not usable: cuptiGetVersion failed: " + result_text(r);
    return false;
  }
  if (why != nullptr) why->clear();
  return true;
}

}  // namespace memfit
