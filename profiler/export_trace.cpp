// trace.json in the Chrome trace event format (the "JSON Array/Object Format" that Perfetto and
// chrome://tracing import): ts and dur in microseconds, relative to the recording's start, which
// the first counters mark (ts 0). Ranges carry no args (viewers such as speedscope print them
// in every label); their nesting is their time span.
//   pid 1 "memfit host": one thread per thread that opened ranges ("X" per range), counters
//         ("C") for each category and for allocated/reserved, instant events for OOMs, and a
//         "pinned host" counter with one series per category (offload's host memory)
//   pid 2 "GPU (CUPTI)": one thread per CUDA stream, "X" per kernel/copy/memset/malloc/free/marker
#include <algorithm>
#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "profiler/report.h"

namespace memfit {

namespace {

constexpr int kHostPid = 1;
constexpr int kGpuPid = 2;

using json = nlohmann::json;

double us(std::int64_t t_ns, std::int64_t start_ns) {
  return static_cast<double>(t_ns - start_ns) / 1e3;
}

json metadata(const char* what, int pid, std::uint64_t tid, const std::string& name) {
  return {{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

json counter(const char* name, int pid, double ts, std::size_t bytes) {
  return {{"ph", "C"}, {"name", name}, {"pid", pid},
          {"tid", 0},  {"ts", ts},     {"args", {{"bytes", bytes}}}};
}

// Appends events one at a time, so memory stays the size of the text, not of a json tree of
// every event (a million-event recording would need several hundred MB as json objects).
class Emitter {
 public:
  explicit Emitter(std::string& out) : out_(out) {}
  void push_back(const json& e) {
    out_ += first_ ? "\n" : ",\n";
    first_ = false;
    out_ += e.dump(-1, ' ', false, json::error_handler_t::replace);
  }

 private:
  std::string& out_;
  bool first_ = true;
};

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string trace_json(const ProfileReport& r) {
  const Recording& rec = r.recording;
  std::string out = "{\"traceEvents\":[";
  out.reserve(256 + rec.events.size() * 100 + rec.ranges.size() * 150 + r.gpu.size() * 200);
  Emitter events(out);

  events.push_back(
      metadata("process_name", kHostPid, 0, "memfit " + r.model + " (" + r.backend + ")"));
  events.push_back({{"ph", "M"},
                    {"name", "process_sort_index"},
                    {"pid", kHostPid},
                    {"tid", 0},
                    {"args", {{"sort_index", 0}}}});
  std::set<std::uint64_t> threads;
  for (const RangeRecord& g : rec.ranges) threads.insert(g.thread);
  for (std::uint64_t t : threads) {
    events.push_back(metadata("thread_name", kHostPid, t, "thread " + std::to_string(t)));
  }
  events.push_back(metadata("thread_name", kHostPid, 0, "memory"));

  for (const RangeRecord& g : rec.ranges) {
    events.push_back(
        {{"ph", "X"},
         {"name", std::string(interned_name(g.name))},
         {"cat", range_kind_name(g.kind)},
         {"pid", kHostPid},
         {"tid", g.thread},
         {"ts", us(g.begin_ns, rec.start_ns)},
         {"dur", static_cast<double>(std::max<std::int64_t>(0, g.end_ns - g.begin_ns)) / 1e3}});
  }

  // Counters: the starting state, then a sample whenever a value changes. With every event kept
  // the starting state held from the recording's start, so it stands at time 0 and every
  // viewer's time range opens there (setup's allocations before the first range included);
  // when the ring dropped the oldest events it held only from the first kept one, and an
  // instant event marks time 0 instead.
  CategoryBytes running = rec.base_by_category;
  const double t0 = rec.dropped_events == 0 || rec.events.empty()
                        ? 0.0
                        : us(rec.events.front().time_ns, rec.start_ns);
  if (t0 > 0) {
    events.push_back({{"ph", "i"},
                      {"s", "g"},
                      {"name", "recording start (older events dropped)"},
                      {"pid", kHostPid},
                      {"tid", 0},
                      {"ts", 0.0}});
  }
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    events.push_back(counter(category_name(static_cast<Category>(c)), kHostPid, t0, running[c]));
  }
  events.push_back(counter("allocated", kHostPid, t0, rec.base_allocated));
  events.push_back(counter("reserved", kHostPid, t0, rec.base_reserved));
  std::size_t allocated = rec.base_allocated, reserved = rec.base_reserved;
  for (const TimelineEvent& e : rec.events) {
    const double ts = us(e.time_ns, rec.start_ns);
    std::size_t& cat = running[category_index(e.category)];
    const std::size_t before = cat;
    apply_event(running, e);
    if (cat != before) events.push_back(counter(category_name(e.category), kHostPid, ts, cat));
    if (e.allocated != allocated) {
      allocated = e.allocated;
      events.push_back(counter("allocated", kHostPid, ts, allocated));
    }
    if (e.reserved != reserved) {
      reserved = e.reserved;
      events.push_back(counter("reserved", kHostPid, ts, reserved));
    }
    if (e.kind == EventKind::kOom) {
      events.push_back({{"ph", "i"},
                        {"s", "p"},
                        {"name", "out of memory"},
                        {"cat", "oom"},
                        {"pid", kHostPid},
                        {"tid", 0},
                        {"ts", ts},
                        {"args",
                         {{"requested_bytes", e.size},
                          {"category", category_name(e.category)},
                          {"tag", std::string(interned_name(e.tag))},
                          {"phase", std::string(interned_name(e.phase))},
                          {"block", std::string(interned_name(e.block))}}}});
    }
  }

  // Offload's pinned host memory: one counter whose series are the categories that ever hold
  // bytes (the trace viewers stack them), each in every sample, 0 included (a series keeps its
  // last value until told otherwise), at the start and after each region's change.
  if (rec.has_host()) {
    std::array<bool, kCategoryCount> used{};
    auto mark = [&](const CategoryBytes& b) {
      for (std::size_t c = 0; c < kCategoryCount; ++c) used[c] = used[c] || b[c] > 0;
    };
    mark(rec.host_base);
    for (const HostRegionEvent& e : rec.host_events) mark(e.after);
    const auto host_counter = [&](double ts, const CategoryBytes& b) {
      json args = json::object();
      for (std::size_t c = 0; c < kCategoryCount; ++c) {
        if (used[c]) args[category_name(static_cast<Category>(c))] = b[c];
      }
      return json{{"ph", "C"}, {"name", "pinned host"},  {"pid", kHostPid}, {"tid", 0},
                  {"ts", ts},  {"args", std::move(args)}};
    };
    events.push_back(host_counter(0.0, rec.host_base));
    for (const HostRegionEvent& e : rec.host_events) {
      events.push_back(host_counter(std::max(0.0, us(e.time_ns, rec.start_ns)), e.after));
    }
  }

  if (!r.gpu.empty()) {
    events.push_back(metadata("process_name", kGpuPid, 0, "GPU (CUPTI)"));
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", kGpuPid},
                      {"tid", 0},
                      {"args", {{"sort_index", 1}}}});
    std::set<std::uint32_t> streams;
    for (const GpuActivity& a : r.gpu) streams.insert(a.stream);
    for (std::uint32_t s : streams) {
      events.push_back(metadata("thread_name", kGpuPid, s, "stream " + std::to_string(s)));
    }
    for (const GpuActivity& a : r.gpu) {
      json args = {{"kind", gpu_activity_kind_name(a.kind)}};
      if (a.bytes > 0) args["bytes"] = a.bytes;
      if (a.address != 0) args["address"] = hex(a.address);
      events.push_back(
          {{"ph", "X"},
           {"name", a.name.empty() ? std::string(gpu_activity_kind_name(a.kind)) : a.name},
           {"cat", gpu_activity_kind_name(a.kind)},
           {"pid", kGpuPid},
           {"tid", a.stream},
           {"ts", us(a.start_ns, rec.start_ns)},
           {"dur", static_cast<double>(std::max<std::int64_t>(0, a.end_ns - a.start_ns)) / 1e3},
           {"args", std::move(args)}});
    }
  }

  const json other = {{"model", r.model},
                      {"backend", r.backend},
                      {"steps", r.steps},
                      {"dropped_events", rec.dropped_events},
                      {"dropped_ranges", rec.dropped_ranges},
                      {"dropped_gpu_records", r.gpu_dropped}};
  out += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":";
  out += other.dump(-1, ' ', false, json::error_handler_t::replace);
  out += "}\n";
  return out;
}

}  // namespace memfit
