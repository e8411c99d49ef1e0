// `memfit profile` and `memfit train --report` end to end: run the built program on a small
// model, parse every file it wrote, and check that bad input exits 2 and writes nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "tests/cli/cli_testutil.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace memfit::clitest;  // NOLINT: test helpers

std::string tmp(const std::string& name) {
  return testing::TempDir() + "profile_cli_" + std::to_string(::getpid()) + "_" + name;
}

const std::string kCorpus = std::string(MEMFIT_TEST_SOURCE_DIR) + "/data/corpus.txt";

// A byte-level GPT small enough for a test: 2 blocks of width 32, windows of 32 bytes.
std::string model_file() {
  static const std::string path = [] {
    const std::string p = tmp("model.yaml");
    std::ofstream(p) << "model:\n  kind: gpt\n  name: prof-micro\n  vocab: 256\n  seq_len: 32\n"
                        "  layers: 2\n  hidden: 32\n  heads: 4\n  mlp_ratio: 4\n"
                        "  tied_head: true\n";
    return p;
  }();
  return path;
}

std::string profile_args(const std::string& out) {
  return "profile --model " + model_file() + " --steps 2 --batch 2 --out " + out;
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// Every tag opened is closed in order (void elements aside); no script element but the page's
// own (data-memfit), whose content is skipped.
bool html_balanced(const std::string& html) {
  std::vector<std::string> open;
  for (std::size_t i = html.find('<'); i != std::string::npos; i = html.find('<', i + 1)) {
    if (html.compare(i, 2, "<!") == 0) continue;
    const std::size_t end = html.find('>', i);
    if (end == std::string::npos) return false;
    std::string tag = html.substr(i + 1, end - i - 1);
    const bool closing = !tag.empty() && tag[0] == '/';
    const bool self = !tag.empty() && tag.back() == '/';
    std::string name =
        tag.substr(closing ? 1 : 0, tag.find_first_of(" />", closing ? 1 : 0) - (closing ? 1 : 0));
    if (name == "script" && !closing) {
      if (tag.find("data-memfit") == std::string::npos) return false;
      const std::size_t close = html.find("</script>", end);
      if (close == std::string::npos) return false;
      i = close + 8;
      continue;
    }
    if (name == "meta" || self) continue;
    if (closing) {
      if (open.empty() || open.back() != name) return false;
      open.pop_back();
    } else {
      open.push_back(name);
      if (name == "style") i = html.find("</style>", i) - 1;
    }
  }
  return open.empty();
}

void check_report(const std::string& dir, const std::string& output) {
  EXPECT_EQ(files_in(dir), (std::set<std::string>{"summary.json", "timeline.csv", "trace.json",
                                                  "snapshot.pickle", "report.html"}));
  const json summary = json::parse(read_file(dir + "/summary.json"));
  EXPECT_EQ(summary["model"], "prof-micro");
  EXPECT_EQ(summary["backend"], "cpu");
  EXPECT_EQ(summary["steps"], 2);
  EXPECT_GT(summary["peak_allocated_bytes"].get<std::int64_t>(), 0);
  // Recorded from the allocator's creation: the whole run's peaks are the allocator's own; the
  // headline is the steps' (setup excluded), never above them.
  EXPECT_EQ(summary["run_peak"]["allocated_bytes"],
            summary["allocator_stats"]["allocated_bytes.all.peak"]);
  EXPECT_EQ(summary["run_peak"]["reserved_bytes"],
            summary["allocator_stats"]["reserved_bytes.all.peak"]);
  EXPECT_EQ(summary["peak"]["of"], "steps");
  EXPECT_LE(summary["peak_allocated_bytes"].get<std::int64_t>(),
            summary["run_peak"]["allocated_bytes"].get<std::int64_t>());
  EXPECT_EQ(summary["dropped"]["events"], 0);
  EXPECT_TRUE(contains(output, summary["see_memory_usage"].get<std::string>())) << output;
  EXPECT_TRUE(contains(output, dir)) << output;

  const std::string csv = read_file(dir + "/timeline.csv");
  EXPECT_EQ(csv.rfind("time_ms,event,size_bytes,category,tensor,step,micro_batch,phase,block,", 0),
            0u);
  EXPECT_GT(std::count(csv.begin(), csv.end(), '\n'), 10);

  const json trace = json::parse(read_file(dir + "/trace.json"));
  std::set<std::string> ranges;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") ranges.insert(e["name"].get<std::string>());
  }
  for (const char* want :
       {"setup", "forward", "backward", "embedding", "h.0", "h.1", "head", "optimizer"}) {
    EXPECT_EQ(ranges.count(want), 1u) << want << " missing from trace ranges";
  }

  const std::string pickle = read_file(dir + "/snapshot.pickle");
  ASSERT_GE(pickle.size(), 3u);
  // Protocol 2, or 4 (with frames) once the snapshot is over 64 KiB (export_pickle.h).
  const std::string proto = pickle.substr(0, 2);
  EXPECT_TRUE(proto == std::string("\x80\x02", 2) || proto == std::string("\x80\x04", 2))
      << static_cast<int>(proto[1]) << ", " << pickle.size() << " bytes";
  if (pickle.size() <= 64 * 1024) EXPECT_EQ(proto, std::string("\x80\x02", 2));
  EXPECT_EQ(pickle.back(), '.');                               // STOP

  const std::string html = read_file(dir + "/report.html");
  EXPECT_TRUE(html_balanced(html));
  EXPECT_TRUE(contains(html, "<svg"));
  EXPECT_TRUE(contains(html, "<td>h.1</td>"));
}

TEST(ProfileCommand, WritesEveryFormatAndEachParses) {
  const std::string out = tmp("all") + "/nested/report";
  const ProgramRun r = run_memfit(profile_args(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  check_report(out, r.output);
  EXPECT_FALSE(json::parse(read_file(out + "/summary.json")).contains("plan"));
  fs::remove_all(tmp("all"));
}

TEST(ProfileCommand, FormatsChooseTheFilesAndDataIsOptional) {
  const std::string out = tmp("some");
  const ProgramRun r = run_memfit(profile_args(out) + " --formats csv,summary --data " + kCorpus);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(out), (std::set<std::string>{"summary.json", "timeline.csv"}));
  fs::remove_all(out);
}

TEST(ProfileCommand, PlanVersusMeasuredWithABudget) {
  // Policy flags and a budget: a dry run predicts.
  const std::string out = tmp("budget");
  ProgramRun r = run_memfit(profile_args(out) + " --checkpoint all --budget 256MiB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "plan vs measured")) << r.output;
  json plan = json::parse(read_file(out + "/summary.json"))["plan"];
  EXPECT_GT(plan["predicted_peak_reserved_bytes"].get<std::int64_t>(), 0);
  EXPECT_GT(plan["reserved_ratio"].get<double>(), 0.0);
  EXPECT_TRUE(contains(plan["description"].get<std::string>(), "checkpoint all")) << plan;
  // A budget alone: the planner's plan and its prediction.
  r = run_memfit("profile --model " + model_file() + " --steps 1 --budget 64MiB --out " + out +
                 " --formats summary,html");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  plan = json::parse(read_file(out + "/summary.json"))["plan"];
  EXPECT_TRUE(contains(plan["description"].get<std::string>(), "planner")) << plan;
  EXPECT_TRUE(contains(read_file(out + "/report.html"), "Plan vs measured"));
  fs::remove_all(out);
}

// Everything offloaded under a checkpoint schedule: the report has the pinned host memory by
// category, equal to what the dry run predicted, and the offload's copy ranges in the trace.
TEST(ProfileCommand, OffloadsPinnedHostMemoryIsInTheReportByCategory) {
  const std::string out = tmp("offload");
  const ProgramRun r =
      run_memfit(profile_args(out) + " --dtype bf16 --checkpoint all --offload all --predict");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json s = json::parse(read_file(out + "/summary.json"));
  const json& host = s["host_pinned"];
  const std::size_t peak = host["peak_bytes"].get<std::size_t>();
  EXPECT_GT(peak, 0u);
  EXPECT_EQ(s["plan"]["predicted_host_pinned_bytes"].get<std::size_t>(), peak);
  std::size_t sum = 0;
  for (const char* c : {"optimizer_state", "gradient", "parameter", "activation"}) {
    EXPECT_GT(host["peak_by_category"][c].get<std::size_t>(), 0u) << c;
    sum += host["peak_by_category"][c].get<std::size_t>();
  }
  EXPECT_EQ(sum, peak);
  std::set<std::string> ranges;
  const json trace = json::parse(read_file(out + "/trace.json"));
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") ranges.insert(e["name"].get<std::string>());
  }
  for (const char* n : {"grads_to_host", "weights_to_device", "acts_to_host", "acts_to_device"}) {
    EXPECT_TRUE(ranges.count(n)) << n;
  }
  const std::string html = read_file(out + "/report.html");
  EXPECT_TRUE(contains(html, "Pinned host memory over time"));
  EXPECT_TRUE(contains(html, "data-chart=\"host_timeline\""));
  const std::string csv = read_file(out + "/timeline.csv");
  EXPECT_TRUE(contains(csv.substr(0, csv.find('\n')), ",host_unknown_bytes,host_pinned_bytes"));
  fs::remove_all(out);
}

TEST(ProfileCommand, BadInputExitsTwoAndWritesNothing) {
  const std::string afile = tmp("afile");
  std::ofstream(afile) << "x";
  struct Case {
    std::string args, expect;
  };
  const std::string out = tmp("bad");
  const Case cases[] = {
      {profile_args(out) + " --formats summary,pdf", "pdf"},
      {profile_args(out) + " --formats summary,pdf", "trace"},  // lists the valid names
      {profile_args(out) + " --steps 0", "--steps"},
      {profile_args(out) + " --backend tpu", "cpu, cuda"},
      {profile_args(out) + " --dtype f8", "f8"},
      {"profile --model gpt5 --steps 1 --out " + out, "gpt5"},
      {profile_args(out) + " --data " + tmp("missing.txt"), "missing.txt"},
      {profile_args(afile), afile},
      {profile_args("/proc/memfit-report"), "/proc/memfit-report"},
      {"profile --model " + model_file() + " --steps 1", "--out"},
  };
  for (const Case& c : cases) {
    const ProgramRun r = run_memfit(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.expect)) << c.args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  EXPECT_EQ(read_file(afile), "x");
  fs::remove(afile);
}

#if !MEMFIT_HAVE_CUDA
TEST(ProfileCommand, CudaBackendInACpuBuildSaysWhy) {
  const std::string out = tmp("cuda");
  const ProgramRun r = run_memfit(profile_args(out) + " --backend cuda");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "cuda")) << r.output;
  EXPECT_TRUE(contains(r.output, "--backend cpu")) << r.output;
  EXPECT_FALSE(fs::exists(out));
}
#endif

// A report that cannot be completed leaves the earlier one's files whole: the failing file is
// not replaced and no temporary stays behind.
TEST(ProfileCommand, AFailedExportKeepsTheEarlierReport) {
  const std::string out = tmp("keep");
  ASSERT_EQ(run_memfit(profile_args(out) + " --formats csv").exit_code, 0);
  const std::string old_csv = read_file(out + "/timeline.csv");
  fs::create_directory(out + "/trace.json");  // the fault
  const ProgramRun r = run_memfit(profile_args(out) + " --formats trace,csv");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, out + "/trace.json")) << r.output;
  EXPECT_EQ(read_file(out + "/timeline.csv"), old_csv);
  EXPECT_EQ(files_in(out), (std::set<std::string>{"timeline.csv", "trace.json"}));
  fs::remove_all(out);
}

TEST(TrainReport, TrainWritesTheSameReport) {
  const std::string out = tmp("train");
  const ProgramRun r = run_memfit("train --model " + model_file() + " --data " + kCorpus +
                                  " --steps 2 --batch 2 --report " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "loss")) << r.output;  // still trains and reports as before
  check_report(out, r.output);
  fs::remove_all(out);
}

TEST(TrainReport, BadFormatsOrBackendFailBeforeTraining) {
  const std::string out = tmp("trainbad");
  const std::string base =
      "train --model " + model_file() + " --data " + kCorpus + " --steps 1 --batch 2";
  const std::string extras[] = {" --report " + out + " --formats nope", " --backend gpu",
                                " --formats summary"};  // without --report
  for (const std::string& extra : extras) {
    const ProgramRun r = run_memfit(base + extra);
    EXPECT_EQ(r.exit_code, 2) << extra << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, "step 1/1")) << r.output;  // nothing trained
    EXPECT_FALSE(fs::exists(out));
  }
}

}  // namespace
