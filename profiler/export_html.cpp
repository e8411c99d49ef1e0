// report.html: one self-contained page (no scripts, no external resources): an inline SVG
// stacked-area chart of bytes by category over time with the peak marked, offload's pinned host
// bytes by category on the same time axis (when there are any), then tables (the
// peak by category and by block, plan vs measured, GPU activity, the allocator's stats).
// Every name that reaches the page passes through escape(): block and tag names come from
// users' specs and must stay text.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "memory/size.h"
#include "profiler/report.h"

namespace memfit {

namespace {

// Long timelines are reduced to the lowest and highest allocated sample of each of this many
// buckets (so the chart keeps both the peak and the troughs), bounding the page's size.
constexpr std::size_t kBuckets = 600;
constexpr double kWidth = 960, kHeight = 360, kHostHeight = 220;
constexpr double kLeft = 90, kRight = 20, kTop = 20, kBottom = 40;
constexpr std::size_t kTopKernels = 10;

const char* const kColors[kCategoryCount] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                             "#59a14f", "#edc948", "#b07aa1", "#9c755f"};

std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string block_label(std::uint32_t id) {
  const std::string_view n = interned_name(id);
  return n.empty() ? std::string("(outside any block)") : escape(n);
}

std::string phase_label(std::uint32_t id) {
  const std::string_view n = interned_name(id);
  return n.empty() ? std::string("(no phase)") : escape(n);
}

struct Sample {
  std::int64_t t_ns;
  CategoryBytes bytes;
  std::size_t allocated;
  std::size_t reserved;
};

// The timeline as chart points: the state before the first kept event, then every event, or
// each bucket's minimum and maximum (in time order) when there are more than 2 * kBuckets.
std::vector<Sample> samples(const Recording& rec) {
  std::vector<Sample> out;
  const std::int64_t t0 = rec.events.empty() ? rec.start_ns : rec.events.front().time_ns;
  out.push_back(
      {std::min(rec.start_ns, t0), rec.base_by_category, rec.base_allocated, rec.base_reserved});
  const std::size_t n = rec.events.size();
  const std::size_t per_bucket = n <= 2 * kBuckets ? 1 : (n + kBuckets - 1) / kBuckets;
  CategoryBytes running = rec.base_by_category;
  Sample lo{}, hi{};
  std::size_t lo_i = 0, hi_i = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const TimelineEvent& e = rec.events[i];
    std::size_t& cat = running[category_index(e.category)];
    if (e.kind == EventKind::kAlloc) cat += e.size;
    if (e.kind == EventKind::kFreeRequested) cat = cat >= e.size ? cat - e.size : 0;
    const Sample s{e.time_ns, running, e.allocated, e.reserved};
    if (per_bucket == 1) {
      out.push_back(s);
      continue;
    }
    const bool bucket_start = i % per_bucket == 0;
    if (bucket_start || s.allocated < lo.allocated) {
      lo = s;
      lo_i = i;
    }
    if (bucket_start || s.allocated > hi.allocated) {
      hi = s;
      hi_i = i;
    }
    if (i % per_bucket == per_bucket - 1 || i + 1 == n) {
      if (lo_i == hi_i) {
        out.push_back(hi);
      } else if (lo_i < hi_i) {
        out.push_back(lo);
        out.push_back(hi);
      } else {
        out.push_back(hi);
        out.push_back(lo);
      }
    }
  }
  return out;
}

// Host pinned memory (profiler/host_region.h) as chart points: the host base, then each
// region's coming or going. Regions are few: no bucketing.
std::vector<Sample> host_samples(const Recording& rec, std::int64_t t_begin) {
  std::vector<Sample> out;
  out.push_back({t_begin, rec.host_base, total_bytes(rec.host_base), 0});
  for (const HostRegionEvent& e : rec.host_events) {
    out.push_back({std::max(t_begin, e.time_ns), e.after, total_bytes(e.after), 0});
  }
  return out;
}

class Chart {
 public:
  Chart(std::int64_t t_begin, std::int64_t t_end, std::size_t y_max, double height)
      : t_begin_(t_begin),
        t_span_(std::max<std::int64_t>(1, t_end - t_begin)),
        y_max_(static_cast<double>(std::max<std::size_t>(1, y_max))),
        height_(height) {}
  double x(std::int64_t t) const {
    return kLeft + (kWidth - kLeft - kRight) * static_cast<double>(t - t_begin_) /
                       static_cast<double>(t_span_);
  }
  double y(std::size_t v) const {
    return kTop + (height_ - kTop - kBottom) * (1.0 - static_cast<double>(v) / y_max_);
  }
  double y_max() const { return y_max_; }
  double height() const { return height_; }

 private:
  std::int64_t t_begin_, t_span_;
  double y_max_, height_;
};

std::string point(double x, double y) { return fmt("%.1f", x) + "," + fmt("%.1f", y) + " "; }

// The <svg> opening tag, the grid, the byte ticks and the time ticks (ms since the start).
std::string svg_frame(const Chart& c, const char* id, const char* label, std::int64_t t_begin,
                      std::int64_t t_end, std::int64_t start_ns) {
  std::string o;
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"" + std::string(id) + "\" width=\"" +
       fmt("%.0f", kWidth) + "\" height=\"" + fmt("%.0f", c.height()) + "\" viewBox=\"0 0 " +
       fmt("%.0f", kWidth) + " " + fmt("%.0f", c.height()) + "\" role=\"img\" aria-label=\"" +
       label + "\">\n";
  for (int i = 0; i <= 4; ++i) {
    const auto v = static_cast<std::size_t>(c.y_max() * i / 4);
    const double yy = c.y(v);
    o += "<line class=\"grid\" x1=\"" + fmt("%.1f", kLeft) + "\" y1=\"" + fmt("%.1f", yy) +
         "\" x2=\"" + fmt("%.1f", kWidth - kRight) + "\" y2=\"" + fmt("%.1f", yy) + "\"/>\n";
    o += "<text class=\"tick\" x=\"" + fmt("%.1f", kLeft - 6) + "\" y=\"" + fmt("%.1f", yy + 4) +
         "\" text-anchor=\"end\">" + escape(format_bytes(v)) + "</text>\n";
    const std::int64_t t = t_begin + (t_end - t_begin) * i / 4;
    o += "<text class=\"tick\" x=\"" + fmt("%.1f", c.x(t)) + "\" y=\"" +
         fmt("%.1f", c.height() - kBottom + 16) + "\" text-anchor=\"middle\">" +
         fmt("%.1f", static_cast<double>(t - start_ns) / 1e6) + " ms</text>\n";
  }
  return o;
}

// One polygon per category, stacked in category order, as steps (a state holds until the
// next sample).
std::string stacked_areas(const std::vector<Sample>& pts, const Chart& c, std::int64_t t_end) {
  std::string o;
  std::vector<std::size_t> below(pts.size(), 0);
  for (std::size_t cat = 0; cat < kCategoryCount; ++cat) {
    bool any = false;
    for (const Sample& s : pts) any = any || s.bytes[cat] > 0;
    if (!any) continue;
    std::string top, bottom;
    for (std::size_t i = 0; i < pts.size(); ++i) {
      const double x0 = c.x(pts[i].t_ns);
      const double x1 = c.x(i + 1 < pts.size() ? pts[i + 1].t_ns : t_end);
      const double yt = c.y(below[i] + pts[i].bytes[cat]);
      top += point(x0, yt) + point(x1, yt);
    }
    for (std::size_t i = pts.size(); i-- > 0;) {
      const double x0 = c.x(pts[i].t_ns);
      const double x1 = c.x(i + 1 < pts.size() ? pts[i + 1].t_ns : t_end);
      const double yb = c.y(below[i]);
      bottom += point(x1, yb) + point(x0, yb);
    }
    for (std::size_t i = 0; i < pts.size(); ++i) below[i] += pts[i].bytes[cat];
    const char* name = category_name(static_cast<Category>(cat));
    o += "<polygon class=\"area\" fill=\"" + std::string(kColors[cat]) + "\" points=\"" + top +
         bottom + "\"><title>" + escape(name) + "</title></polygon>\n";
  }
  return o;
}

// The device chart's time span, which the host chart shares so the two line up.
struct Span {
  std::int64_t begin, end;
};
Span time_span(const Recording& rec, const std::vector<Sample>& pts) {
  return {pts.front().t_ns, std::max(rec.end_ns, pts.back().t_ns)};
}

// `pts`: samples(rec), which report_html computes once for both charts.
std::string svg_chart(const ProfileReport& r, const std::vector<Sample>& pts) {
  const Recording& rec = r.recording;
  const auto [t_begin, t_end] = time_span(rec, pts);
  std::size_t y_max = std::max(rec.peak_reserved, rec.peak.allocated);
  for (const Sample& s : pts) y_max = std::max({y_max, s.reserved, s.allocated});
  const Chart c(t_begin, t_end, y_max + y_max / 20, kHeight);

  std::string o =
      svg_frame(c, "timeline", "bytes by category over time", t_begin, t_end, rec.start_ns);
  o += stacked_areas(pts, c, t_end);

  std::string reserved;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    const double yy = c.y(pts[i].reserved);
    reserved +=
        point(c.x(pts[i].t_ns), yy) + point(c.x(i + 1 < pts.size() ? pts[i + 1].t_ns : t_end), yy);
  }
  o += "<polyline class=\"reserved\" points=\"" + reserved +
       "\"><title>reserved</title></polyline>\n";

  // The peak, from the recording's exact figures (it may lie before the kept events).
  const double px = c.x(std::clamp(rec.peak.time_ns, t_begin, t_end));
  const double py = c.y(rec.peak.allocated);
  o += "<g id=\"peak\"><line class=\"peak\" x1=\"" + fmt("%.1f", px) + "\" y1=\"" +
       fmt("%.1f", kTop) + "\" x2=\"" + fmt("%.1f", px) + "\" y2=\"" +
       fmt("%.1f", kHeight - kBottom) + "\"/><circle class=\"peak\" cx=\"" + fmt("%.1f", px) +
       "\" cy=\"" + fmt("%.1f", py) + "\" r=\"4\"/><text class=\"peak\" x=\"" +
       fmt("%.1f", std::min(px + 6, kWidth - 260)) + "\" y=\"" + fmt("%.1f", kTop + 12) +
       "\">peak " + escape(format_bytes(rec.peak.allocated)) +
       " allocated: " + phase_label(rec.peak.phase) + " / " + block_label(rec.peak.block) +
       "</text></g>\n";
  o += "</svg>\n";
  return o;
}

// Pinned host memory by category over the device chart's time span.
std::string svg_host_chart(const ProfileReport& r, Span span) {
  const Recording& rec = r.recording;
  const auto [t_begin, t_end] = span;
  const std::vector<Sample> pts = host_samples(rec, t_begin);
  const Chart c(t_begin, t_end, rec.host_peak + rec.host_peak / 20, kHostHeight);
  std::string o = svg_frame(c, "host_timeline", "pinned host bytes by category over time", t_begin,
                            t_end, rec.start_ns);
  o += stacked_areas(pts, c, t_end);
  o += "</svg>\n";
  return o;
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

constexpr const char* kStyle =
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1000px}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}"
    "th{background:#f4f4f4}.meta{color:#555}"
    "svg .grid{stroke:#ddd;stroke-width:1}svg .tick{font-size:11px;fill:#555}"
    "svg .area{stroke:none;opacity:0.9}"
    "svg .reserved{fill:none;stroke:#000;stroke-dasharray:4 3;stroke-width:1.2}"
    "svg .peak{stroke:#d00;fill:#d00;font-size:12px}"
    ".swatch{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;"
    "vertical-align:middle}";

}  // namespace

std::string report_html(const ProfileReport& r) {
  const Recording& rec = r.recording;
  std::string o;
  o += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  o += "<title>memfit profile: " + escape(r.model) + "</title>\n";
  o += "<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  o += "<h1>memfit profile: " + escape(r.model) + "</h1>\n";
  o += "<p class=\"meta\">backend " + escape(r.backend) + ", " + std::to_string(r.steps) +
       " steps, " + fmt("%.1f", static_cast<double>(rec.end_ns - rec.start_ns) / 1e6) + " ms; " +
       std::to_string(rec.events.size()) + " allocator events kept, " +
       std::to_string(rec.dropped_events) + " dropped; " + std::to_string(rec.ranges.size()) +
       " ranges kept, " + std::to_string(rec.dropped_ranges) + " dropped</p>\n";
  o += "<p><code>" + escape(see_memory_usage_line(r.stats)) + "</code></p>\n";
  o += "<p>Peak allocated <b>" + escape(format_bytes(rec.peak.allocated)) +
       "</b>, peak reserved <b>" + escape(format_bytes(rec.peak_reserved)) + "</b>";
  if (r.device_total_bytes > 0) {
    o += " of " + escape(format_bytes(r.device_total_bytes)) + " on the device (" +
         percent(rec.peak_reserved, r.device_total_bytes) + ")";
  }
  o += ".</p>\n";

  o += "<h2>Memory over time</h2>\n<p>Allocated bytes stacked by category; dashed: reserved.";
  if (rec.events.size() > 2 * kBuckets) {
    o += " " + std::to_string(rec.events.size()) +
         " events drawn as the lowest and highest point of each of " + std::to_string(kBuckets) +
         " intervals.";
  }
  const std::vector<Sample> pts = samples(rec);
  o += "</p>\n" + svg_chart(r, pts) + "<p>";
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    o += "<span class=\"swatch\" style=\"background:" + std::string(kColors[c]) + "\"></span>" +
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
    o += ".</p>\n" + svg_host_chart(r, time_span(rec, pts)) + "<table>\n" +
         head({"category", "at the host peak"});
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      if (rec.host_at_peak[c] == 0) continue;
      o += row({escape(category_name(static_cast<Category>(c))),
                escape(format_bytes(rec.host_at_peak[c]))});
    }
    o += "</table>\n";
  }

  o += "<h2>At the peak</h2>\n<p>" +
       fmt("%.3f", static_cast<double>(rec.peak.time_ns - rec.start_ns) / 1e6) + " ms; phase " +
       phase_label(rec.peak.phase) + ", block " + block_label(rec.peak.block) + ".</p>\n<table>\n" +
       head({"category", "bytes", "share"});
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    o += row({escape(category_name(static_cast<Category>(c))),
              escape(format_bytes(rec.peak.by_category[c])),
              percent(rec.peak.by_category[c], rec.peak.allocated)});
  }
  o += "</table>\n<h2>Blocks at the peak</h2>\n<table>\n" + head({"block", "live bytes", "share"});
  for (const BlockBytes& b : rec.peak.blocks) {
    o += row({block_label(b.block), escape(format_bytes(b.bytes)),
              percent(b.bytes, rec.peak.allocated)});
  }
  o += "</table>\n";

  o += "<h2>Plan vs measured</h2>\n";
  if (r.plan.present) {
    const auto ratio = [](std::size_t m, std::size_t p) {
      return p == 0 ? std::string("-")
                    : fmt("%.3f", static_cast<double>(m) / static_cast<double>(p));
    };
    o += "<p>" + escape(r.plan.description) + "</p>\n<table>\n" +
         head({"", "predicted", "measured", "measured / predicted"}) +
         row({"peak reserved", escape(format_bytes(r.plan.predicted_peak_reserved)),
              escape(format_bytes(rec.peak_reserved)),
              ratio(rec.peak_reserved, r.plan.predicted_peak_reserved)}) +
         row({"peak allocated", escape(format_bytes(r.plan.predicted_peak_allocated)),
              escape(format_bytes(rec.peak.allocated)),
              ratio(rec.peak.allocated, r.plan.predicted_peak_allocated)});
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

  o += "<h2>Allocator statistics</h2>\n<p>Settings: <code>" + escape(r.config.to_string()) +
       "</code></p>\n<table>\n" + head({"stat", "value"});
  for (const auto& [key, value] : r.stats.as_map()) {
    o += row({escape(key), std::to_string(value)});
  }
  o += "</table>\n</body>\n</html>\n";
  return o;
}

}  // namespace memfit
