#include "profiler/scoped_range.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>

#if MEMFIT_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace memfit {

namespace {

// ---- interning ------------------------------------------------------------------------------
// The strings live in a deque, which never moves an element it already holds, so the
// string_views handed out (and the map's keys, which view the same strings) stay valid for the
// life of the process. Leaked on purpose: ranges may close during static destruction.
struct NameTable {
  std::mutex mu;
  std::deque<std::string> names{std::string()};  // id 0 is ""
  std::unordered_map<std::string_view, std::uint32_t> ids;
};

NameTable& names() {
  static NameTable* table = new NameTable();
  return *table;
}

// The ids of the kinds' own names, interned once: a range opened without a name costs no
// lookup.
const std::uint32_t* kind_name_ids() {
  static const auto* ids = [] {
    auto* a = new std::uint32_t[kRangeKindCount];
    for (int k = 0; k < kRangeKindCount; ++k) {
      a[k] = intern_name(range_kind_name(static_cast<RangeKind>(k)));
    }
    return a;
  }();
  return ids;
}

// ---- per-thread state -----------------------------------------------------------------------
std::atomic<std::uint64_t> g_next_thread{1};

struct ThreadState {
  std::vector<RangeFrame> stack;
  std::uint64_t number = 0;  // assigned when the thread first opens a range
  bool notifying = false;    // a listener is running on this thread: its own ranges go unheard
};

ThreadState& this_thread_state() {
  thread_local ThreadState state;
  return state;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- listeners ------------------------------------------------------------------------------
// Calls hold the shared side of `mu`, registration the exclusive side, so remove_range_listener
// returns only once no thread is still inside the removed listener (the Recorder frees its
// state right after). The count lets a range skip the lock entirely when nobody listens.
struct ListenerTable {
  std::shared_mutex mu;
  std::vector<std::pair<std::uint64_t, RangeListener>> listeners;
  std::uint64_t next_id = 1;
  std::atomic<int> count{0};
};

ListenerTable& listener_table() {
  static ListenerTable* table = new ListenerTable();
  return *table;
}

void notify(ThreadState& ts, const RangeEvent& e) {
  ListenerTable& t = listener_table();
  if (t.count.load(std::memory_order_acquire) == 0 || ts.notifying) return;
  ts.notifying = true;
  {
    std::shared_lock lock(t.mu);
    for (auto& [id, listener] : t.listeners) {
      // Listeners must not throw; one that does anyway loses only its own event (a range's
      // destructor cannot let it out).
      try {
        listener(e);
      } catch (...) {
      }
    }
  }
  ts.notifying = false;
}

// ---- NVTX -----------------------------------------------------------------------------------
#if MEMFIT_HAVE_CUDA
nvtxDomainHandle_t nvtx_domain() {
  static const nvtxDomainHandle_t domain = [] {
    nvtxDomainHandle_t d = nvtxDomainCreateA("memfit");
    // Category ids are the kind + 1 (0 means "no category" to NVTX); naming them lets Nsight
    // Systems filter by "forward", "block", ...
    for (int k = 0; k < kRangeKindCount; ++k) {
      nvtxDomainNameCategoryA(d, static_cast<std::uint32_t>(k + 1),
                              range_kind_name(static_cast<RangeKind>(k)));
    }
    return d;
  }();
  return domain;
}

void nvtx_push(RangeKind kind, std::uint32_t name) {
  nvtxEventAttributes_t attr{};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.category = static_cast<std::uint32_t>(kind) + 1;
  attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
  // Interned names are std::strings that never move: data() is NUL-terminated and stable.
  attr.message.ascii = interned_name(name).data();
  nvtxDomainRangePushEx(nvtx_domain(), &attr);
}

void nvtx_pop() { nvtxDomainRangePop(nvtx_domain()); }
#endif

void push_range(RangeKind kind, std::uint32_t name) {
  ThreadState& ts = this_thread_state();
  if (ts.number == 0) ts.number = g_next_thread.fetch_add(1, std::memory_order_relaxed);
  const std::int64_t t = now_ns();
  ts.stack.push_back(RangeFrame{kind, name, t});
#if MEMFIT_HAVE_CUDA
  nvtx_push(kind, name);
#endif
  notify(ts, RangeEvent{true, kind, name, t, ts.number, static_cast<int>(ts.stack.size()) - 1});
}

}  // namespace

const char* range_kind_name(RangeKind k) {
  switch (k) {
    case RangeKind::kStep:
      return "step";
    case RangeKind::kMicroBatch:
      return "micro_batch";
    case RangeKind::kForward:
      return "forward";
    case RangeKind::kBackward:
      return "backward";
    case RangeKind::kRecompute:
      return "recompute";
    case RangeKind::kOptimizer:
      return "optimizer";
    case RangeKind::kOffload:
      return "offload";
    case RangeKind::kSetup:
      return "setup";
    case RangeKind::kBlock:
      return "block";
    case RangeKind::kOther:
      return "other";
  }
  return "other";
}

std::uint32_t intern_name(std::string_view name) {
  if (name.empty()) return 0;
  NameTable& t = names();
  std::lock_guard lock(t.mu);
  auto it = t.ids.find(name);
  if (it != t.ids.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(t.names.size());
  const std::string& stored = t.names.emplace_back(name);
  t.ids.emplace(std::string_view(stored), id);
  return id;
}

std::string_view interned_name(std::uint32_t id) {
  if (id == 0) return {};
  NameTable& t = names();
  std::lock_guard lock(t.mu);  // the deque's index may grow under another thread's intern
  if (id >= t.names.size()) return {};
  return t.names[id];
}

const std::vector<RangeFrame>& current_ranges() { return this_thread_state().stack; }

PhaseContext current_phase() {
  PhaseContext ctx;
  const std::vector<RangeFrame>& stack = this_thread_state().stack;
  bool have_phase = false, have_block = false;
  for (auto it = stack.rbegin(); it != stack.rend() && !(have_phase && have_block); ++it) {
    if (it->kind == RangeKind::kBlock) {
      if (!have_block) {
        ctx.block = it->name;
        have_block = true;
      }
    } else if (is_phase(it->kind) && !have_phase) {
      ctx.phase = it->name;
      ctx.phase_kind = it->kind;
      have_phase = true;
    }
  }
  return ctx;
}

std::uint64_t add_range_listener(RangeListener listener) {
  ListenerTable& t = listener_table();
  std::unique_lock lock(t.mu);
  const std::uint64_t id = t.next_id++;
  t.listeners.emplace_back(id, std::move(listener));
  t.count.store(static_cast<int>(t.listeners.size()), std::memory_order_release);
  return id;
}

void remove_range_listener(std::uint64_t id) {
  ListenerTable& t = listener_table();
  std::unique_lock lock(t.mu);
  auto it = std::find_if(t.listeners.begin(), t.listeners.end(),
                         [id](const auto& p) { return p.first == id; });
  if (it != t.listeners.end()) t.listeners.erase(it);
  t.count.store(static_cast<int>(t.listeners.size()), std::memory_order_release);
}

ScopedRange::ScopedRange(RangeKind kind, std::string_view name)
    : ScopedRange(kind,
                  name.empty() ? kind_name_ids()[static_cast<int>(kind)] : intern_name(name)) {}

ScopedRange::ScopedRange(RangeKind kind, std::uint32_t interned) {
  push_range(kind, interned != 0 ? interned : kind_name_ids()[static_cast<int>(kind)]);
}

ScopedRange::~ScopedRange() {
  ThreadState& ts = this_thread_state();
  // Scoped, non-movable objects close in reverse order of opening on their own thread, so the
  // top of this thread's stack is this range.
  if (ts.stack.empty()) return;
  const RangeFrame top = ts.stack.back();
  const int depth = static_cast<int>(ts.stack.size()) - 1;
  const std::int64_t t = now_ns();
#if MEMFIT_HAVE_CUDA
  nvtx_pop();
#endif
  notify(ts, RangeEvent{false, top.kind, top.name, t, ts.number, depth});
  ts.stack.pop_back();
}

}  // namespace memfit
