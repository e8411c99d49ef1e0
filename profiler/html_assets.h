// report.html's inline assets (export_html.cpp writes them into the page; nothing is fetched):
// - kReportStyle: the page's CSS, with the media query that shows the narrow chart copy on
//   small screens (html_chart.h);
// - kReportScript: the hover readout and drag-to-zoom over every chart. It reads the data-*
//   attributes svg_chart writes and the JSON data export_html.cpp embeds as
//   <script type="application/json" id="data-<chart>">, writes names only as text
//   (textContent), and recomputes the time ticks while zoomed with html_chart.cpp's rules.
#pragma once

namespace memfit::html {

extern const char* const kReportStyle;
extern const char* const kReportScript;

}  // namespace memfit::html
