// ProfileReport: everything one profiled run measured, and the exporters that write it.
//
//   Recorder rec(alloc);
//   ... run steps ...
//   ProfileReport r = make_report(rec.recording(), alloc, "gpt-tiny", "cpu");
//   r.plan = {.present = true, .predicted_peak_reserved = ..., .description = "bf16 every:2"};
//   std::vector<ExportFormat> f = parse_formats("summary,csv,trace,pickle,html");
//   std::vector<std::string> written = export_report(r, "out/profile", f);
//
// Formats and files (one each, in `dir`):
//   summary  summary.json   (version 2) the steps' peak as the headline (peak_allocated_bytes,
//                           peak_reserved_bytes, "peak": bytes by category, phase, block, top
//                           blocks at the allocated peak's moment, and reserved_bytes, the
//                           reserved peak, which may come at another; what a plan predicts)
//                           and the whole run's, setup included ("run_peak"), pinned host bytes
//                           (peak and end, by category), plan vs measured (device bytes on the
//                           steps' peak; pinned host bytes the whole run's, which offload pins
//                           at setup and holds), dropped counts, allocator stats,
//                           and "see_memory_usage": one line in DeepSpeed's style
//                           ("MA 1.2 GB Max_MA 2.3 GB CA 2.5 GB Max_CA 3 GB")
//   csv      timeline.csv   one row per kept event (allocator events and pinned host regions'
//                           changes, in time order): time_ms, event, size_bytes, category,
//                           tensor, step, micro_batch, phase, block, then the totals after it in
//                           <category>_bytes, allocated_bytes, reserved_bytes,
//                           host_<category>_bytes, host_pinned_bytes (export_csv.cpp)
//   trace    trace.json     Chrome trace event format (Perfetto, chrome://tracing, speedscope):
//                           metadata (process/thread names), "X" events for ranges (no args),
//                           "C" counters for each category and for allocated/reserved from time
//                           0, a "pinned host" counter by category, GPU activities
//   pickle   snapshot.pickle  PyTorch memory_viz snapshot, pickle protocol 2 (export_pickle.cpp);
//                           device memory only (memory_viz has no place for host memory);
//                           time_us in Unix-epoch microseconds
//   html     report.html    self-contained page (export_html.cpp): both peaks labelled, an SVG
//                           timeline by category in memory_viz's colours with step and phase
//                           bands, hover readout and zoom, pinned host bytes on the same time
//                           axis, per-block table, plan vs measured, allocator stats
// Pinned host memory is offload's (profiler/host_region.h), as the Recording has it.
// Every file is written and synced to a fresh temporary in `dir` before any is renamed into
// place (AtomicFileSet, profiler/atomic_file.h), so a failure leaves the earlier report exactly
// as it was and no partial file under a report's name.
//
// Errors (InvalidArgument, before anything is written): unknown format names (the message
// lists the valid ones), an empty list, `dir` not creatable or not writable (names the path
// and the OS's reason). A write failure during export throws IoError naming the file; files
// already renamed into place stay (each is complete).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memory/alloc_conf.h"
#include "memory/allocator_stats.h"
#include "memory/caching_allocator.h"
#include "memory/snapshot.h"
#include "profiler/recorder.h"

namespace memfit {

// A kernel, copy or device allocation seen by CUPTI (profiler/cuda/cupti_tracer.h); CUDA
// builds fill these, CPU runs leave them empty. Times are on the Recorder's clock
// (steady_clock ns; the tracer converts CUPTI timestamps).
enum class GpuActivityKind : std::uint8_t { kKernel, kMemcpy, kMemset, kMalloc, kFree, kMarker };
const char* gpu_activity_kind_name(GpuActivityKind k);  // "kernel", "memcpy", ...

struct GpuActivity {
  GpuActivityKind kind = GpuActivityKind::kKernel;
  std::string name;  // kernel name, "HtoD"/"DtoH"/"DtoD", marker text
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;    // == start_ns for instantaneous records (malloc/free)
  std::uint32_t stream = 0;   // CUPTI stream id
  std::uint64_t bytes = 0;    // memcpy/memset/malloc/free
  std::uint64_t address = 0;  // malloc/free
};

struct PlanFigures {
  bool present = false;
  std::size_t predicted_peak_reserved = 0;
  std::size_t predicted_peak_allocated = 0;
  std::size_t predicted_host_pinned = 0;  // offload's pinned host bytes (0: none)
  std::string description;                // "bf16, checkpoint every:2, micro-batch 4 x 4, offload"
};

struct ProfileReport {
  std::string command = "profile";  // what made it: "profile", "train" (report.html's title)
  std::string model;                // "gpt-tiny"
  std::string backend;              // "cpu", "cuda"
  std::int64_t steps = 0;
  std::size_t device_total_bytes = 0;  // 0: unknown (CPU)
  AllocatorStats stats;                // at the end
  AllocatorConfig config;
  Snapshot snapshot;  // at the end
  Recording recording;
  PlanFigures plan;
  std::vector<GpuActivity> gpu;
  std::uint64_t gpu_dropped = 0;  // CUPTI records lost
};

ProfileReport make_report(Recording recording, const CachingAllocator& alloc, std::string model,
                          std::string backend);

enum class ExportFormat : std::uint8_t { kSummary, kCsv, kTrace, kPickle, kHtml };
const char* export_format_name(ExportFormat f);  // "summary", "csv", "trace", "pickle", "html"
const char* export_file_name(ExportFormat f);    // "summary.json", "timeline.csv", ...
// "summary,csv" -> {kSummary, kCsv}; "all" -> every format. Duplicates collapse.
std::vector<ExportFormat> parse_formats(std::string_view list);

// Writes the formats into dir (created if missing); returns the paths written, in order.
std::vector<std::string> export_report(const ProfileReport& report, const std::string& dir,
                                       const std::vector<ExportFormat>& formats);

// One exporter each (export_summary.cpp, export_csv.cpp, export_trace.cpp, export_pickle.cpp,
// export_html.cpp); each returns the file's whole text (tests parse it) and export_report
// writes it atomically.
std::string summary_json(const ProfileReport& r);
std::string timeline_csv(const ProfileReport& r);
std::string trace_json(const ProfileReport& r);
std::string snapshot_pickle(const ProfileReport& r);  // bytes
std::string report_html(const ProfileReport& r);

// What snapshot.pickle's device trace says each event's category is: "unknown" for segment
// events (a segment has none), the event's own otherwise.
bool is_segment_event(EventKind k);
// The colour memory_viz gives each category in snapshot.pickle, for report.html to use the same:
// MemoryViz.js colours an allocation by its category's index in the order categories first
// appear in the device trace, in d3's schemeTableau10 (10 colours, repeating), the trace's
// final "snapshot" entry's "unknown" included. Categories the trace never names follow in
// enum order. Indexed by category_index.
std::array<const char*, kCategoryCount> memory_viz_colors(const Recording& rec);

// DeepSpeed's see_memory_usage line: "MA <alloc> Max_MA <peak alloc> CA <reserved> Max_CA
// <peak reserved>", as deepspeed.runtime.utils prints it: "GB" there means 1024^3 bytes, the
// first three rounded to two decimals and Max_CA to a whole number (DeepSpeed's own rounding).
std::string see_memory_usage_line(const AllocatorStats& s);

}  // namespace memfit
