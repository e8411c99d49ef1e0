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
  std::string format = "table";
  int device = -1;
};

struct Loaded {
  AllocTrace trace;
  std::optional<ImportedSnapshot> snapshot;  // without its trace (moved out)
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

Loaded load(const std::string& path, int device) {
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
  Loaded out;
  if (is_pickle(text)) {
    ImportedSnapshot s;
    try {
      s = import_snapshot(read_pickle(text, path, limits), path, device);
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      if (what.find("choose one") == std::string::npos) throw;
      throw InvalidArgument(what + " with --device N");
    }
    out.trace = std::move(s.trace);
    out.snapshot = std::move(s);
  } else {
    if (device >= 0)
      throw InvalidArgument("--device applies to snapshots; " + path + " is a trace");
    if (text.size() > kMaxTraceFileBytes) {
      throw InvalidArgument(path + ": " + std::to_string(text.size()) +
                            " bytes, over the limit of " + limit_text(kMaxTraceFileBytes) +
                            " for a text trace; valid: a trace of at most that");
    }
    out.trace = parse_trace(text, path);
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

int run_replay(const ReplayArgs& a) {
  if (a.format != "table" && a.format != "json") {
    throw InvalidArgument("--format '" + a.format + "': valid values are table, json");
  }
  const AllocatorConfig conf = parse_alloc_conf(a.alloc_conf);  // before the (long) load
  const Loaded in = load(a.file, a.device);
  NullProvider null;
  CachingAllocator alloc(null, conf);
  const ReplayResult r = replay(in.trace, alloc);

  if (a.format == "json") {
    nlohmann::json j = {{"file", a.file},
                        {"kind", in.snapshot ? "snapshot" : "trace"},
                        {"alloc_conf", conf.to_string()},
                        {"replay", replay_json(r)},
                        {"file_segments", nullptr},
                        {"import", nullptr}};
    if (in.snapshot) {
      const ImportedSnapshot& s = *in.snapshot;
      const SnapshotSegmentsSummary& g = s.segments;
      j["file_segments"] = {{"num_segments", g.num_segments},
                            {"reserved_bytes", g.reserved_bytes},
                            {"allocated_bytes", g.allocated_bytes},
                            {"active_bytes", g.active_bytes},
                            {"requested_bytes", g.requested_bytes},
                            {"num_active_blocks", g.num_active_blocks},
                            {"largest_segment_bytes", g.largest_segment_bytes},
                            {"trace_peak_reserved_bytes", g.trace_peak_reserved_bytes},
                            {"trace_start_reserved_bytes", g.trace_start_reserved_bytes}};
      j["import"] = {{"device", s.device},
                     {"num_entries", s.num_entries},
                     {"num_allocs", s.num_allocs},
                     {"num_frees", s.num_frees},
                     {"num_initially_live", s.num_initially_live},
                     {"num_ooms", s.num_ooms},
                     {"ignored_entries", s.ignored_entries},
                     {"legacy", s.legacy}};
    }
    say("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }

  say("memfit replay %s (%s", a.file.c_str(), in.snapshot ? "memory_viz snapshot" : "memfit trace");
  if (in.snapshot) {
    const ImportedSnapshot& s = *in.snapshot;
    say(", device %d: %zu trace entries -> %zu allocations, %zu frees, %zu live at the start",
        s.device, s.num_entries, s.num_allocs, s.num_frees, s.num_initially_live);
  }
  say(")\nallocator: %s\n\n", conf.to_string().empty() ? "defaults" : conf.to_string().c_str());
  const char* file_col = in.snapshot ? "file" : "";
  say("%-24s %18s %18s\n", "", "memfit replay", file_col);
  auto row = [&](const char* name, const std::string& mine, const std::string& theirs) {
    say("%-24s %18s %18s\n", name, mine.c_str(), theirs.c_str());
  };
  const SnapshotSegmentsSummary* g = in.snapshot ? &in.snapshot->segments : nullptr;
  auto fb = [](std::size_t b) { return format_bytes(b); };
  row("reserved peak", fb(r.peak_reserved_bytes),
      g && g->trace_peak_reserved_bytes ? fb(g->trace_peak_reserved_bytes) : "");
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
  row("OOMs", std::to_string(r.num_ooms), in.snapshot ? std::to_string(in.snapshot->num_ooms) : "");
  if (g) {
    row("segments", "", std::to_string(g->num_segments));
    row("largest segment", "", fb(g->largest_segment_bytes));
    row("allocated at end", "", fb(g->allocated_bytes));
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
                  "allocator settings, MEMFIT_ALLOC_CONF syntax (default: the variable)");
  cmd->add_option("--format", a->format, "table | json")->capture_default_str();
  cmd->add_option("--device", a->device,
                  "the device of a multi-device snapshot (default: the one with a trace)");
  cmd->callback([a, &exit_code] {
    if (a->alloc_conf.empty()) {
      if (const char* env = std::getenv("MEMFIT_ALLOC_CONF")) a->alloc_conf = env;
    }
    exit_code = run_replay(*a);
  });
}

}  // namespace memfit::cli
