#include "profiler/html_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace memfit::html {

namespace {

constexpr double kFont = 12;    // tick and label text, px
constexpr double kLine = 16;    // one marker label line
constexpr double kRight = 16;   // right margin
constexpr double kTickGap = 6;  // between a tick label and the plot
constexpr double kLane = 14;    // one band lane
constexpr double kAxis = 20;    // the time tick labels' row

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string fmt6(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  return buf;
}

double ms(std::int64_t t, std::int64_t since) { return static_cast<double>(t - since) / 1e6; }

// The data layers' x: the span as 0 .. kSpanUnits, to 1e-7 of it.
std::string ux(std::int64_t t, std::int64_t t_begin, std::int64_t span_ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f",
                kSpanUnits * static_cast<double>(t - t_begin) / static_cast<double>(span_ns));
  return buf;
}

// 1, 2 or 5 x 10^k, the smallest such >= raw.
double nice(double raw) {
  if (!(raw > 0)) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw * (1 - 1e-12)) return m * p;
  }
  return 10 * p;
}

std::string text(double x, double y, const char* anchor, const char* cls, std::string_view s) {
  return "<text class=\"" + std::string(cls) + "\" x=\"" + num(x) + "\" y=\"" + num(y) +
         "\" font-size=\"" + num(kFont) + "\" text-anchor=\"" + anchor + "\">" + escape(s) +
         "</text>\n";
}

// The left margin: the widest byte tick label, its gap, a little air.
double left_margin(const Ticks& yt, double y_max) {
  double w = 0;
  for (double v = 0; v <= y_max * (1 + 1e-9); v += yt.step) {
    w = std::max(w, text_width(tick_label(v, yt), kFont));
  }
  return std::ceil(w + kTickGap + 4);
}

void bands(std::string& o, const std::vector<Band>& lane, double y, double l, double pw,
           std::int64_t t_begin, std::int64_t t_end, const char* cls) {
  if (lane.empty()) return;
  const std::int64_t span = t_end - t_begin;
  // The rectangles zoom with the data (a nested svg on the same time axis); the labels are
  // the outer svg's, hidden by the script while zoomed.
  o += "<svg class=\"plot lane\" x=\"" + num(l) + "\" y=\"" + num(y) + "\" width=\"" + num(pw) +
       "\" height=\"" + num(kLane - 2) + "\" viewBox=\"0 0 " + num(kSpanUnits) + " " +
       num(kLane - 2) + "\" preserveAspectRatio=\"none\">\n";
  for (const Band& b : lane) {
    const std::int64_t b0 = std::clamp(b.begin_ns, t_begin, t_end);
    const std::int64_t b1 = std::clamp(b.end_ns, b0, t_end);
    o += "<rect x=\"" + ux(b0, t_begin, span) + "\" y=\"0\" width=\"" +
         ux(t_begin + (b1 - b0), t_begin, span) + "\" height=\"" + num(kLane - 2) + "\" fill=\"" +
         b.fill + "\"><title>" + escape(b.label) + "</title></rect>\n";
  }
  o += "</svg>\n";
  for (const Band& b : lane) {
    const double f0 = static_cast<double>(std::clamp(b.begin_ns, t_begin, t_end) - t_begin);
    const double f1 = static_cast<double>(std::clamp(b.end_ns, t_begin, t_end) - t_begin);
    const double x0 = l + pw * f0 / static_cast<double>(span);
    const double x1 = l + pw * f1 / static_cast<double>(span);
    if (b.label.empty() || text_width(b.label, kFont - 2) + 4 > x1 - x0) continue;
    o += "<text class=\"band " + std::string(cls) + "\" x=\"" + num((x0 + x1) / 2) + "\" y=\"" +
         num(y + kLane - 4) + "\" font-size=\"" + num(kFont - 2) + "\" text-anchor=\"middle\">" +
         escape(b.label) + "</text>\n";
  }
}

}  // namespace

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

double text_width(std::string_view s, double font) {
  return 0.62 * font * static_cast<double>(s.size());
}

Ticks byte_ticks(double max_bytes, int max_ticks) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  Ticks t;
  int u = 0;
  double unit = 1;
  while (u < 5 && max_bytes >= 1024 * unit) {
    unit *= 1024;
    ++u;
  }
  t.unit = unit;
  t.unit_name = kUnits[u];
  t.step = nice(std::max(max_bytes, 1.0) / unit / std::max(1, max_ticks)) * unit;
  if (u == 0) t.step = std::max(1.0, std::round(t.step));
  return t;
}

Ticks time_ticks(double span_ms, int max_ticks) {
  Ticks t;
  const bool seconds = span_ms >= 2000;
  t.unit = seconds ? 1000 : 1;
  t.unit_name = seconds ? "s" : "ms";
  t.step = nice(std::max(span_ms, 1e-3) / t.unit / std::max(1, max_ticks)) * t.unit;
  return t;
}

std::string tick_label(double v, const Ticks& t) {
  if (v == 0) return "0";
  const double x = v / t.unit;
  // As many decimals as the step needs (a step of 0.5 shows one, of 0.25 two).
  int decimals = 0;
  for (double s = t.step / t.unit; decimals < 6 && std::fabs(s - std::round(s)) > 1e-9; s *= 10) {
    ++decimals;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, x, t.unit_name);
  return buf;
}

std::string svg_chart(const ChartSpec& c, const Series& s) {
  const bool narrow = c.width < 600;
  const std::int64_t span_ns = std::max<std::int64_t>(1, c.t_end - c.t_begin);
  const std::int64_t t_end = c.t_begin + span_ns;  // at least 1 ns after t_begin
  const double span_ms = static_cast<double>(span_ns) / 1e6;

  std::size_t top_bytes = std::max<std::size_t>(1, c.top_bytes_at_least);
  for (std::size_t i = 0; i < s.t_ns.size(); ++i) {
    std::size_t total = 0;
    for (std::size_t b : s.bytes[i]) total += b;
    top_bytes = std::max(top_bytes, total);
    if (!s.reserved.empty()) top_bytes = std::max(top_bytes, s.reserved[i]);
  }
  const Ticks yt = byte_ticks(static_cast<double>(top_bytes), narrow ? 4 : 5);
  const double y_max = std::ceil(static_cast<double>(top_bytes) / yt.step) * yt.step;

  const double l = left_margin(yt, y_max);
  const double t = 8 + kLine * static_cast<double>(c.markers.size());
  const double pw = c.width - l - kRight, ph = c.plot_height;
  const int lanes = (c.steps.empty() ? 0 : 1) + (c.phases.empty() ? 0 : 1);
  const double height = t + ph + kAxis + kLane * lanes + 4;
  const auto y_of = [&](double bytes) { return ph * (1 - bytes / y_max); };  // in the plot

  std::string o;
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart " +
       std::string(narrow ? "narrow" : "wide") + "\" viewBox=\"0 0 " + num(c.width) + " " +
       num(height) + "\" role=\"img\" aria-label=\"" + escape(c.aria) + "\" data-chart=\"" + c.id +
       "\" data-l=\"" + num(l) + "\" data-t=\"" + num(t) + "\" data-w=\"" + num(pw) +
       "\" data-h=\"" + num(ph) + "\" data-t0=\"" + fmt6(ms(c.t_begin, c.start_ns)) +
       "\" data-t1=\"" + fmt6(ms(t_end, c.start_ns)) + "\">\n";

  // Byte grid and ticks.
  for (double v = 0; v <= y_max * (1 + 1e-9); v += yt.step) {
    const double y = t + y_of(v);
    o += "<line class=\"grid\" x1=\"" + num(l) + "\" y1=\"" + num(y) + "\" x2=\"" + num(l + pw) +
         "\" y2=\"" + num(y) + "\"/>\n";
    o += text(l - kTickGap, y + kFont / 3, "end", "tick", tick_label(v, yt));
  }

  // The data layer: x in span units, y in plot units.
  o += "<svg class=\"plot\" x=\"" + num(l) + "\" y=\"" + num(t) + "\" width=\"" + num(pw) +
       "\" height=\"" + num(ph) + "\" viewBox=\"0 0 " + num(kSpanUnits) + " " + num(ph) +
       "\" preserveAspectRatio=\"none\">\n";
  const std::size_t n = s.t_ns.size();
  std::vector<double> below(n, 0);
  const auto x_at = [&](std::size_t i) {
    return ux(std::clamp(i < n ? s.t_ns[i] : t_end, c.t_begin, t_end), c.t_begin, span_ns);
  };
  for (std::size_t cat = 0; cat < kCategoryCount; ++cat) {
    bool any = false;
    for (std::size_t i = 0; i < n; ++i) any = any || s.bytes[i][cat] > 0;
    if (!any) continue;
    std::string top, bottom;
    for (std::size_t i = 0; i < n; ++i) {
      const double y = y_of(below[i] + static_cast<double>(s.bytes[i][cat]));
      top += x_at(i) + "," + num(y) + " " + x_at(i + 1) + "," + num(y) + " ";
    }
    for (std::size_t i = n; i-- > 0;) {
      const double y = y_of(below[i]);
      bottom += x_at(i + 1) + "," + num(y) + " " + x_at(i) + "," + num(y) + " ";
    }
    for (std::size_t i = 0; i < n; ++i) below[i] += static_cast<double>(s.bytes[i][cat]);
    o += "<polygon class=\"area\" fill=\"" + std::string(c.colors[cat]) + "\" points=\"" + top +
         bottom + "\"><title>" + escape(category_name(static_cast<Category>(cat))) +
         "</title></polygon>\n";
  }
  if (!s.reserved.empty()) {
    std::string pts;
    for (std::size_t i = 0; i < n; ++i) {
      const double y = y_of(static_cast<double>(s.reserved[i]));
      pts += x_at(i) + "," + num(y) + " " + x_at(i + 1) + "," + num(y) + " ";
    }
    o += "<polyline class=\"reserved\" points=\"" + pts + "\"><title>reserved</title></polyline>\n";
  }
  for (const Marker& m : c.markers) {
    const std::string x = ux(std::clamp(m.t_ns, c.t_begin, t_end), c.t_begin, span_ns);
    o += "<line class=\"marker\" stroke=\"" + std::string(m.color) + "\" x1=\"" + x +
         "\" y1=\"0\" x2=\"" + x + "\" y2=\"" + num(ph) + "\"/>\n";
  }
  o += "</svg>\n";

  // Marker labels above the plot, one line each, left-aligned on the frame: clear of the data
  // and of the reserved line, whatever the marker's time.
  for (std::size_t k = 0; k < c.markers.size(); ++k) {
    const Marker& m = c.markers[k];
    std::string line = m.label + m.detail;
    if (text_width(line, kFont) > c.width - l - kRight) line = m.label;
    o += "<text class=\"marker\" fill=\"" + std::string(m.color) + "\" x=\"" + num(l) + "\" y=\"" +
         num(4 + kLine * static_cast<double>(k + 1) - 4) + "\" font-size=\"" + num(kFont) +
         "\" text-anchor=\"start\">" + escape(line) + "</text>\n";
  }

  // Time ticks, counted from the recording's start; a label that would cross the frame's
  // right edge is left out (its grid line stays).
  const double t0_ms = ms(c.t_begin, c.start_ns);
  Ticks xt = time_ticks(span_ms, narrow ? 3 : 6);  // the step from the span
  if (t0_ms + span_ms >= 2000 && xt.unit == 1) {   // labels in s once the axis reaches 2 s
    xt.unit = 1000;
    xt.unit_name = "s";
  }
  const double first = std::ceil(t0_ms / xt.step) * xt.step;
  for (double v = first; v <= t0_ms + span_ms * (1 + 1e-9); v += xt.step) {
    const double x = l + pw * (v - t0_ms) / span_ms;
    const std::string label = tick_label(v, xt);
    o += "<line class=\"grid xg\" x1=\"" + num(x) + "\" y1=\"" + num(t) + "\" x2=\"" + num(x) +
         "\" y2=\"" + num(t + ph) + "\"/>\n";
    if (x + text_width(label, kFont) / 2 > c.width - 2) continue;
    o += text(x, t + ph + kAxis - 6, "middle", "tick xt", label);
  }

  // Bands under the axis.
  double y = t + ph + kAxis;
  if (!c.steps.empty()) {
    bands(o, c.steps, y, l, pw, c.t_begin, t_end, "steps");
    y += kLane;
  }
  if (!c.phases.empty()) bands(o, c.phases, y, l, pw, c.t_begin, t_end, "phases");

  // The hover and zoom surface (report.html's script).
  o += "<rect class=\"overlay\" x=\"" + num(l) + "\" y=\"" + num(t) + "\" width=\"" + num(pw) +
       "\" height=\"" + num(ph) + "\"/>\n";
  o += "</svg>\n";
  return o;
}

}  // namespace memfit::html
