// report.html's charts (profiler/export_html.cpp draws the page): bytes by category over time
// as an inline SVG, stacked areas in memory_viz's colours, for one design width. The page
// carries a wide and a narrow copy of each chart and CSS shows the one that fits the screen,
// so text stays readable on a phone without the chart being cut off.
//
// Layout, top to bottom: one label line per marker above the plot (never over the data or the
// reserved line), the plot (grid at round byte ticks, the stacked areas, the dashed reserved
// line, a vertical line per marker), round time ticks under it, then a lane of step bands and a
// lane of phase bands. Every label is kept inside the frame: a time tick whose label would
// cross the right edge is left unlabelled, a marker label too wide for the frame drops its
// detail. Each <text> carries its font-size, so tests can check the geometry from the SVG alone
// (text_width is the estimate they share).
//
// What report.html's script uses (hover readout and zoom): the data layers are nested
// <svg class="plot"> elements whose viewBox x runs 0 to kSpanUnits over the chart's time span
// (zooming sets it; the points are written to 1e-7 of the span, so zooming in 10^4 times still
// draws them apart), with data-* attributes on the outer <svg> for the frame (data-l, data-t,
// data-w, data-h, the plot's position in design units; data-t0 / data-t1, its full time range
// in ms since the recording's start, to the ns; data-chart, the id of the JSON data the
// readout shows).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memory/category.h"

namespace memfit::html {

// The states to draw: point i holds from t_ns[i] until t_ns[i + 1] (the last until t_end).
struct Series {
  std::vector<std::int64_t> t_ns;
  std::vector<CategoryBytes> bytes;
  std::vector<std::size_t> reserved;  // empty: no reserved line (the host chart)
};

struct Band {
  std::int64_t begin_ns = 0, end_ns = 0;
  std::string label;  // drawn when it fits the band
  const char* fill = "#ddd";
};

struct Marker {
  std::int64_t t_ns = 0;
  std::string label;   // "step peak 41.34 MiB allocated"
  std::string detail;  // " at 1187.1 ms (backward, h.5)": dropped when the line is too wide
  const char* color = "#c00";
};

inline constexpr double kSpanUnits = 1000;  // the data layers' viewBox width

struct ChartSpec {
  const char* id = "timeline";  // the chart's data id (data-chart)
  // The byte axis reaches at least this (the recording's exact peaks: a long timeline's drawn
  // points may have lost the reserved peak to downsampling).
  std::size_t top_bytes_at_least = 0;
  const char* aria = "";
  double width = 960;  // design units (the viewBox)
  double plot_height = 300;
  std::int64_t t_begin = 0, t_end = 0;  // the time axis (steady_clock ns; t_end < t_begin: empty)
  std::int64_t start_ns = 0;            // the recording's start: tick labels count from it
  std::array<const char*, kCategoryCount> colors{};
  std::vector<Band> steps, phases;  // lanes under the plot; none drawn when empty
  std::vector<Marker> markers;      // one label line each above the plot
};

std::string svg_chart(const ChartSpec& c, const Series& s);

// Round ticks over [0, max]: multiples of step = {1, 2, 5} x 10^k units, at most max_ticks + 1
// of them (0 included), the unit the largest binary one (bytes: B, KiB, ... ) or time one
// (ms, s) that keeps the labels short.
struct Ticks {
  double step = 1;  // in the axis's own measure (bytes, ms)
  double unit = 1;  // the label's unit in that measure
  const char* unit_name = "";
};
Ticks byte_ticks(double max_bytes, int max_ticks);
Ticks time_ticks(double span_ms, int max_ticks);
std::string tick_label(double v, const Ticks& t);  // "16 MiB", "2.5 s", "0"

// The width a label takes at `font` px: 0.62 em per character, a bound for the page's
// system-ui / sans-serif fonts (digits and lower case are narrower).
double text_width(std::string_view s, double font);

// Text for an SVG or HTML text node or attribute: & < > " ' escaped.
std::string escape(std::string_view s);

}  // namespace memfit::html
