// summary.json: the figures a reader wants first, in one object (profiler/report.h).
#include <nlohmann/json.hpp>
#include <string>

#include "profiler/report.h"

namespace memfit {

namespace {

// Insertion order: the headline figures first, the long stats map last.
using json = nlohmann::ordered_json;

constexpr std::size_t kTopBlocks = 10;

json by_category(const CategoryBytes& bytes) {
  json j = json::object();
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    j[category_name(static_cast<Category>(c))] = bytes[c];
  }
  return j;
}

double ms_since(std::int64_t t_ns, std::int64_t start_ns) {
  return static_cast<double>(t_ns - start_ns) / 1e6;
}

json peak_json(const PeakInfo& p, std::size_t reserved, std::int64_t start_ns) {
  json peak;
  peak["time_ms"] = ms_since(p.time_ns, start_ns);
  peak["allocated_bytes"] = p.allocated;
  peak["reserved_bytes"] = reserved;
  peak["by_category"] = by_category(p.by_category);
  peak["phase"] = std::string(interned_name(p.phase));  // "" outside any phase
  peak["block"] = std::string(interned_name(p.block));  // "" outside any block
  json top = json::array();
  for (std::size_t i = 0; i < p.blocks.size() && i < kTopBlocks; ++i) {
    const BlockBytes& b = p.blocks[i];
    top.push_back({{"block", std::string(interned_name(b.block))}, {"bytes", b.bytes}});
  }
  peak["top_blocks"] = std::move(top);
  peak["blocks_total"] = p.blocks.size();
  return peak;
}

}  // namespace

std::string summary_json(const ProfileReport& r) {
  const Recording& rec = r.recording;
  json j;
  j["format"] = "memfit-profile-summary";
  j["version"] = 2;
  j["model"] = r.model;
  j["backend"] = r.backend;
  j["steps"] = r.steps;
  j["duration_ms"] = ms_since(rec.end_ns, rec.start_ns);
  if (r.device_total_bytes > 0) j["device_total_bytes"] = r.device_total_bytes;

  // The recording's exact peaks (whatever was dropped from the timeline). The headline is the
  // steps' peak (from the first step on; what a plan predicts and `memfit train` prints);
  // run_peak is the whole recording's, setup included.
  const PeakInfo& step = rec.steps_peak();
  j["peak_allocated_bytes"] = step.allocated;
  j["peak_reserved_bytes"] = rec.steps_peak_reserved();
  j["peak"] = peak_json(step, rec.steps_peak_reserved(), rec.start_ns);
  j["peak"]["of"] = rec.has_steps() ? "steps" : "whole run (no step range recorded)";
  j["run_peak"] = peak_json(rec.peak, rec.peak_reserved, rec.start_ns);

  j["end"] = {{"allocated_bytes", rec.current_allocated},
              {"reserved_bytes", rec.current_reserved},
              {"by_category", by_category(rec.current_by_category)}};

  // Offload's pinned host memory (profiler/host_region.h), exact over the whole recording.
  j["host_pinned"] = {{"peak_bytes", rec.host_peak},
                      {"peak_time_ms", ms_since(rec.host_peak_ns, rec.start_ns)},
                      {"peak_by_category", by_category(rec.host_at_peak)},
                      {"end_bytes", total_bytes(rec.host_current)},
                      {"end_by_category", by_category(rec.host_current)}};

  if (r.plan.present) {
    json p;
    p["description"] = r.plan.description;
    p["predicted_peak_reserved_bytes"] = r.plan.predicted_peak_reserved;
    p["predicted_peak_allocated_bytes"] = r.plan.predicted_peak_allocated;
    p["measured_peak_reserved_bytes"] = rec.steps_peak_reserved();
    p["measured_peak_allocated_bytes"] = step.allocated;
    p["predicted_host_pinned_bytes"] = r.plan.predicted_host_pinned;
    p["measured_host_pinned_bytes"] = rec.host_peak;
    // measured / predicted; null when nothing was predicted (a ratio against 0 means nothing).
    p["reserved_ratio"] = r.plan.predicted_peak_reserved > 0
                              ? json(static_cast<double>(rec.steps_peak_reserved()) /
                                     static_cast<double>(r.plan.predicted_peak_reserved))
                              : json(nullptr);
    p["allocated_ratio"] = r.plan.predicted_peak_allocated > 0
                               ? json(static_cast<double>(step.allocated) /
                                      static_cast<double>(r.plan.predicted_peak_allocated))
                               : json(nullptr);
    j["plan"] = std::move(p);
  }

  j["events_kept"] = rec.events.size();
  j["ranges_kept"] = rec.ranges.size();
  j["gpu_activities"] = r.gpu.size();
  j["dropped"] = {{"events", rec.dropped_events},
                  {"ranges", rec.dropped_ranges},
                  {"host_events", rec.dropped_host_events},
                  {"gpu_records", r.gpu_dropped}};
  j["alloc_conf"] = r.config.to_string();
  j["allocator_stats"] = r.stats.as_map();
  j["see_memory_usage"] = see_memory_usage_line(r.stats);
  // Names come from users (YAML specs, tags); replace rather than throw on invalid UTF-8.
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace memfit
