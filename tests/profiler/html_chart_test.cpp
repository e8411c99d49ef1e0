// report.html's charts (profiler/html_chart.h): round ticks, and the geometry of every label
// read back from the SVG: inside the frame and clear of each other, for wide and narrow
// charts, short and long runs, long marker labels, tiny and huge byte ranges.
#include "profiler/html_chart.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "tests/profiler/export_testutil.h"

namespace memfit {
namespace {

using html::Ticks;

// The mantissa of a tick step in its unit: 1, 2 or 5 (x 10^k).
bool round_step(double step_in_unit) {
  const double p = std::pow(10.0, std::floor(std::log10(step_in_unit)));
  const double m = step_in_unit / p;
  return std::fabs(m - 1) < 1e-9 || std::fabs(m - 2) < 1e-9 || std::fabs(m - 5) < 1e-9;
}

TEST(HtmlChart, ByteTicksAreRoundAndFew) {
  for (double max : {1.0, 7.0, 1000.0, 5e5, 63.3e6, 67108864.0, 181.12 * 1048576, 80e9, 3e13}) {
    SCOPED_TRACE(max);
    for (int n : {3, 5}) {
      const Ticks t = html::byte_ticks(max, n);
      EXPECT_TRUE(round_step(t.step / t.unit)) << t.step / t.unit;
      EXPECT_LE(std::ceil(max / t.step), n + 0.0) << "ticks above 0";
      EXPECT_GE(std::ceil(max / t.step), 1.0);
      // A label is a short number and the unit: "60 MiB", not "60.38 MiB".
      const std::string label = html::tick_label(2 * t.step, t);
      EXPECT_LE(label.size(), 10u) << label;
    }
  }
  const Ticks m = html::byte_ticks(181.12 * 1048576, 5);  // the issue's 60.38 / 120.75 / 181.12
  EXPECT_EQ(html::tick_label(m.step, m), "50 MiB");
  EXPECT_EQ(html::tick_label(0, m), "0");
}

TEST(HtmlChart, TimeTicksAreRoundInMillisecondsOrSeconds) {
  EXPECT_EQ(html::tick_label(2000, html::time_ticks(9364.4, 6)), "2 s");
  EXPECT_EQ(html::tick_label(200, html::time_ticks(1000, 6)), "200 ms");
  const Ticks small = html::time_ticks(0.8, 6);
  EXPECT_TRUE(round_step(small.step));
  EXPECT_EQ(html::tick_label(small.step, small), "0.2 ms");
  const Ticks half = html::time_ticks(3000, 6);
  EXPECT_EQ(html::tick_label(half.step, half), "0.5 s");
}

struct Label {
  double x0, x1, y0, y1;
  std::string text;
};

std::string unescape(std::string s) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#39;", "'"}, {"&amp;", "&"}}) {
    for (std::size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + 1)) {
      s.replace(p, from.size(), to);
    }
  }
  return s;
}

// Every <text> of an SVG as the box it covers: the estimated width (html::text_width) placed
// by its anchor, from the baseline up one font size and down a quarter.
std::vector<Label> labels(const std::string& svg) {
  static const std::regex text(
      R"re(<text[^>]* x="([-\d.]+)" y="([-\d.]+)" font-size="([\d.]+)" text-anchor="(\w+)">([^<]*)</text>)re");
  std::vector<Label> out;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text); it != std::sregex_iterator();
       ++it) {
    const double x = std::stod((*it)[1]), y = std::stod((*it)[2]), f = std::stod((*it)[3]);
    const std::string s = unescape((*it)[5]);
    const double w = html::text_width(s, f);
    const std::string anchor = (*it)[4];
    const double x0 = anchor == "start" ? x : anchor == "end" ? x - w : x - w / 2;
    out.push_back({x0, x0 + w, y - f, y + f / 4, s});
  }
  return out;
}

void expect_readable(const std::string& svg, const std::string& what) {
  SCOPED_TRACE(what);
  std::smatch vb;
  ASSERT_TRUE(std::regex_search(svg, vb, std::regex(R"re(viewBox="0 0 ([\d.]+) ([\d.]+)")re")));
  const double w = std::stod(vb[1]), h = std::stod(vb[2]);
  const std::vector<Label> ls = labels(svg);
  ASSERT_GE(ls.size(), 3u) << "no labels parsed";
  std::size_t texts = 0;
  for (std::size_t p = svg.find("<text"); p != std::string::npos; p = svg.find("<text", p + 1)) {
    ++texts;
  }
  ASSERT_EQ(ls.size(), texts) << "a <text> the parser cannot read";
  for (const Label& l : ls) {
    EXPECT_GE(l.x0, 0) << "clipped left: " << l.text;
    EXPECT_LE(l.x1, w) << "clipped right: " << l.text;
    EXPECT_GE(l.y0, 0) << "clipped top: " << l.text;
    EXPECT_LE(l.y1, h) << "clipped bottom: " << l.text;
  }
  for (std::size_t i = 0; i < ls.size(); ++i) {
    for (std::size_t j = i + 1; j < ls.size(); ++j) {
      const bool overlap =
          ls[i].x0 < ls[j].x1 && ls[j].x0 < ls[i].x1 && ls[i].y0 < ls[j].y1 && ls[j].y0 < ls[i].y1;
      EXPECT_FALSE(overlap) << "'" << ls[i].text << "' overlaps '" << ls[j].text << "'";
    }
  }
  // The markers' labels sit above the plot: clear of the data and the reserved line.
  std::smatch top;
  ASSERT_TRUE(std::regex_search(svg, top, std::regex(R"re(data-t="([\d.]+)")re")));
  for (const Label& l : ls) {
    if (l.text.find("peak") != std::string::npos) {
      EXPECT_LE(l.y1, std::stod(top[1])) << l.text;
    }
  }
}

html::ChartSpec spec(double width, std::int64_t span_ns, int markers) {
  html::ChartSpec c;
  c.width = width;
  c.t_begin = 1'000'000;
  c.t_end = c.t_begin + span_ns;
  c.start_ns = 1'000'000;
  c.colors.fill("#888");
  const std::int64_t q = span_ns / 4;
  c.steps = {{c.t_begin, c.t_begin + 2 * q, "step 1", "#ddd"},
             {c.t_begin + 2 * q, c.t_end, "step 2", "#eee"}};
  c.phases = {{c.t_begin, c.t_begin + q, "forward", "#9ecae1"},
              {c.t_begin + q, c.t_begin + 2 * q, "backward", "#fdae6b"}};
  for (int k = 0; k < markers; ++k) {
    c.markers.push_back({c.t_end - 1, k == 0 ? "step peak 41.34 MiB allocated" : "whole-run peak",
                         " at 9364.4 ms (backward, layers.31.self_attn with a long name)", "#c00"});
  }
  return c;
}

html::Series series(std::int64_t t_begin, std::int64_t span_ns, std::size_t peak) {
  html::Series s;
  for (int i = 0; i < 50; ++i) {
    s.t_ns.push_back(t_begin + span_ns * i / 50);
    CategoryBytes b{};
    b[category_index(Category::kActivation)] = peak / 50 * static_cast<std::size_t>(i);
    b[category_index(Category::kParameter)] = peak / 10;
    s.bytes.push_back(b);
    s.reserved.push_back(peak + peak / 3);
  }
  return s;
}

TEST(HtmlChart, LabelsStayInsideTheFrameAndApart) {
  for (double width : {960.0, 400.0}) {
    for (std::int64_t span : {std::int64_t{800'000}, std::int64_t{9'364'400'000},
                              std::int64_t{123'456'789}, std::int64_t{3'600'000'000'000}}) {
      for (std::size_t peak : {std::size_t{700}, std::size_t{43'343'360}, std::size_t{181} << 20,
                               std::size_t{75} << 30}) {
        for (int markers : {0, 1, 2}) {
          const html::ChartSpec c = spec(width, span, markers);
          const std::string svg = html::svg_chart(c, series(c.t_begin, span, peak));
          expect_readable(svg, "width " + std::to_string(width) + " span " + std::to_string(span) +
                                   " peak " + std::to_string(peak) + " markers " +
                                   std::to_string(markers));
          EXPECT_EQ(exporttest::html_balance_error(svg), "");
        }
      }
    }
  }
}

// A marker label too wide for a narrow chart keeps its headline and drops its detail.
TEST(HtmlChart, ALongMarkerLabelDropsItsDetailRatherThanLeaveTheFrame) {
  html::ChartSpec c = spec(400, 1'000'000'000, 1);
  const std::string narrow = html::svg_chart(c, series(c.t_begin, 1'000'000'000, 1 << 20));
  EXPECT_NE(narrow.find(">step peak 41.34 MiB allocated</text>"), std::string::npos);
  c.width = 960;
  const std::string wide = html::svg_chart(c, series(c.t_begin, 1'000'000'000, 1 << 20));
  EXPECT_NE(wide.find("step peak 41.34 MiB allocated at 9364.4 ms"), std::string::npos);
}

}  // namespace
}  // namespace memfit
