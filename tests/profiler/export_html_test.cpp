#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "memory/size.h"
#include "profiler/report.h"
#include "tests/profiler/export_testutil.h"

namespace memfit {
namespace {

using exporttest::html_balance_error;
using exporttest::RecordingBuilder;
using exporttest::sample_report;

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

TEST(HtmlChecker, CatchesWhatItShould) {
  EXPECT_EQ(html_balance_error("<p><b>x</b></p>"), "");
  EXPECT_NE(html_balance_error("<p><b>x</p></b>"), "");
  EXPECT_NE(html_balance_error("<p>a < b</p>"), "");
  EXPECT_NE(html_balance_error("<p>a & b</p>"), "");
  EXPECT_NE(html_balance_error("<p><script>alert(1)</script></p>"), "");
  EXPECT_NE(html_balance_error("<div>"), "");
}

TEST(ReportHtml, IsWellFormedAndSelfContained) {
  const std::string html = report_html(sample_report());
  EXPECT_EQ(html_balance_error(html), "");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(count(html, "<svg"), 1u);
  EXPECT_NE(html.find("<polygon"), std::string::npos);
  EXPECT_NE(html.find("id=\"peak\""), std::string::npos);
  // Nothing loads from elsewhere: the only URL is the SVG namespace, which is not fetched.
  EXPECT_EQ(count(html, "http://") + count(html, "https://"), 1u);
  EXPECT_EQ(count(html, "http://www.w3.org/2000/svg"), 1u);
  for (const char* attr : {" src=", " href=", "@import", "url("}) {
    EXPECT_EQ(html.find(attr), std::string::npos) << attr;
  }
}

TEST(ReportHtml, NamesAreEscapedEverywhere) {
  const std::string evil = "<script>alert(1)</script>";
  ProfileReport r = sample_report(evil);
  r.model = "m<b>&\"'";
  r.plan.present = true;
  r.plan.description = "<img src=x onerror=alert(2)>";
  r.gpu.push_back(
      {GpuActivityKind::kKernel, "k<i>", r.recording.start_ns, r.recording.start_ns + 10, 1, 0, 0});
  r.recording.peak.block = intern_name(evil);
  const std::string html = report_html(r);
  EXPECT_EQ(html.find(evil), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<i>"), std::string::npos);
  EXPECT_NE(html.find("m&lt;b&gt;&amp;&quot;&#39;"), std::string::npos);
  EXPECT_EQ(html_balance_error(html), "");
}

TEST(ReportHtml, ShowsThePeakBlocksPlanAndStats) {
  ProfileReport r = sample_report("h5");
  r.plan.present = true;
  r.plan.description = "bf16 every:2";
  r.plan.predicted_peak_reserved = r.recording.peak_reserved;
  r.stats.num_alloc_retries = 31337;
  const std::string html = report_html(r);
  EXPECT_NE(html.find("peak " + format_bytes(r.recording.peak.allocated)), std::string::npos);
  EXPECT_NE(html.find("<td>h5</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>embedding</td>"), std::string::npos);
  EXPECT_NE(html.find("bf16 every:2"), std::string::npos);
  EXPECT_NE(html.find("<td>1.000</td>"), std::string::npos);  // measured / predicted
  EXPECT_NE(html.find("<td>num_alloc_retries</td><td>31337</td>"), std::string::npos);
  EXPECT_NE(html.find(see_memory_usage_line(r.stats)), std::string::npos);
}

// A long timeline is drawn with a bounded number of points, and the peak survives.
TEST(ReportHtml, LongTimelinesAreDownsampledKeepingThePeak) {
  RecordingBuilder b;
  b.segment_alloc(0x100000000, std::size_t{128} << 20);
  std::uintptr_t addr = 0x100000000;
  std::vector<std::uintptr_t> live;
  // A saw-tooth with one tall spike in the middle.
  for (int i = 0; i < 20000; ++i) {
    const std::size_t size = i == 10007 ? (std::size_t{64} << 20) : 4096;
    b.alloc(addr, size, i % 2 ? Category::kActivation : Category::kTemporary, "forward", "h1");
    live.push_back(addr);
    addr += size;
    if (live.size() >= 8) {
      for (std::uintptr_t a : live) b.free(a);
      live.clear();
    }
  }
  ProfileReport r;
  r.recording = b.build();
  ASSERT_GT(r.recording.events.size(), 40000u);
  const std::string html = report_html(r);
  EXPECT_EQ(html_balance_error(html), "");
  EXPECT_LT(html.size(), std::size_t{1} << 20);  // ~80 k events would be megabytes undrawn
  // The highest point of the stacked areas reaches the peak: find the smallest y drawn.
  const std::regex pt(R"((\d+\.\d),(\d+\.\d))");
  const std::size_t first_poly = html.find("<polygon");
  const std::size_t end_poly = html.find("<polyline");
  ASSERT_NE(first_poly, std::string::npos);
  const std::string polys = html.substr(first_poly, end_poly - first_poly);
  double min_y = 1e9;
  std::size_t points = 0;
  for (auto it = std::sregex_iterator(polys.begin(), polys.end(), pt); it != std::sregex_iterator();
       ++it) {
    min_y = std::min(min_y, std::stod((*it)[2].str()));
    ++points;
  }
  EXPECT_LT(points, 20000u);
  // y of the peak on the chart (export_html.cpp: 360 px high, margins 20 above and 40 below,
  // the axis reaching 5% above the larger of the peaks).
  const std::size_t top = r.recording.peak_reserved + r.recording.peak_reserved / 20;
  const double y_peak =
      20 + 300 * (1 - static_cast<double>(r.recording.peak.allocated) / static_cast<double>(top));
  ASSERT_LT(y_peak, 200);  // the spike stands well above the saw-tooth
  EXPECT_NEAR(min_y, y_peak, 1.5);
}

// Pinned host memory gets its own chart on the device chart's time axis, with its peak by
// category and against the plan; a run without offload shows none.
TEST(ReportHtml, PinnedHostMemoryHasItsOwnChartOnlyWhenThereIsSome) {
  ProfileReport none = sample_report();
  EXPECT_EQ(report_html(none).find("host_timeline"), std::string::npos);

  RecordingBuilder b;
  b.segment_alloc(0x10000, 1 << 20)
      .alloc(0x10000, 4096, Category::kParameter)
      .host(Category::kOptimizerState, 3 << 20)
      .host(Category::kGradient, 1 << 20)
      .host(Category::kActivation, 512 << 10);
  ProfileReport r;
  r.recording = b.build();
  r.plan.present = true;
  r.plan.description = "offload all";
  r.plan.predicted_host_pinned = (4 << 20) + (512 << 10);
  const std::string html = report_html(r);
  EXPECT_EQ(html_balance_error(html), "");
  const std::size_t chart =
      html.find("<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"host_timeline\"");
  ASSERT_NE(chart, std::string::npos);
  const std::string svg = html.substr(chart, html.find("</svg>", chart) - chart);
  for (const char* name : {"optimizer_state", "gradient", "activation"}) {
    EXPECT_NE(svg.find("<title>" + std::string(name) + "</title>"), std::string::npos) << name;
  }
  EXPECT_EQ(svg.find("<title>parameter</title>"), std::string::npos);  // none on the host
  EXPECT_NE(html.find("<td>gradient</td><td>" + format_bytes(1 << 20) + "</td>"),
            std::string::npos);
  EXPECT_NE(html.find("<td>pinned host</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>1.000</td>"), std::string::npos);  // measured / predicted host
}

}  // namespace
}  // namespace memfit
