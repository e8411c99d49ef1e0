#include "cli/replay_command.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/terminal_text.h"
#include "memory/alloc_conf.h"
#include "memory/alloc_trace.h"
#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/null_provider.h"
#include "memory/size.h"
#include "memory/trace_replay.h"
#include "profiler/pickle.h"
#include "profiler/read_file.h"
#include "profiler/snapshot_import.h"

namespace memfit::cli {

namespace {

struct ReplayArgs {
  std::string file;
  std::string alloc_conf;
  bool alloc_conf_given = false;  // --alloc-conf on the command line
  std::string format = "table";
  int device = -1;
};

// One trace to replay: a text trace, or one device of a snapshot.
struct Loaded {
  AllocTrace trace;
  std::optional<ImportedSnapshot> snapshot;  // without its trace (moved out)
  std::vector<int> devices;                  // a snapshot's devices with a trace
};

// A memfit text trace: its first line that is not blank or a comment starts with an operation.
bool looks_like_trace(std::string_view text) {
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t nl = std::min(text.find('\n', at), text.size());
    std::string_view l = text.substr(at, nl - at);
    at = nl + 1;
    while (!l.empty() && (l.front() == ' ' || l.front() == '\t' || l.front() == '\r')) {
      l.remove_prefix(1);
    }
    if (l.empty() || l.front() == '#') continue;
    for (std::string_view op : {"alloc", "free", "record_stream", "empty_cache", "step", "phase"}) {
      if (l.substr(0, op.size()) == op && (l.size() == op.size() || l[op.size()] == ' ' ||
                                           l[op.size()] == '\t' || l[op.size()] == '\r')) {
        return true;
      }
    }
    return false;
  }
  return true;  // only blank lines and comments: an empty trace
}

// The file's format by its bytes, not its name: a pickle starts with PROTO (protocols 2-5)
// or, protocols 0 and 1 having no header, is anything that is not a trace and ends in STOP.
bool is_pickle(std::string_view text) {
  if (static_cast<unsigned char>(text.front()) == 0x80) return true;
  return !looks_like_trace(text) && text.back() == '.';
}

// Every device with a trace when `device` < 0 (one Loaded each; one for a snapshot without
// any), else the one named.
std::vector<Loaded> load(const std::string& path, int device) {
  const PickleLimits limits;
  BoundedRead r = try_read_file_bounded(path, limits.max_input_bytes, "replay file");
  if (!r.error.empty()) {
    const std::string valid = " (a memory_viz snapshot pickle or a memfit trace)";
    if (r.refused) throw InvalidArgument(r.error + valid);
    throw IoError(r.error + valid);
  }
  const std::string& text = r.bytes;
  if (text.empty()) {
    throw InvalidArgument(path +
                          ": empty file: expected a memory_viz snapshot pickle or a "
                          "memfit trace");
  }
  std::vector<Loaded> out;
  if (is_pickle(text)) {
    const PickleValue snap = read_pickle(text, path, limits);
    const std::vector<int> devices = traced_devices(snap, path);
    std::vector<int> chosen{device};
    if (device < 0 && devices.size() > 1) chosen = devices;
    for (int d : chosen) {
      Loaded one;
      ImportedSnapshot s = import_snapshot(snap, path, d);
      one.trace = std::move(s.trace);
      one.snapshot = std::move(s);
      one.devices = devices;
      out.push_back(std::move(one));
    }
  } else {
    if (device >= 0)
      throw InvalidArgument("--device applies to snapshots; " + path + " is a trace");
    if (text.size() > kMaxTraceFileBytes) {
      throw InvalidArgument(path + ": " + std::to_string(text.size()) +
                            " bytes, over the limit of " + limit_text(kMaxTraceFileBytes) +
                            " for a text trace; valid: a trace of at most that");
    }
    out.emplace_back().trace = parse_trace(text, path);
  }
  return out;
}

double ratio(std::size_t a, std::size_t b) { return b == 0 ? 0.0 : double(a) / double(b); }

nlohmann::json replay_json(const ReplayResult& r) {
  return {{"num_ops", r.num_ops},
          {"num_allocs", r.num_allocs},
          {"num_steps", r.num_steps},
          {"num_ooms", r.num_ooms},
          {"peak_reserved_bytes", r.peak_reserved_bytes},
          {"peak_allocated_bytes", r.peak_allocated_bytes},
          {"peak_live_bytes", r.peak_live_bytes},
          {"reserved_over_live", r.reserved_over_live},
          {"end_reserved_bytes", r.end_reserved_bytes},
          {"provider_allocs", r.provider_allocs},
          {"provider_frees", r.provider_frees},
          {"has_steady_state", r.has_steady_state},
          {"provider_allocs_after_first_step", r.provider_allocs_after_first_step},
          {"provider_frees_after_first_step", r.provider_frees_after_first_step},
          {"seconds", r.seconds}};
}

// Which allocator settings a replay uses, and why.
struct ConfChoice {
  AllocatorConfig conf;
  std::string source;  // "--alloc-conf", "MEMFIT_ALLOC_CONF", "the trace", "defaults"
};

ConfChoice choose_conf(const ReplayArgs& a, const Loaded& in) {
  if (a.alloc_conf_given) return {parse_alloc_conf(a.alloc_conf), "--alloc-conf"};
  if (!a.alloc_conf.empty()) return {parse_alloc_conf(a.alloc_conf), "MEMFIT_ALLOC_CONF"};
  if (in.snapshot && in.snapshot->recorded.expandable_segments) {
    return {replay_alloc_conf(*in.snapshot), "the trace"};
  }
  return {AllocatorConfig{}, "defaults"};
}

std::string conf_text(const AllocatorConfig& c) {
  const std::string t = c.to_string();
  return t.empty() ? "defaults" : t;
}

// The rules each side used, in words (the table's preamble and the JSON's "rules").
std::string pytorch_rule(const ImportedSnapshot& s) {
  const RecordedAllocator& r = s.recorded;
  std::string t = r.has_settings ? "PYTORCH_CUDA_ALLOC_CONF='" + r.alloc_conf + "'"
                                 : "allocator settings not recorded";
  t += r.expandable_segments ? std::string(", expandable segments (") + r.expandable_evidence + ")"
                             : ", segments (not expandable)";
  return t;
}

std::string memfit_rule(const ConfChoice& c, const Loaded& in) {
  std::string t = conf_text(c.conf) + " (from " + c.source;
  if (c.source == "the trace") t += ": PyTorch's run used expandable segments";
  if (c.source == "defaults" && in.snapshot) t += ": PyTorch's run did not use expandable segments";
  return t + "; --alloc-conf to choose)";
}

std::string release_rule(const ImportedSnapshot& s) {
  const std::size_t n = s.num_segment_frees + s.num_segment_unmaps;
  if (n == 0) return "none in the trace";
  return std::to_string(n) + " segment_free/segment_unmap entries in " +
         std::to_string(s.num_empty_cache) + (s.num_empty_cache == 1 ? " run" : " runs") +
         " -> one empty_cache each (memfit releases its cached free segments there)";
}

nlohmann::json snapshot_json(const ImportedSnapshot& s) {
  const SnapshotSegmentsSummary& g = s.segments;
  return {{"num_segments", g.num_segments},
          {"reserved_bytes", g.reserved_bytes},
          {"allocated_bytes", g.allocated_bytes},
          {"active_bytes", g.active_bytes},
          {"requested_bytes", g.requested_bytes},
          {"num_active_blocks", g.num_active_blocks},
          {"largest_segment_bytes", g.largest_segment_bytes},
          {"trace_peak_reserved_bytes", g.trace_peak_reserved_bytes},
          {"trace_start_reserved_bytes", g.trace_start_reserved_bytes}};
}

nlohmann::json import_json(const ImportedSnapshot& s) {
  return {{"device", s.device},
          {"num_entries", s.num_entries},
          {"num_allocs", s.num_allocs},
          {"num_frees", s.num_frees},
          {"num_initially_live", s.num_initially_live},
          {"num_ooms", s.num_ooms},
          {"num_segment_allocs", s.num_segment_allocs},
          {"num_segment_frees", s.num_segment_frees},
          {"num_segment_maps", s.num_segment_maps},
          {"num_segment_unmaps", s.num_segment_unmaps},
          {"num_empty_cache", s.num_empty_cache},
          {"ignored_entries", s.ignored_entries},
          {"legacy", s.legacy}};
}

nlohmann::json replay_one_json(const ReplayArgs& a, const Loaded& in, const ConfChoice& c,
                               const ReplayResult& r) {
  nlohmann::json j = {{"file", a.file},
                      {"kind", in.snapshot ? "snapshot" : "trace"},
                      {"alloc_conf", c.conf.to_string()},
                      {"alloc_conf_source", c.source},
                      {"replay", replay_json(r)},
                      {"file_segments", nullptr},
                      {"import", nullptr},
                      {"pytorch", nullptr}};
  if (in.snapshot) {
    const ImportedSnapshot& s = *in.snapshot;
    j["file_segments"] = snapshot_json(s);
    j["import"] = import_json(s);
    j["pytorch"] = {{"alloc_conf", s.recorded.has_settings ? nlohmann::json(s.recorded.alloc_conf)
                                                           : nlohmann::json(nullptr)},
                    {"expandable_segments", s.recorded.expandable_segments},
                    {"reserved_peak_bytes", s.segments.trace_peak_reserved_bytes},
                    {"segment_release_rule", release_rule(s)}};
  }
  return j;
}

// A PyTorch snapshot replayed under settings the user did not choose is also replayed in the
// other allocator mode (expandable segments on or off), as the planner weighs both: the
// better of the two is the setting to use for this workload.
struct OtherMode {
  bool ran = false;
  AllocatorConfig conf;
  ReplayResult result;
};

OtherMode other_mode(const Loaded& in, const ConfChoice& c) {
  OtherMode o;
  if (!in.snapshot || (c.source != "defaults" && c.source != "the trace")) return o;
  o.conf = c.conf;
  o.conf.expandable_segments = !c.conf.expandable_segments;
  NullProvider null;
  CachingAllocator alloc(null, o.conf);
  o.result = replay(in.trace, alloc);
  o.ran = true;
  return o;
}

void print_other_mode(const Loaded& in, const ConfChoice& c, const ReplayResult& r,
                      const OtherMode& o) {
  if (!o.ran) return;
  const std::size_t theirs = in.snapshot->segments.trace_peak_reserved_bytes;
  const auto vs = [&](std::size_t b) {
    if (theirs == 0) return std::string();
    char buf[64];
    std::snprintf(buf, sizeof buf, ", %.3f x PyTorch's", ratio(b, theirs));
    return std::string(buf);
  };
  say("\nother mode, %s: reserved peak %s%s, %lld OOMs\n", conf_text(o.conf).c_str(),
      format_bytes(o.result.peak_reserved_bytes).c_str(),
      vs(o.result.peak_reserved_bytes).c_str(), static_cast<long long>(o.result.num_ooms));
  const bool other_better = o.result.num_ooms <= r.num_ooms &&
                            o.result.peak_reserved_bytes < r.peak_reserved_bytes;
  const AllocatorConfig& best = other_better ? o.conf : c.conf;
  const std::size_t best_peak =
      other_better ? o.result.peak_reserved_bytes : r.peak_reserved_bytes;
  say("memfit's pick for this workload: MEMFIT_ALLOC_CONF='%s' (reserved peak %s%s)\n",
      best.to_string().c_str(), format_bytes(best_peak).c_str(), vs(best_peak).c_str());
}

void print_table(const ReplayArgs& a, const Loaded& in, const ConfChoice& c,
                 const ReplayResult& r) {
  say("memfit replay %s (%s", a.file.c_str(), in.snapshot ? "memory_viz snapshot" : "memfit trace");
  if (in.snapshot) {
    const ImportedSnapshot& s = *in.snapshot;
    say(", device %d", s.device);
    if (in.devices.size() > 1) say(" (of %zu with traces)", in.devices.size());
    say(": %zu trace entries -> %zu allocations, %zu frees, %zu live at the start", s.num_entries,
        s.num_allocs, s.num_frees, s.num_initially_live);
  }
  say(")\n");
  if (in.snapshot) {
    say("PyTorch's run:    %s\n", pytorch_rule(*in.snapshot).c_str());
    say("memfit's replay:  %s\n", memfit_rule(c, in).c_str());
    say("segment releases: %s\n\n", release_rule(*in.snapshot).c_str());
  } else {
    say("allocator: %s\n\n", conf_text(c.conf).c_str());
  }
  const char* file_col = in.snapshot ? "PyTorch (file)" : "";
  say("%-24s %18s %18s\n", "", "memfit replay", file_col);
  auto row = [&](const char* name, const std::string& mine, const std::string& theirs) {
    say("%-24s %18s %18s\n", name, mine.c_str(), theirs.c_str());
  };
  const SnapshotSegmentsSummary* g = in.snapshot ? &in.snapshot->segments : nullptr;
  auto fb = [](std::size_t b) { return format_bytes(b); };
  row("reserved peak", fb(r.peak_reserved_bytes),
      g && g->trace_peak_reserved_bytes ? fb(g->trace_peak_reserved_bytes)
                                        : (g ? "(no segment events)" : ""));
  if (g && g->trace_peak_reserved_bytes) {
    char b[64];
    std::snprintf(b, sizeof b, "%.3f", ratio(r.peak_reserved_bytes, g->trace_peak_reserved_bytes));
    row("  memfit / PyTorch", b, "");
  }
  row("reserved at end", fb(r.end_reserved_bytes), g ? fb(g->reserved_bytes) : "");
  row("live peak (requested)", fb(r.peak_live_bytes), "");
  row("allocated peak", fb(r.peak_allocated_bytes), "");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", r.reserved_over_live);
  std::string theirs;
  if (g && g->trace_peak_reserved_bytes) {
    char b2[64];
    std::snprintf(b2, sizeof b2, "%.3f", ratio(g->trace_peak_reserved_bytes, r.peak_live_bytes));
    theirs = b2;
  }
  row("reserved peak / live", buf, theirs);
  row("provider allocs/frees",
      std::to_string(r.provider_allocs) + " / " + std::to_string(r.provider_frees), "");
  if (r.has_steady_state) {
    row("  after the first step",
        std::to_string(r.provider_allocs_after_first_step) + " / " +
            std::to_string(r.provider_frees_after_first_step),
        "");
  }
  if (in.snapshot) {
    const ImportedSnapshot& s = *in.snapshot;
    row("segment alloc / free", "",
        std::to_string(s.num_segment_allocs) + " / " + std::to_string(s.num_segment_frees));
    if (s.num_segment_maps + s.num_segment_unmaps > 0) {
      row("segment map / unmap", "",
          std::to_string(s.num_segment_maps) + " / " + std::to_string(s.num_segment_unmaps));
    }
  }
  row("OOMs", std::to_string(r.num_ooms), in.snapshot ? std::to_string(in.snapshot->num_ooms) : "");
  if (g) {
    row("segments", "", std::to_string(g->num_segments));
    row("largest segment", "", fb(g->largest_segment_bytes));
    row("allocated at end", "", fb(g->allocated_bytes));
  }
}

int run_replay(const ReplayArgs& a) {
  if (a.format != "table" && a.format != "json") {
    throw InvalidArgument("--format '" + a.format + "': valid values are table, json");
  }
  if (!a.alloc_conf.empty()) (void)parse_alloc_conf(a.alloc_conf);  // before the (long) load
  const std::vector<Loaded> all = load(a.file, a.device);
  nlohmann::json list = nlohmann::json::array();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Loaded& in = all[i];
    const ConfChoice c = choose_conf(a, in);
    NullProvider null;
    CachingAllocator alloc(null, c.conf);
    const ReplayResult r = replay(in.trace, alloc);
    const OtherMode o = other_mode(in, c);
    if (a.format == "json") {
      nlohmann::json j = replay_one_json(a, in, c, r);
      if (o.ran) {
        j["other_mode"] = {{"alloc_conf", o.conf.to_string()}, {"replay", replay_json(o.result)}};
      }
      list.push_back(std::move(j));
    } else {
      if (i > 0) say("\n");
      print_table(a, in, c, r);
      print_other_mode(in, c, r, o);
    }
  }
  if (a.format == "json") {
    const nlohmann::json& j = list.size() == 1 ? list[0] : list;
    say("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return 0;
}

}  // namespace

void add_replay_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand(
      "replay",
      "Replay a memory_viz snapshot (PyTorch's or memfit's) or a memfit trace through memfit's "
      "allocator: reserved and live peaks, their ratio, provider calls");
  cmd->add_option("file", a->file, "snapshot pickle or memfit text trace")->required();
  cmd->add_option("--alloc-conf", a->alloc_conf,
                  "allocator settings, MEMFIT_ALLOC_CONF syntax (default: the variable; unset, "
                  "a snapshot recorded with expandable segments replays with "
                  "expandable_segments:True, any other with memfit's defaults; "
                  "--alloc-conf '' forces the defaults)");
  cmd->add_option("--format", a->format, "table | json")->capture_default_str();
  cmd->add_option("--device", a->device,
                  "one device of a multi-device snapshot (default: each device with a trace, "
                  "in turn)");
  cmd->footer(
      "A snapshot's trace is replayed as PyTorch ran it: each run of consecutive segment_free / "
      "segment_unmap entries (torch.cuda.empty_cache(), or PyTorch's release when cudaMalloc "
      "failed) becomes one empty_cache of memfit's cached free segments at that point; "
      "PyTorch's own reserved peak is walked from its segment_alloc/map (+) and "
      "segment_free/unmap (-) entries and printed beside memfit's.");
  cmd->callback([a, cmd, &exit_code] {
    a->alloc_conf_given = cmd->count("--alloc-conf") > 0;
    if (!a->alloc_conf_given) {
      if (const char* env = std::getenv("MEMFIT_ALLOC_CONF")) a->alloc_conf = env;
    }
    exit_code = run_replay(*a);
  });
}

}  // namespace memfit::cli
