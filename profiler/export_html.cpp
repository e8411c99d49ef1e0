// report.html: one self-contained page (nothing external; inline SVG, CSS and one small script):
// the step peak (what a plan predicts) and the whole run's peak, each labelled; bytes by
// category over time (profiler/html_chart.h) in memory_viz's colours for the same recording,
// with step and phase bands, a hover readout (time, totals, bytes by category, phase, block)
// and drag-to-zoom; offload's pinned host bytes on the same time axis; then tables (the step
// peak by category and by block, plan vs measured, GPU activity, the allocator's statistics in
// human units with the raw bytes on hover).
// Every name that reaches the page passes through html::escape(), or through json_string()
// inside the script's data: block and tag names come from users' specs and must stay text.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "memory/size.h"
#include "profiler/html_assets.h"
#include "profiler/html_chart.h"
#include "profiler/report.h"

namespace memfit {

namespace {

using html::escape;

// Long timelines are reduced to the lowest and highest allocated sample of each of this many
// buckets (so the chart keeps both the peak and the troughs), bounding the page's size.
constexpr std::size_t kBuckets = 600;
constexpr double kWide = 960, kNarrow = 400;
constexpr double kPlotHeight = 300, kHostPlotHeight = 160;
constexpr std::size_t kTopKernels = 10;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string ms_label(std::int64_t t_ns, std::int64_t start_ns) {
  return fmt("%.1f ms", static_cast<double>(t_ns - start_ns) / 1e6);
}

std::string name_or(std::uint32_t id, const char* none) {
  const std::string_view n = interned_name(id);
  return n.empty() ? std::string(none) : std::string(n);
}

// A JSON string literal that is also safe inside <script>: '<' and '>' as \u escapes, so no
// name can close the element.
std::string json_string(std::string_view s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20 || c == '<' || c == '>' || c == '&') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

// ---- the device series --------------------------------------------------------------------

struct Points {
  html::Series s;
  std::vector<std::size_t> allocated;
  std::vector<std::uint32_t> phase, block;  // interned
};

// The state before the first kept event, then every event, or each bucket's minimum and maximum
// (in time order) when there are more than 2 * kBuckets.
Points device_points(const Recording& rec) {
  Points p;
  const auto push = [&](std::int64_t t, const CategoryBytes& b, std::size_t a, std::size_t r,
                        std::uint32_t phase, std::uint32_t block) {
    p.s.t_ns.push_back(t);
    p.s.bytes.push_back(b);
    p.s.reserved.push_back(r);
    p.allocated.push_back(a);
    p.phase.push_back(phase);
    p.block.push_back(block);
  };
  const std::int64_t t0 = rec.events.empty() ? rec.start_ns : rec.events.front().time_ns;
  push(std::min(rec.start_ns, t0), rec.base_by_category, rec.base_allocated, rec.base_reserved, 0,
       0);
  const std::size_t n = rec.events.size();
  const std::size_t per_bucket = n <= 2 * kBuckets ? 1 : (n + kBuckets - 1) / kBuckets;
  CategoryBytes running = rec.base_by_category;
  struct Kept {
    std::size_t i;
    CategoryBytes b;
  };
  Kept lo{0, {}}, hi{0, {}};
  const auto emit = [&](const Kept& k) {
    const TimelineEvent& e = rec.events[k.i];
    push(e.time_ns, k.b, e.allocated, e.reserved, e.phase, e.block);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const TimelineEvent& e = rec.events[i];
    apply_event(running, e);
    if (per_bucket == 1) {
      emit({i, running});
      continue;
    }
    const bool bucket_start = i % per_bucket == 0;
    if (bucket_start || e.allocated < rec.events[lo.i].allocated) lo = {i, running};
    if (bucket_start || e.allocated > rec.events[hi.i].allocated) hi = {i, running};
    if (i % per_bucket == per_bucket - 1 || i + 1 == n) {
      if (lo.i == hi.i) {
        emit(hi);
      } else {
        emit(lo.i < hi.i ? lo : hi);
        emit(lo.i < hi.i ? hi : lo);
      }
    }
  }
  return p;
}

// Host pinned memory: the host base, then each region's coming or going (few: no buckets).
html::Series host_series(const Recording& rec, std::int64_t t_begin) {
  html::Series s;
  s.t_ns.push_back(t_begin);
  s.bytes.push_back(rec.host_base);
  for (const HostRegionEvent& e : rec.host_events) {
    s.t_ns.push_back(std::max(t_begin, e.time_ns));
    s.bytes.push_back(e.after);
  }
  return s;
}

// ---- bands --------------------------------------------------------------------------------

const char* phase_fill(RangeKind k) {
  switch (k) {
    case RangeKind::kSetup:
      return "#c9c9c9";
    case RangeKind::kForward:
      return "#9ecae1";
    case RangeKind::kBackward:
      return "#fdae6b";
    case RangeKind::kRecompute:
      return "#a1d99b";
    case RangeKind::kOptimizer:
      return "#bcbddc";
    default:
      return "#e0e0e0";
  }
}

// Steps (alternating shades) and the main thread's phases (setup, forward, backward,
// recompute, optimizer), neighbours of one kind closer than `merge_ns` drawn as one band.
void make_bands(const Recording& rec, std::int64_t merge_ns, std::vector<html::Band>* steps,
                std::vector<html::Band>* phases) {
  std::uint64_t main_thread = 0;
  bool found = false;
  for (const RangeRecord& g : rec.ranges) {
    if (g.kind == RangeKind::kStep || g.kind == RangeKind::kSetup) {
      main_thread = g.thread;
      found = true;
      break;
    }
  }
  if (!found) return;
  std::size_t k = 0;
  RangeKind last = RangeKind::kOther;
  for (const RangeRecord& g : rec.ranges) {
    if (g.thread != main_thread) continue;
    if (g.kind == RangeKind::kStep) {
      // Numbered by the Recorder's count (the Trainer names every step "step"), else in the
      // order they were kept.
      ++k;
      const std::size_t n = g.ordinal > 0 ? g.ordinal : k;
      steps->push_back(
          {g.begin_ns, g.end_ns, "step " + std::to_string(n), n % 2 == 1 ? "#d0d0d0" : "#e8e8e8"});
      continue;
    }
    switch (g.kind) {
      case RangeKind::kSetup:
      case RangeKind::kForward:
      case RangeKind::kBackward:
      case RangeKind::kRecompute:
      case RangeKind::kOptimizer:
        break;
      default:
        continue;
    }
    if (!phases->empty() && last == g.kind && g.begin_ns - phases->back().end_ns <= merge_ns) {
      phases->back().end_ns = std::max(phases->back().end_ns, g.end_ns);
      continue;
    }
    phases->push_back({g.begin_ns, g.end_ns, range_kind_name(g.kind), phase_fill(g.kind)});
    last = g.kind;
  }
}

// ---- the hover readout's data ----------------------------------------------------------------

// {"t": ms since the recording's start, "a": allocated, "r": reserved, "c": category names,
//  "v": bytes per point per category of c, "p"/"b": indexes into "n", the names}.
std::string readout_data(const char* id, const Points& p, std::int64_t start_ns) {
  std::vector<std::size_t> used;
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    for (const CategoryBytes& b : p.s.bytes) {
      if (b[c] > 0) {
        used.push_back(c);
        break;
      }
    }
  }
  std::map<std::uint32_t, std::size_t> name_index;
  std::vector<std::uint32_t> names;
  const auto idx = [&](std::uint32_t id) {
    auto [it, added] = name_index.emplace(id, names.size());
    if (added) names.push_back(id);
    return it->second;
  };
  std::string t, a, r, v, ph, bl;
  for (std::size_t i = 0; i < p.s.t_ns.size(); ++i) {
    const char* sep = i == 0 ? "" : ",";
    t += sep + fmt("%.3f", static_cast<double>(p.s.t_ns[i] - start_ns) / 1e6);
    a += sep + std::to_string(p.allocated[i]);
    r += sep + std::to_string(p.s.reserved.empty() ? 0 : p.s.reserved[i]);
    v += std::string(sep) + "[";
    for (std::size_t k = 0; k < used.size(); ++k) {
      v += (k ? "," : "") + std::to_string(p.s.bytes[i][used[k]]);
    }
    v += "]";
    ph += sep + std::to_string(idx(p.phase.empty() ? 0 : p.phase[i]));
    bl += sep + std::to_string(idx(p.block.empty() ? 0 : p.block[i]));
  }
  std::string cats, ns;
  for (std::size_t k = 0; k < used.size(); ++k) {
    cats += (k ? "," : "") + json_string(category_name(static_cast<Category>(used[k])));
  }
  for (std::size_t k = 0; k < names.size(); ++k) {
    ns += (k ? "," : "") + json_string(interned_name(names[k]));
  }
  return "<script type=\"application/json\" data-memfit id=\"data-" + std::string(id) +
         "\">{\"t\":[" + t + "],\"a\":[" + a + "],\"r\":[" + r + "],\"c\":[" + cats + "],\"v\":[" +
         v + "],\"p\":[" + ph + "],\"b\":[" + bl + "],\"n\":[" + ns + "]}</script>\n";
}

std::string row(std::initializer_list<std::string> cells) {
  std::string s = "<tr>";
  for (const std::string& c : cells) s += "<td>" + c + "</td>";
  return s + "</tr>\n";
}

std::string head(std::initializer_list<const char*> cells) {
  std::string s = "<tr>";
  for (const char* c : cells) s += "<th>" + std::string(c) + "</th>";
  return s + "</tr>\n";
}

std::string percent(std::size_t part, std::size_t whole) {
  return whole == 0 ? std::string("-")
                    : fmt("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

std::string bytes_cell(std::int64_t v) {
  return "<span title=\"" + std::to_string(v) + " bytes\">" +
         escape(format_bytes(static_cast<std::size_t>(std::max<std::int64_t>(v, 0)))) + "</span>";
}

std::string gpu_section(const ProfileReport& r) {
  if (r.gpu.empty() && r.gpu_dropped == 0) return {};
  struct Total {
    std::size_t count = 0;
    std::int64_t ns = 0;
    std::uint64_t bytes = 0;
  };
  std::map<std::string, Total> by_kind, kernels;
  for (const GpuActivity& a : r.gpu) {
    const std::int64_t d = std::max<std::int64_t>(0, a.end_ns - a.start_ns);
    Total& k = by_kind[gpu_activity_kind_name(a.kind)];
    ++k.count, k.ns += d, k.bytes += a.bytes;
    if (a.kind == GpuActivityKind::kKernel) {
      Total& t = kernels[a.name];
      ++t.count, t.ns += d;
    }
  }
  std::string o = "<h2>GPU activity (CUPTI)</h2>\n<p>" + std::to_string(r.gpu.size()) +
                  " records, " + std::to_string(r.gpu_dropped) + " dropped.</p>\n<table>\n" +
                  head({"kind", "count", "time", "bytes"});
  for (const auto& [kind, t] : by_kind) {
    o += row({escape(kind), std::to_string(t.count),
              fmt("%.3f ms", static_cast<double>(t.ns) / 1e6), escape(format_bytes(t.bytes))});
  }
  o += "</table>\n";
  std::vector<std::pair<std::string, Total>> top(kernels.begin(), kernels.end());
  std::sort(top.begin(), top.end(),
            [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  if (top.size() > kTopKernels) top.resize(kTopKernels);
  if (!top.empty()) {
    o += "<h3>Kernels by total time</h3>\n<table>\n" + head({"kernel", "launches", "time"});
    for (const auto& [name, t] : top) {
      o += row({"<code>" + escape(name) + "</code>", std::to_string(t.count),
                fmt("%.3f ms", static_cast<double>(t.ns) / 1e6)});
    }
    o += "</table>\n";
  }
  return o;
}

// The allocator's statistics as PyTorch's memory_stats() names them, one row per statistic of
// the "all" pool with its current / peak / allocated / freed, bytes in binary units (the raw
// count on hover), then the counters and the bytes by category; the per-pool rows folded away.
std::string stats_section(const ProfileReport& r) {
  const std::map<std::string, std::int64_t> m = r.stats.as_map();
  const auto get = [&](const std::string& k) {
    const auto it = m.find(k);
    return it == m.end() ? std::int64_t{0} : it->second;
  };
  const auto cell = [&](const std::string& k, bool bytes) {
    return bytes ? bytes_cell(get(k)) : std::to_string(get(k));
  };
  static const char* const kStats[] = {
      "allocated_bytes",      "reserved_bytes", "active_bytes", "requested_bytes",
      "inactive_split_bytes", "allocation",     "segment",      "active",
      "inactive_split"};
  const auto table = [&](const char* pool) {
    std::string o = "<div class=\"scroll\"><table>\n" +
                    head({"statistic", "current", "peak", "allocated", "freed"});
    for (const char* s : kStats) {
      const bool bytes = std::string_view(s).ends_with("_bytes");
      const std::string p = std::string(s) + "." + pool + ".";
      o += row({std::string(s) + (bytes ? "" : " (count)"), cell(p + "current", bytes),
                cell(p + "peak", bytes), cell(p + "allocated", bytes), cell(p + "freed", bytes)});
    }
    return o + "</table></div>\n";
  };
  const std::string conf = r.config.to_string();
  std::string o = "<h2>Allocator statistics</h2>\n<p>Settings: " +
                  (conf.empty() ? std::string("the defaults (no MEMFIT_ALLOC_CONF)")
                                : "<code>" + escape(conf) + "</code>") +
                  ". Names as PyTorch's <code>torch.cuda.memory_stats()</code>; all pools:</p>\n" +
                  table("all");
  o += "<div class=\"scroll\"><table>\n" + head({"counter", "value"});
  for (const char* k : {"num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free"}) {
    o += row({k, std::to_string(get(k))});
  }
  o += "</table></div>\n<div class=\"scroll\"><table>\n" + head({"category", "current", "peak"});
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const std::string p =
        std::string("category_bytes.") + category_name(static_cast<Category>(c)) + ".";
    o += row({category_name(static_cast<Category>(c)), cell(p + "current", true),
              cell(p + "peak", true)});
  }
  o +=
      "</table></div>\n<details><summary>The small and large pools</summary>\n<p>small_pool</p>\n" +
      table("small_pool") + "<p>large_pool</p>\n" + table("large_pool") + "</details>\n";
  return o;
}

std::string peak_line(const char* what, const PeakInfo& p, std::size_t reserved,
                      std::int64_t start_ns) {
  return std::string(what) + ": allocated <b>" + escape(format_bytes(p.allocated)) +
         "</b>, reserved <b>" + escape(format_bytes(reserved)) + "</b>; allocated peaks at " +
         ms_label(p.time_ns, start_ns) + " in " + escape(name_or(p.phase, "no phase")) + ", " +
         escape(name_or(p.block, "outside any block"));
}

}  // namespace

std::string report_html(const ProfileReport& r) {
  const Recording& rec = r.recording;
  const PeakInfo& step = rec.steps_peak();
  const std::size_t step_reserved = rec.steps_peak_reserved();
  const bool run_differs = rec.peak.allocated > step.allocated || rec.peak_reserved > step_reserved;
  const std::array<const char*, kCategoryCount> colors = memory_viz_colors(rec);

  const std::string title = "memfit " + r.command + ": " + r.model;
  std::string o;
  o += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  o += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  o += "<title>" + escape(title) + "</title>\n";
  o += "<style>" + std::string(html::kReportStyle) +
       "</style>\n</head>\n<body>\n<div id=\"tip\"></div>\n";
  o += "<h1>" + escape(title) + "</h1>\n";
  o += "<p class=\"meta\">backend " + escape(r.backend) + ", " + std::to_string(r.steps) +
       " steps, " + fmt("%.1f", static_cast<double>(rec.end_ns - rec.start_ns) / 1e6) + " ms; " +
       std::to_string(rec.events.size()) + " allocator events kept, " +
       std::to_string(rec.dropped_events) + " dropped; " + std::to_string(rec.ranges.size()) +
       " ranges kept, " + std::to_string(rec.dropped_ranges) + " dropped</p>\n";

  o += "<p>" + peak_line(rec.has_steps() ? "Step peak (what a plan predicts)" : "Peak", step,
                         step_reserved, rec.start_ns);
  if (r.device_total_bytes > 0) {
    o += "; " + percent(step_reserved, r.device_total_bytes) + " of the device's " +
         escape(format_bytes(r.device_total_bytes));
  }
  o += ".</p>\n";
  if (rec.has_steps()) {
    o += "<p>" +
         (run_differs
              ? peak_line("Whole run, setup included", rec.peak, rec.peak_reserved, rec.start_ns) +
                    "."
              : std::string("Whole run, setup included: the same peaks.")) +
         "</p>\n";
  }
  o += "<p class=\"meta\">DeepSpeed's <code>see_memory_usage</code> line for this run: <code>" +
       escape(see_memory_usage_line(r.stats)) +
       "</code> (MA, Max_MA: allocated now and at its peak; CA, Max_CA: reserved now and at its "
       "peak; GB there means GiB, and DeepSpeed rounds Max_CA to a whole number).</p>\n";

  // ---- the device chart
  const Points pts = device_points(rec);
  const std::int64_t t_begin = pts.s.t_ns.front();
  const std::int64_t t_end = std::max(rec.end_ns, pts.s.t_ns.back());
  html::ChartSpec spec;
  spec.id = "timeline";
  spec.aria = "bytes by category over time";
  spec.plot_height = kPlotHeight;
  spec.t_begin = t_begin;
  spec.t_end = t_end;
  spec.start_ns = rec.start_ns;
  spec.colors = colors;
  spec.top_bytes_at_least = std::max(rec.peak_reserved, rec.peak.allocated);
  make_bands(rec, (t_end - t_begin) / 2000, &spec.steps, &spec.phases);
  spec.markers.push_back(
      {step.time_ns,
       (rec.has_steps() ? "step peak " : "peak ") + format_bytes(step.allocated) + " allocated",
       " at " + ms_label(step.time_ns, rec.start_ns) + " (" + name_or(step.phase, "no phase") +
           ", " + name_or(step.block, "outside any block") + ")",
       "#c00"});
  if (run_differs) {
    spec.markers.push_back({rec.peak.time_ns,
                            "whole-run peak " + format_bytes(rec.peak.allocated) + " allocated",
                            " at " + ms_label(rec.peak.time_ns, rec.start_ns) + " (" +
                                name_or(rec.peak.phase, "no phase") + ")",
                            "#7a4fa0"});
  }
  o += "<h2>Memory over time</h2>\n<p>Allocated bytes stacked by category (memory_viz's colours "
       "for this run's snapshot.pickle); dashed: reserved; under the time axis: steps and "
       "phases. Hover for the values at a moment; drag across the chart to zoom, double-click "
       "to zoom out.";
  if (rec.events.size() > 2 * kBuckets) {
    o += " " + std::to_string(rec.events.size()) +
         " events drawn as the lowest and highest point of each of " + std::to_string(kBuckets) +
         " intervals.";
  }
  o += "</p>\n";
  spec.width = kWide;
  o += html::svg_chart(spec, pts.s);
  spec.width = kNarrow;
  o += html::svg_chart(spec, pts.s);
  o += readout_data("timeline", pts, rec.start_ns);
  o += "<p>";
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    o += "<span class=\"swatch\" style=\"background:" + std::string(colors[c]) + "\"></span>" +
         escape(category_name(static_cast<Category>(c)));
  }
  o += "</p>\n";

  if (rec.has_host()) {
    o += "<h2>Pinned host memory over time</h2>\n<p>Offload's pinned host bytes stacked by "
         "category, on the same time axis; peak <b>" +
         escape(format_bytes(rec.host_peak)) + "</b>";
    if (r.plan.present && r.plan.predicted_host_pinned > 0) {
      o += " (predicted " + escape(format_bytes(r.plan.predicted_host_pinned)) + ")";
    }
    o += ".</p>\n";
    html::ChartSpec hs = spec;
    hs.id = "host_timeline";
    hs.aria = "pinned host bytes by category over time";
    hs.plot_height = kHostPlotHeight;
    hs.steps.clear();
    hs.phases.clear();
    hs.markers.clear();
    hs.top_bytes_at_least = rec.host_peak;
    Points hp;
    hp.s = host_series(rec, t_begin);
    for (const CategoryBytes& b : hp.s.bytes) hp.allocated.push_back(total_bytes(b));
    hs.width = kWide;
    o += html::svg_chart(hs, hp.s);
    hs.width = kNarrow;
    o += html::svg_chart(hs, hp.s);
    o += readout_data("host_timeline", hp, rec.start_ns);
    o += "<table>\n" + head({"category", "at the host peak"});
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      if (rec.host_at_peak[c] == 0) continue;
      o += row({escape(category_name(static_cast<Category>(c))),
                escape(format_bytes(rec.host_at_peak[c]))});
    }
    o += "</table>\n";
  }

  o += "<h2>At the " + std::string(rec.has_steps() ? "step peak" : "peak") + "</h2>\n<p>" +
       ms_label(step.time_ns, rec.start_ns) + "; phase " + escape(name_or(step.phase, "none")) +
       ", block " + escape(name_or(step.block, "(outside any block)")) +
       ".</p>\n<div class=\"scroll\"><table>\n" + head({"category", "bytes", "share"});
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    o += row({"<span class=\"swatch\" style=\"background:" + std::string(colors[c]) +
                  ";margin-left:0\"></span>" + escape(category_name(static_cast<Category>(c))),
              escape(format_bytes(step.by_category[c])),
              percent(step.by_category[c], step.allocated)});
  }
  o += "</table></div>\n<h2>Blocks at the " + std::string(rec.has_steps() ? "step peak" : "peak") +
       "</h2>\n<div class=\"scroll\"><table>\n" + head({"block", "live bytes", "share"});
  for (const BlockBytes& b : step.blocks) {
    o += row({escape(name_or(b.block, "(outside any block)")), escape(format_bytes(b.bytes)),
              percent(b.bytes, step.allocated)});
  }
  o += "</table></div>\n";

  o += "<h2>Plan vs measured</h2>\n";
  if (r.plan.present) {
    const auto ratio = [](std::size_t m, std::size_t p) {
      return p == 0 ? std::string("-")
                    : fmt("%.3f", static_cast<double>(m) / static_cast<double>(p));
    };
    o += "<p>" + escape(r.plan.description) +
         "; measured: the steps' peak on the device (setup excluded, as the plan's dry run of "
         "steps), the whole run's pinned host bytes (offload pins them at setup and holds them)."
         "</p>\n<table>\n" +
         head({"", "predicted", "measured", "measured / predicted"}) +
         row({"peak reserved", escape(format_bytes(r.plan.predicted_peak_reserved)),
              escape(format_bytes(step_reserved)),
              ratio(step_reserved, r.plan.predicted_peak_reserved)}) +
         row({"peak allocated", escape(format_bytes(r.plan.predicted_peak_allocated)),
              escape(format_bytes(step.allocated)),
              ratio(step.allocated, r.plan.predicted_peak_allocated)});
    if (r.plan.predicted_host_pinned > 0 || rec.has_host()) {
      o += row({"pinned host", escape(format_bytes(r.plan.predicted_host_pinned)),
                escape(format_bytes(rec.host_peak)),
                ratio(rec.host_peak, r.plan.predicted_host_pinned)});
    }
    o += "</table>\n";
  } else {
    o += "<p>No plan was given: a plan, or a budget to dry-run the policies against, gives one to "
         "compare.</p>\n";
  }

  o += gpu_section(r);
  o += stats_section(r);
  o += "<script data-memfit>" + std::string(html::kReportScript) + "</script>\n</body>\n</html>\n";
  return o;
}

}  // namespace memfit
