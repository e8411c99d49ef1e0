#include "profiler/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "memory/error.h"
#include "profiler/atomic_file.h"

namespace memfit {

namespace {

constexpr ExportFormat kAllFormats[] = {ExportFormat::kSummary, ExportFormat::kCsv,
                                        ExportFormat::kTrace, ExportFormat::kPickle,
                                        ExportFormat::kHtml};

std::string valid_format_names() {
  std::string s;
  for (ExportFormat f : kAllFormats) {
    s += export_format_name(f);
    s += ", ";
  }
  return s + "all";
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Python's str(round(x, 2)): the shortest decimal that round-trips, at most two decimals, and
// always one ("1.0", "1.5", "1.25").
std::string python_round2(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  std::string s = buf;
  while (s.size() > 1 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
  return s;
}

}  // namespace

const char* gpu_activity_kind_name(GpuActivityKind k) {
  switch (k) {
    case GpuActivityKind::kKernel:
      return "kernel";
    case GpuActivityKind::kMemcpy:
      return "memcpy";
    case GpuActivityKind::kMemset:
      return "memset";
    case GpuActivityKind::kMalloc:
      return "malloc";
    case GpuActivityKind::kFree:
      return "free";
    case GpuActivityKind::kMarker:
      return "marker";
  }
  return "unknown";
}

const char* export_format_name(ExportFormat f) {
  switch (f) {
    case ExportFormat::kSummary:
      return "summary";
    case ExportFormat::kCsv:
      return "csv";
    case ExportFormat::kTrace:
      return "trace";
    case ExportFormat::kPickle:
      return "pickle";
    case ExportFormat::kHtml:
      return "html";
  }
  return "unknown";
}

const char* export_file_name(ExportFormat f) {
  switch (f) {
    case ExportFormat::kSummary:
      return "summary.json";
    case ExportFormat::kCsv:
      return "timeline.csv";
    case ExportFormat::kTrace:
      return "trace.json";
    case ExportFormat::kPickle:
      return "snapshot.pickle";
    case ExportFormat::kHtml:
      return "report.html";
  }
  return "unknown";
}

std::vector<ExportFormat> parse_formats(std::string_view list) {
  std::vector<ExportFormat> out;
  auto add = [&out](ExportFormat f) {
    if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
  };
  std::string_view rest = list;
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    if (item.empty()) {
      throw InvalidArgument("formats '" + std::string(list) +
                            "': an empty name; give a comma-separated list of " +
                            valid_format_names());
    }
    if (item == "all") {
      for (ExportFormat f : kAllFormats) add(f);
    } else {
      bool found = false;
      for (ExportFormat f : kAllFormats) {
        if (item == export_format_name(f)) {
          add(f);
          found = true;
        }
      }
      if (!found) {
        throw InvalidArgument("unknown format '" + std::string(item) + "' in '" +
                              std::string(list) + "': valid are " + valid_format_names());
      }
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

ProfileReport make_report(Recording recording, const CachingAllocator& alloc, std::string model,
                          std::string backend) {
  ProfileReport r;
  r.model = std::move(model);
  r.backend = std::move(backend);
  r.stats = alloc.stats();
  r.config = alloc.config();
  r.snapshot = alloc.snapshot();
  r.recording = std::move(recording);
  return r;
}

std::vector<std::string> export_report(const ProfileReport& report, const std::string& dir,
                                       const std::vector<ExportFormat>& formats) {
  if (formats.empty()) {
    throw InvalidArgument("no report formats given: valid are " + valid_format_names());
  }
  for (ExportFormat f : formats) {
    if (std::find(std::begin(kAllFormats), std::end(kAllFormats), f) == std::end(kAllFormats)) {
      throw InvalidArgument("export format " + std::to_string(static_cast<int>(f)) +
                            " is not one of " + valid_format_names());
    }
  }
  ensure_writable_dir(dir);
  // Every file is written and synced before any replaces its old version: a failure on the
  // last (a full disk) leaves the whole earlier report as it was (profiler/atomic_file.h).
  AtomicFileSet files;
  std::vector<std::string> written;
  for (ExportFormat f : formats) {
    std::string text;
    switch (f) {
      case ExportFormat::kSummary:
        text = summary_json(report);
        break;
      case ExportFormat::kCsv:
        text = timeline_csv(report);
        break;
      case ExportFormat::kTrace:
        text = trace_json(report);
        break;
      case ExportFormat::kPickle:
        text = snapshot_pickle(report);
        break;
      case ExportFormat::kHtml:
        text = report_html(report);
        break;
    }
    const std::string path = dir + "/" + export_file_name(f);
    files.stage(path, text);
    written.push_back(path);
  }
  files.commit();
  return written;
}

bool is_segment_event(EventKind k) {
  return k == EventKind::kSegmentAlloc || k == EventKind::kSegmentFree ||
         k == EventKind::kSegmentMap || k == EventKind::kSegmentUnmap;
}

std::array<const char*, kCategoryCount> memory_viz_colors(const Recording& rec) {
  // d3's schemeTableau10, which MemoryViz.js (torch/utils/viz/MemoryViz.js) inlines.
  static const char* const kTableau10[] = {"#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f",
                                           "#edc949", "#af7aa1", "#ff9da7", "#9c755f", "#bab0ab"};
  std::array<int, kCategoryCount> order;
  order.fill(-1);
  int next = 0;
  const auto see = [&](Category c) {
    int& o = order[category_index(c)];
    if (o < 0) o = next++;
  };
  for (const TimelineEvent& e : rec.events) {
    see(is_segment_event(e.kind) ? Category::kUnknown : e.category);
  }
  see(Category::kUnknown);  // the trace's closing "snapshot" entry
  for (std::size_t c = 0; c < kCategoryCount; ++c) see(static_cast<Category>(c));
  std::array<const char*, kCategoryCount> colors{};
  for (std::size_t c = 0; c < kCategoryCount; ++c) colors[c] = kTableau10[order[c] % 10];
  return colors;
}

std::string see_memory_usage_line(const AllocatorStats& s) {
  // deepspeed/runtime/utils.py see_memory_usage divides by 1024**3 and labels it "GB"; it
  // rounds MA, Max_MA and CA to two decimals and Max_CA to a whole number (round(x), which
  // rounds half to even, as nearbyint does in the default rounding mode).
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const auto gb = [](std::int64_t v) {
    return static_cast<double>(std::max<std::int64_t>(v, 0)) / kGiB;
  };
  const double max_ca = std::nearbyint(gb(s.reserved_bytes[kStatAll].peak));
  char max_ca_buf[32];
  std::snprintf(max_ca_buf, sizeof max_ca_buf, "%.0f", max_ca);
  return "MA " + python_round2(gb(s.allocated_bytes[kStatAll].current)) + " GB Max_MA " +
         python_round2(gb(s.allocated_bytes[kStatAll].peak)) + " GB CA " +
         python_round2(gb(s.reserved_bytes[kStatAll].current)) + " GB Max_CA " + max_ca_buf + " GB";
}

}  // namespace memfit
