#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <string>

#include "memory/size.h"
#include "profiler/html_chart.h"
#include "profiler/pickle.h"
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
  EXPECT_NE(html.find("<meta name=\"viewport\" content=\"width=device-width"), std::string::npos);
  // A wide and a narrow copy of the chart, CSS showing the one that fits.
  EXPECT_EQ(count(html, "class=\"chart wide\""), 1u);
  EXPECT_EQ(count(html, "class=\"chart narrow\""), 1u);
  EXPECT_NE(html.find("@media (max-width:640px)"), std::string::npos);
  EXPECT_NE(html.find("<polygon"), std::string::npos);
  EXPECT_NE(html.find("class=\"marker\""), std::string::npos);
  // The hover readout's data and script are inline.
  EXPECT_EQ(count(html, "<script"), 2u);
  EXPECT_NE(html.find("id=\"data-timeline\""), std::string::npos);
  // Nothing loads from elsewhere: the only URL is the SVG namespace, which is not fetched.
  const std::size_t urls = count(html, "http://") + count(html, "https://");
  EXPECT_EQ(urls, count(html, "http://www.w3.org/2000/svg"));
  for (const char* attr : {" src=", " href=", "@import", "url(", "fetch(", "XMLHttpRequest"}) {
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

// The wide chart's data layer (the nested <svg class="plot">) and the chart's viewBox height.
std::string wide_plot(const std::string& html, const std::string& chart = "timeline") {
  const std::size_t svg = html.find("class=\"chart wide\"");
  const std::size_t at = html.find("data-chart=\"" + chart + "\"", svg);
  EXPECT_NE(at, std::string::npos);
  const std::size_t plot = html.find("<svg class=\"plot\"", at);
  return html.substr(plot, html.find("</svg>", plot) - plot);
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
  EXPECT_LT(html.size(), std::size_t{2} << 20);  // ~80 k events would be megabytes undrawn
  // The highest point of the stacked areas reaches the peak: find the smallest y drawn.
  const std::string plot = wide_plot(html);
  const std::size_t first_poly = plot.find("<polygon");
  const std::size_t end_poly = plot.find("<polyline");
  ASSERT_NE(first_poly, std::string::npos);
  const std::string polys = plot.substr(first_poly, end_poly - first_poly);
  const std::regex pt(R"((\d+\.\d+),(\d+\.\d))");
  double min_y = 1e9;
  std::size_t points = 0;
  for (auto it = std::sregex_iterator(polys.begin(), polys.end(), pt); it != std::sregex_iterator();
       ++it) {
    min_y = std::min(min_y, std::stod((*it)[2].str()));
    ++points;
  }
  EXPECT_LT(points, 20000u);
  // The plot is 300 units high; its top is the first round byte tick at or above the larger
  // of the peaks (html_chart.h).
  const double top_bytes = static_cast<double>(r.recording.peak_reserved);
  const html::Ticks t = html::byte_ticks(top_bytes, 5);
  const double y_max = std::ceil(top_bytes / t.step) * t.step;
  const double y_peak = 300 * (1 - static_cast<double>(r.recording.peak.allocated) / y_max);
  ASSERT_LT(y_peak, 200);  // the spike stands well above the saw-tooth
  EXPECT_NEAR(min_y, y_peak, 0.15);
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
  ASSERT_NE(html.find("data-chart=\"host_timeline\""), std::string::npos);
  const std::string svg = wide_plot(html, "host_timeline");
  for (const char* name : {"optimizer_state", "gradient", "activation"}) {
    EXPECT_NE(svg.find("<title>" + std::string(name) + "</title>"), std::string::npos) << name;
  }
  EXPECT_EQ(svg.find("<title>parameter</title>"), std::string::npos);  // none on the host
  EXPECT_NE(html.find("<td>gradient</td><td>" + format_bytes(1 << 20) + "</td>"),
            std::string::npos);
  EXPECT_NE(html.find("<td>pinned host</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>1.000</td>"), std::string::npos);  // measured / predicted host
}

// Both peaks are stated and labelled, setup's never as "no phase"; plan vs measured is on the
// steps'; the title says which command made the report; the DeepSpeed line is labelled.
TEST(ReportHtml, StatesTheStepPeakAndTheWholeRunsEachLabelled) {
  ProfileReport r = exporttest::setup_spike_report();
  r.plan.present = true;
  r.plan.description = "bf16";
  r.plan.predicted_peak_allocated = r.recording.steps_peak().allocated;
  r.plan.predicted_peak_reserved = r.recording.steps_peak_reserved();
  const std::string html = report_html(r);
  EXPECT_EQ(html_balance_error(html), "");
  EXPECT_NE(html.find("<title>memfit train: gpt-spike</title>"), std::string::npos);
  EXPECT_NE(html.find("Step peak (what a plan predicts): allocated <b>3.00 MiB</b>"),
            std::string::npos);
  EXPECT_NE(html.find("Whole run, setup included: allocated <b>5.50 MiB</b>"), std::string::npos);
  EXPECT_NE(html.find(">step peak 3.00 MiB allocated"), std::string::npos);
  EXPECT_NE(html.find(">whole-run peak 5.50 MiB allocated"), std::string::npos);
  EXPECT_EQ(html.find("no phase"), std::string::npos);
  EXPECT_NE(html.find("<td>peak allocated</td><td>3.00 MiB</td><td>3.00 MiB</td><td>1.000</td>"),
            std::string::npos);
  EXPECT_NE(html.find("DeepSpeed's <code>see_memory_usage</code>"), std::string::npos);
  // Bands: the setup phase and the step, under the chart.
  EXPECT_NE(html.find("<title>setup</title>"), std::string::npos);
  EXPECT_NE(html.find("<title>step 1</title>"), std::string::npos);
}

// The chart's colours are the ones memory_viz gives the same run's snapshot.pickle: by first
// appearance in its device trace (a segment's "unknown" first here), d3's schemeTableau10.
TEST(ReportHtml, CategoryColoursAreMemoryVizsForTheSameRecording) {
  const ProfileReport r = exporttest::setup_spike_report();
  const auto colors = memory_viz_colors(r.recording);
  EXPECT_STREQ(colors[category_index(Category::kUnknown)], "#4e79a7");
  EXPECT_STREQ(colors[category_index(Category::kParameter)], "#f28e2c");
  EXPECT_STREQ(colors[category_index(Category::kOptimizerState)], "#e15759");
  EXPECT_STREQ(colors[category_index(Category::kTemporary)], "#76b7b2");
  EXPECT_STREQ(colors[category_index(Category::kActivation)], "#59a14f");
  EXPECT_STREQ(colors[category_index(Category::kGradient)], "#edc949");
  const std::string html = report_html(r);
  EXPECT_NE(html.find("fill=\"#59a14f\" points="), std::string::npos);  // activations' area
  EXPECT_NE(html.find("background:#f28e2c\"></span>parameter"), std::string::npos);  // legend
}

// Names reach the hover readout's JSON escaped so that none can close the script element.
TEST(ReportHtml, TheReadoutDataCannotBeClosedByAName) {
  const std::string evil = "</script><script>alert(1)</script>";
  const std::string html = report_html(sample_report(evil));
  EXPECT_EQ(html.find(evil), std::string::npos);
  EXPECT_NE(html.find("\\u003c/script\\u003e"), std::string::npos);
  EXPECT_EQ(html_balance_error(html), "");
  EXPECT_EQ(count(html, "</script>"), 2u);
}

// The readout writes names as text (textContent), never as markup: the page's script has no
// innerHTML (or outerHTML / insertAdjacentHTML / document.write) at all.
TEST(ReportHtml, TheReadoutWritesNamesAsText) {
  const std::string html = report_html(sample_report("<img src=x onerror=alert(1)>"));
  for (const char* sink : {"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"}) {
    EXPECT_EQ(html.find(sink), std::string::npos) << sink;
  }
  EXPECT_NE(html.find("textContent"), std::string::npos);
}

// memory_viz_colors against the order read back from the same report's snapshot.pickle, as
// MemoryViz.js's annotate_snapshot builds snapshot.categories (first appearance of each entry's
// "category" over the device trace).
TEST(ReportHtml, ColoursFollowTheCategoriesOrderInThePickle) {
  for (const ProfileReport& r : {exporttest::setup_spike_report(), sample_report()}) {
    const PickleValue snap = read_pickle(snapshot_pickle(r), "snapshot.pickle");
    std::vector<std::string> order;
    for (const PickleValue& e : snap.find("device_traces")->items()[0].items()) {
      const PickleValue* c = e.find("category");
      if (c == nullptr) continue;
      if (std::find(order.begin(), order.end(), c->as_str()) == order.end()) {
        order.push_back(c->as_str());
      }
    }
    static const char* const kTableau10[] = {"#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f",
                                             "#edc949", "#af7aa1", "#ff9da7", "#9c755f", "#bab0ab"};
    const auto colors = memory_viz_colors(r.recording);
    ASSERT_FALSE(order.empty());
    for (std::size_t k = 0; k < order.size(); ++k) {
      const Category c = parse_category(order[k]);
      EXPECT_STREQ(colors[category_index(c)], kTableau10[k % 10]) << order[k];
    }
  }
}

}  // namespace
}  // namespace memfit
