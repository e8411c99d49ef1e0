// `memfit replay` end to end: the committed PyTorch-layout snapshot in table and JSON form,
// a memfit text trace, a malicious pickle refused with the clear error (exit 2, nothing run),
// a missing file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "profiler/pickle.h"
#include "tests/cli/cli_testutil.h"

namespace {

using namespace memfit::clitest;  // NOLINT: test helpers

const std::string kFixture =
    std::string(MEMFIT_TEST_SOURCE_DIR) + "/tests/profiler/data/torch_snapshot.pickle";

std::string tmp(const std::string& name) {
  return testing::TempDir() + "replay_cli_" + std::to_string(::getpid()) + "_" + name;
}

TEST(ReplayCommand, SnapshotJsonHasTheFixturesFigures) {
  const ProgramRun r = run_memfit("replay " + kFixture + " --format json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["kind"], "snapshot");
  // scripts/make_snapshot_fixture.py prints these.
  EXPECT_EQ(j["replay"]["peak_live_bytes"], 13688608);
  EXPECT_EQ(j["file_segments"]["reserved_bytes"], 23068672);
  EXPECT_EQ(j["file_segments"]["trace_peak_reserved_bytes"], 23068672);
  EXPECT_EQ(j["file_segments"]["num_segments"], 2);
  EXPECT_EQ(j["file_segments"]["largest_segment_bytes"], 20971520);
  EXPECT_EQ(j["import"]["num_initially_live"], 3);
  EXPECT_EQ(j["import"]["num_ooms"], 1);
  const std::int64_t reserved = j["replay"]["peak_reserved_bytes"];
  EXPECT_GE(reserved, 13688608);
  EXPECT_NEAR(j["replay"]["reserved_over_live"].get<double>(), double(reserved) / 13688608.0, 1e-9);
  EXPECT_GT(j["replay"]["provider_allocs"].get<std::int64_t>(), 0);
}

TEST(ReplayCommand, AllocConfChangesTheReplay) {
  // Rounding to powers of two can only grow what is reserved for the same requests.
  const ProgramRun plain = run_memfit("replay " + kFixture + " --format json", false);
  const ProgramRun pow2 = run_memfit(
      "replay " + kFixture + " --format json --alloc-conf roundup_power2_divisions:1", false);
  ASSERT_EQ(pow2.exit_code, 0) << pow2.output;
  const auto a = nlohmann::json::parse(plain.output), b = nlohmann::json::parse(pow2.output);
  EXPECT_EQ(b["alloc_conf"], "roundup_power2_divisions:1");
  EXPECT_GE(b["replay"]["peak_allocated_bytes"].get<std::int64_t>(),
            a["replay"]["peak_allocated_bytes"].get<std::int64_t>());
  EXPECT_EQ(run_memfit("replay " + kFixture + " --alloc-conf bogus:1").exit_code, 2);
}

// Settings the user did not choose: the other allocator mode is replayed too, and the better
// of the two named; a user's --alloc-conf is replayed alone.
TEST(ReplayCommand, TheOtherAllocatorModeIsWeighedUnlessTheUserChose) {
  const ProgramRun r = run_memfit("replay " + kFixture + " --format json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_TRUE(j.contains("other_mode")) << r.output;
  EXPECT_EQ(j["other_mode"]["alloc_conf"], "expandable_segments:True");
  const std::int64_t fixed = j["replay"]["peak_reserved_bytes"];
  const std::int64_t expandable = j["other_mode"]["replay"]["peak_reserved_bytes"];
  EXPECT_EQ(expandable % (2 << 20), 0) << "whole 2 MiB pages";
  EXPECT_EQ(j["other_mode"]["replay"]["peak_live_bytes"], j["replay"]["peak_live_bytes"]);

  const ProgramRun table = run_memfit("replay " + kFixture);
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_TRUE(contains(table.output, "other mode, expandable_segments:True: reserved peak"))
      << table.output;
  EXPECT_TRUE(contains(table.output, expandable < fixed
                                         ? "memfit's pick for this workload: "
                                           "MEMFIT_ALLOC_CONF='expandable_segments:True'"
                                         : "memfit's pick for this workload: MEMFIT_ALLOC_CONF=''"))
      << table.output;

  const ProgramRun chosen = run_memfit("replay " + kFixture + " --alloc-conf ''");
  ASSERT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_FALSE(contains(chosen.output, "other mode")) << chosen.output;
  EXPECT_FALSE(contains(chosen.output, "memfit's pick")) << chosen.output;
}

TEST(ReplayCommand, SnapshotTable) {
  const ProgramRun r = run_memfit("replay " + kFixture);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"memory_viz snapshot", "reserved peak", "live peak", "reserved peak / live",
                        "provider allocs/frees", "13.05 MiB", "22.00 MiB", "largest segment"}) {
    EXPECT_TRUE(contains(r.output, s)) << s << "\n" << r.output;
  }
}

// A snapshot recorded with expandable segments on two devices, each with a run of releases.
std::string expandable_two_device_snapshot() {
  using memfit::PickleValue;
  auto entry = [](const char* action, std::int64_t addr, std::int64_t size) {
    return PickleValue::dict()
        .add("action", PickleValue::str(action))
        .add("addr", PickleValue::integer(addr))
        .add("size", PickleValue::integer(size))
        .add("stream", PickleValue::integer(0));
  };
  const std::int64_t mib = 1 << 20, base = std::int64_t{1} << 40;
  PickleValue trace = PickleValue::list();
  trace.append(entry("segment_map", base, 8 * mib));
  trace.append(entry("alloc", base, 8 * mib));
  trace.append(entry("free_completed", base, 8 * mib));
  trace.append(entry("segment_unmap", base, 8 * mib));
  trace.append(entry("segment_map", base, 4 * mib));
  trace.append(entry("alloc", base, 4 * mib));
  trace.append(entry("free_completed", base, 4 * mib));
  const PickleValue settings =
      PickleValue::dict()
          .add("PYTORCH_CUDA_ALLOC_CONF", PickleValue::str("expandable_segments:True"))
          .add("max_split_size", PickleValue::integer(-1))
          .add("expandable_segments", PickleValue::boolean(true));
  const PickleValue snap = PickleValue::dict()
                               .add("segments", PickleValue::list())
                               .add("device_traces", PickleValue::list({trace, trace}))
                               .add("allocator_settings", settings);
  return memfit::write_pickle(snap);
}

TEST(ReplayCommand, ExpandableSnapshotReplaysEachDeviceLikeForLike) {
  const std::string path = tmp("expandable.pickle");
  std::ofstream(path, std::ios::binary) << expandable_two_device_snapshot();
  const ProgramRun r = run_memfit("replay " + path + " --format json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_TRUE(j.is_array()) << r.output;
  ASSERT_EQ(j.size(), 2u);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(j[d]["import"]["device"], d);
    EXPECT_EQ(j[d]["alloc_conf"], "expandable_segments:True");
    EXPECT_EQ(j[d]["alloc_conf_source"], "the trace");
    EXPECT_EQ(j[d]["import"]["num_segment_maps"], 2);
    EXPECT_EQ(j[d]["import"]["num_segment_unmaps"], 1);
    EXPECT_EQ(j[d]["import"]["num_empty_cache"], 1);
    EXPECT_EQ(j[d]["pytorch"]["expandable_segments"], true);
    EXPECT_EQ(j[d]["pytorch"]["alloc_conf"], "expandable_segments:True");
    EXPECT_EQ(j[d]["pytorch"]["reserved_peak_bytes"], 8 << 20);  // map 8, unmap 8, map 4
    EXPECT_LE(j[d]["replay"]["peak_reserved_bytes"].get<std::int64_t>(), 8 << 20);
  }
  // --alloc-conf, even empty, is the user's choice; --device picks one device.
  const ProgramRun dflt =
      run_memfit("replay " + path + " --format json --device 1 --alloc-conf ''", false);
  ASSERT_EQ(dflt.exit_code, 0) << dflt.output;
  const nlohmann::json one = nlohmann::json::parse(dflt.output);
  ASSERT_TRUE(one.is_object());
  EXPECT_EQ(one["import"]["device"], 1);
  EXPECT_EQ(one["alloc_conf"], "");
  EXPECT_EQ(one["alloc_conf_source"], "--alloc-conf");

  const ProgramRun table = run_memfit("replay " + path);
  ASSERT_EQ(table.exit_code, 0) << table.output;
  for (const char* s :
       {"device 0 (of 2 with traces)", "device 1 (of 2 with traces)",
        "PyTorch's run:    PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True', expandable "
        "segments (allocator_settings['expandable_segments'])",
        "memfit's replay:  expandable_segments:True (from the trace",
        "segment releases: 1 segment_free/segment_unmap entries in 1 run -> one empty_cache",
        "PyTorch (file)", "memfit / PyTorch", "segment map / unmap"}) {
    EXPECT_TRUE(contains(table.output, s)) << s << "\n" << table.output;
  }
  ::unlink(path.c_str());
}

TEST(ReplayCommand, TextTrace) {
  const std::string path = tmp("trace.txt");
  std::ofstream(path) << "# two steps\nstep 0\nalloc 1 1048576 parameter 0 w\nalloc 2 4096 "
                         "activation 0 a\nfree 2\nstep 1\nalloc 3 4096 activation 0 a\nfree 3\n";
  const ProgramRun r = run_memfit("replay " + path + " --format json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["kind"], "trace");
  EXPECT_TRUE(j["file_segments"].is_null());
  EXPECT_EQ(j["replay"]["peak_live_bytes"], 1048576 + 4096);
  EXPECT_EQ(j["replay"]["has_steady_state"], true);
  EXPECT_EQ(j["replay"]["provider_allocs_after_first_step"], 0);  // step 1 reuses the cache
  const ProgramRun table = run_memfit("replay " + path);
  EXPECT_EQ(table.exit_code, 0);
  EXPECT_TRUE(contains(table.output, "after the first step")) << table.output;

  std::ofstream(path) << "alloc 1 10 nonsense 0 x\n";
  const ProgramRun bad = run_memfit("replay " + path);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(contains(bad.output, "trace.txt:1:")) << bad.output;
  ::unlink(path.c_str());
}

TEST(ReplayCommand, MaliciousPickleIsRefusedAndNothingRuns) {
  const std::string marker = tmp("pwned");
  const std::string path = tmp("evil.pickle");
  // pickle.dumps of an object whose __reduce__ is (os.system, ('touch MARKER',)), protocol 2.
  const std::string cmd = "touch " + marker;
  std::string p = std::string("\x80\x02") + "cposix\nsystem\nq\x00X";
  p += std::string(1, char(cmd.size())) + std::string(3, '\0') + cmd + "q\x01\x85q\x02Rq\x03.";
  std::ofstream(path, std::ios::binary) << p;
  const ProgramRun r = run_memfit("replay " + path);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const char* s : {"evil.pickle", "byte 2", "GLOBAL", "plain data only"}) {
    EXPECT_TRUE(contains(r.output, s)) << s << "\n" << r.output;
  }
  EXPECT_NE(::access(marker.c_str(), F_OK), 0) << "the payload ran";

  std::ofstream(path, std::ios::binary) << std::string("\x80\x02]q\x00(K\x01", 8);  // truncated
  const ProgramRun cut = run_memfit("replay " + path);
  EXPECT_EQ(cut.exit_code, 2);
  EXPECT_TRUE(contains(cut.output, "without a STOP")) << cut.output;
  ::unlink(path.c_str());
}

TEST(ReplayCommand, ValidPickleThatIsNoSnapshot) {
  const std::string path = tmp("list.pickle");
  std::ofstream(path, std::ios::binary) << std::string("\x80\x02}q\x00.", 6);  // {}
  const ProgramRun r = run_memfit("replay " + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "no key 'segments'")) << r.output;
  ::unlink(path.c_str());
}

TEST(ReplayCommand, MissingFile) {
  const ProgramRun r = run_memfit("replay /nonexistent/snapshot.pickle");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "/nonexistent/snapshot.pickle")) << r.output;
  EXPECT_TRUE(contains(r.output, "cannot open")) << r.output;
  EXPECT_EQ(run_memfit("replay " + kFixture + " --format yaml").exit_code, 2);
}

// Protocols 0 and 1 have no PROTO header: the file is recognized as a pickle by not being a
// trace and ending in STOP, and read (it was parsed as a text trace: "unknown operation").
TEST(ReplayCommand, ProtocolZeroAndOnePicklesAreReadAsPickles) {
  // {"segments": [], "device_traces": [[]]}: protocol 0 text opcodes, then the same in
  // protocol 1's binary ones.
  const std::string p0 = "(dp0\nVsegments\np1\n(lp2\nsVdevice_traces\np3\n(lp4\n(lp5\nas.";
  const std::string p1 = std::string(
      "}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\x0d\x00\x00\x00"
      "device_tracesq\x03]q\x04]q\x05"
      "au.",
      51);
  for (const auto& [name, bytes] :
       {std::pair<std::string, std::string>{"p0.pickle", p0}, {"p1.pickle", p1}}) {
    const std::string path = tmp(name);
    std::ofstream(path, std::ios::binary) << bytes;
    const ProgramRun r = run_memfit("replay " + path + " --format json", false);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "\"snapshot\"")) << r.output;
    ::unlink(path.c_str());
  }
}

// A trace with CRLF line endings replays as the same trace with LF ("step number '1' is not a
// non-negative integer" before).
TEST(ReplayCommand, CrlfTraceReplays) {
  const std::string path = tmp("crlf.trace");
  std::ofstream(path, std::ios::binary)
      << "# crlf\r\nalloc 1 4096 activation 0 h0\r\nstep 1\r\nfree 1\r\n";
  const ProgramRun r = run_memfit("replay " + path + " --format json", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["replay"]["peak_live_bytes"], 4096);
  ::unlink(path.c_str());
}

// /dev/zero (or a FIFO, a directory) is refused by what it is; it was read until OOM-killed.
TEST(ReplayCommand, EndlessAndNonRegularFilesAreRefusedByName) {
  const ProgramRun zero = run_memfit("replay /dev/zero");
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_TRUE(contains(zero.output, "replay file '/dev/zero': is a character device"))
      << zero.output;
  const std::string dir = tmp("dir");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  const ProgramRun d = run_memfit("replay " + dir);
  EXPECT_EQ(d.exit_code, 2);
  EXPECT_TRUE(contains(d.output, "is a directory")) << d.output;
  ::rmdir(dir.c_str());
}

}  // namespace
