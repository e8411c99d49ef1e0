#include "profiler/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "memory/error.h"
#include "memory/host_provider.h"
#include "profiler/atomic_file.h"
#include "profiler/recorder.h"
#include "profiler/scoped_range.h"
#include "tests/profiler/export_testutil.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using exporttest::sample_report;
using exporttest::temp_dir;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(ParseFormats, NamesListsAllAndDuplicates) {
  EXPECT_EQ(parse_formats("summary"), std::vector<ExportFormat>{ExportFormat::kSummary});
  EXPECT_EQ(parse_formats("html, csv,html"),
            (std::vector<ExportFormat>{ExportFormat::kHtml, ExportFormat::kCsv}));
  const std::vector<ExportFormat> all = parse_formats("all");
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(
      parse_formats("trace,all"),
      (std::vector<ExportFormat>{ExportFormat::kTrace, ExportFormat::kSummary, ExportFormat::kCsv,
                                 ExportFormat::kPickle, ExportFormat::kHtml}));
  for (ExportFormat f : all) {
    EXPECT_EQ(parse_formats(export_format_name(f)), std::vector<ExportFormat>{f});
  }
}

TEST(ParseFormats, UnknownOrEmptyNamesListTheValidOnes) {
  for (const char* bad : {"summary,pdf", "", "csv,,html", "Summary"}) {
    try {
      parse_formats(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      for (const char* valid : {"summary", "csv", "trace", "pickle", "html", "all"}) {
        EXPECT_NE(m.find(valid), std::string::npos) << m;
      }
    }
  }
}

TEST(FormatNames, FileNamesAreTheDocumentedOnes) {
  EXPECT_STREQ(export_file_name(ExportFormat::kSummary), "summary.json");
  EXPECT_STREQ(export_file_name(ExportFormat::kCsv), "timeline.csv");
  EXPECT_STREQ(export_file_name(ExportFormat::kTrace), "trace.json");
  EXPECT_STREQ(export_file_name(ExportFormat::kPickle), "snapshot.pickle");
  EXPECT_STREQ(export_file_name(ExportFormat::kHtml), "report.html");
  EXPECT_STREQ(gpu_activity_kind_name(GpuActivityKind::kMemcpy), "memcpy");
  EXPECT_STREQ(gpu_activity_kind_name(GpuActivityKind::kMarker), "marker");
}

TEST(SeeMemoryUsage, MatchesDeepSpeedsRounding) {
  constexpr std::int64_t kGiB = std::int64_t{1} << 30;
  AllocatorStats s;
  EXPECT_EQ(see_memory_usage_line(s), "MA 0.0 GB Max_MA 0.0 GB CA 0.0 GB Max_CA 0 GB");
  s.allocated_bytes[kStatAll].current = kGiB + kGiB / 2;       // 1.5
  s.allocated_bytes[kStatAll].peak = 2 * kGiB + kGiB / 4;      // 2.25
  s.reserved_bytes[kStatAll].current = 3 * kGiB + kGiB / 100;  // 3.01 (3.0099999...)
  s.reserved_bytes[kStatAll].peak = 2 * kGiB + kGiB / 2;       // round(2.5) == 2 in Python
  EXPECT_EQ(see_memory_usage_line(s), "MA 1.5 GB Max_MA 2.25 GB CA 3.01 GB Max_CA 2 GB");
  s.reserved_bytes[kStatAll].peak = 3 * kGiB + kGiB / 2;  // round(3.5) == 4
  EXPECT_NE(see_memory_usage_line(s).find("Max_CA 4 GB"), std::string::npos);
}

TEST(MakeReport, TakesTheAllocatorsStatsSnapshotAndConfig) {
  HostProvider host;
  CachingAllocator alloc(host);
  void* a = alloc.allocate_raw(3000, Category::kActivation, kDefaultStream, "x");
  void* b = alloc.allocate_raw(5 << 20, Category::kParameter, kDefaultStream, "w");
  alloc.free(a);
  Recording rec;
  rec.peak.allocated = 123;
  const ProfileReport r = make_report(rec, alloc, "m", "cpu");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.backend, "cpu");
  EXPECT_EQ(r.recording.peak.allocated, 123u);
  EXPECT_EQ(r.stats.as_map(), alloc.stats().as_map());
  EXPECT_EQ(r.config.to_string(), alloc.config().to_string());
  EXPECT_EQ(r.snapshot.segments.size(), alloc.snapshot().segments.size());
  EXPECT_GE(r.snapshot.segments.size(), 2u);
  alloc.free(b);
}

TEST(ExportReport, WritesEachFormatAndReturnsThePathsInOrder) {
  const std::string dir = temp_dir("export") + "/new/sub";
  const ProfileReport r = sample_report();
  const std::vector<std::string> written = export_report(r, dir, parse_formats("html,summary,csv"));
  ASSERT_EQ(written, (std::vector<std::string>{dir + "/report.html", dir + "/summary.json",
                                               dir + "/timeline.csv"}));
  EXPECT_EQ(slurp(written[0]), report_html(r));
  EXPECT_EQ(slurp(written[1]), summary_json(r));
  EXPECT_EQ(slurp(written[2]), timeline_csv(r));
  EXPECT_FALSE(fs::exists(dir + "/trace.json"));
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) entries += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(entries, 3u);  // nothing else: no temporaries, no probe
}

TEST(ExportReport, BadInputWritesNothing) {
  const std::string dir = temp_dir("bad");
  EXPECT_THROW(export_report(sample_report(), dir + "/out", {}), InvalidArgument);
  EXPECT_FALSE(fs::exists(dir + "/out"));
  std::ofstream(dir + "/afile") << "x";
  try {
    export_report(sample_report(), dir + "/afile", parse_formats("summary"));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/afile"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(dir + "/afile"), "x");
  EXPECT_THROW(export_report(sample_report(), "/proc/memfit-out", parse_formats("summary")),
               InvalidArgument);
}

// An earlier report in the directory survives an export that fails part-way: the failing file
// leaves nothing behind and files not yet reached keep their old contents.
TEST(ExportReport, AFailingExportLeavesTheEarlierReportWhole) {
  const std::string dir = temp_dir("keep");
  ProfileReport old_report = sample_report("old_block");
  export_report(old_report, dir, parse_formats("summary,csv"));
  const std::string old_summary = slurp(dir + "/summary.json");
  const std::string old_csv = slurp(dir + "/timeline.csv");
  fs::create_directory(dir + "/trace.json");  // the fault: trace.json cannot be replaced

  ProfileReport new_report = sample_report("new_block");
  new_report.steps = 7;
  try {
    export_report(new_report, dir, parse_formats("trace,summary,csv"));
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("trace.json"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(dir + "/summary.json"), old_summary);
  EXPECT_EQ(slurp(dir + "/timeline.csv"), old_csv);
  EXPECT_TRUE(fs::is_directory(dir + "/trace.json"));
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }

  // Files written before the failure are complete (the new report), the rest untouched.
  try {
    export_report(new_report, dir, parse_formats("summary,trace,csv"));
    FAIL() << "expected IoError";
  } catch (const IoError&) {
  }
  EXPECT_EQ(slurp(dir + "/summary.json"), summary_json(new_report));
  EXPECT_EQ(slurp(dir + "/timeline.csv"), old_csv);
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// The report of a real allocator watched by a real Recorder: its figures are the allocator's.
TEST(ReportFromRecorder, SummaryFiguresEqualTheAllocatorsStats) {
  HostProvider host;
  CachingAllocator alloc(host);
  Recorder rec(alloc);
  std::vector<void*> keep;
  {
    ScopedRange step(RangeKind::kStep, "step 1");
    {
      ScopedRange fwd(RangeKind::kForward);
      ScopedRange block(RangeKind::kBlock, "h0");
      keep.push_back(alloc.allocate_raw(3 << 20, Category::kActivation, kDefaultStream, "act"));
      void* tmp = alloc.allocate_raw(700 << 10, Category::kTemporary, kDefaultStream, "tmp");
      alloc.free(tmp);
    }
    {
      ScopedRange bwd(RangeKind::kBackward);
      ScopedRange block(RangeKind::kBlock, "h1");
      keep.push_back(alloc.allocate_raw(5 << 20, Category::kGradient, kDefaultStream, "g"));
    }
    alloc.free(keep[0]);
  }
  rec.stop();
  ProfileReport r = make_report(rec.recording(), alloc, "real", "cpu");
  const AllocatorStats s = alloc.stats();
  const nlohmann::json j = nlohmann::json::parse(summary_json(r));
  EXPECT_EQ(j["peak_allocated_bytes"].get<std::int64_t>(), s.allocated_bytes[kStatAll].peak);
  EXPECT_EQ(j["peak_reserved_bytes"].get<std::int64_t>(), s.reserved_bytes[kStatAll].peak);
  EXPECT_EQ(j["end"]["allocated_bytes"].get<std::int64_t>(), s.allocated_bytes[kStatAll].current);
  EXPECT_EQ(j["end"]["reserved_bytes"].get<std::int64_t>(), s.reserved_bytes[kStatAll].current);
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const char* name = category_name(static_cast<Category>(c));
    EXPECT_EQ(j["end"]["by_category"][name].get<std::int64_t>(), s.category_bytes[c].current)
        << name;
  }
  using StatMap = std::map<std::string, std::int64_t>;
  EXPECT_EQ(j["allocator_stats"].get<StatMap>(), s.as_map());
  EXPECT_EQ(j["see_memory_usage"], see_memory_usage_line(s));
  EXPECT_EQ(j["peak"]["phase"], "backward");  // 3 MiB + 5 MiB live, in block h1
  EXPECT_EQ(j["peak"]["block"], "h1");
  EXPECT_EQ(j["peak"]["top_blocks"][0]["block"], "h1");

  // The CSV's and the trace's totals walk to the same figures.
  const auto rows = exporttest::parse_csv(timeline_csv(r));
  ASSERT_GT(rows.size(), 1u);
  std::int64_t csv_peak = 0;
  const std::size_t allocated = exporttest::column(rows[0], "allocated_bytes");
  const std::size_t reserved = exporttest::column(rows[0], "reserved_bytes");
  for (std::size_t i = 1; i < rows.size(); ++i) {
    csv_peak = std::max<std::int64_t>(csv_peak, std::stoll(rows[i][allocated]));
  }
  EXPECT_EQ(csv_peak, s.allocated_bytes[kStatAll].peak);
  EXPECT_EQ(std::stoll(rows.back()[reserved]), s.reserved_bytes[kStatAll].current);
  alloc.free(keep[1]);
}

}  // namespace
}  // namespace memfit
