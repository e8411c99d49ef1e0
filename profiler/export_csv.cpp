// timeline.csv: one row per kept allocator event and per pinned host region's change
// (profiler/report.h), RFC 4180 quoting.
#include <cstdio>
#include <string>
#include <string_view>

#include "profiler/report.h"

namespace memfit {

namespace {

// Quotes a field when it holds a separator, a quote, a line break or edge blanks (RFC 4180:
// inner quotes doubled).
void append_field(std::string& out, std::string_view s) {
  const bool quote = s.find_first_of(",\"\r\n") != std::string_view::npos ||
                     (!s.empty() && (s.front() == ' ' || s.back() == ' '));
  if (!quote) {
    out += s;
    return;
  }
  out += '"';
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
}

void append_number(std::string& out, std::size_t v) { out += std::to_string(v); }

}  // namespace

std::string timeline_csv(const ProfileReport& r) {
  const Recording& rec = r.recording;
  std::string out;
  out.reserve(64 + (rec.events.size() + rec.host_events.size()) * 80);
  out += "time_ms";
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    out += ',';
    out += category_name(static_cast<Category>(c));
  }
  out += ",allocated,reserved";
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    out += ",host_";
    out += category_name(static_cast<Category>(c));
  }
  out += ",host_pinned,phase,block\n";

  // Device events and host regions merged in time order (a host region's row repeats the
  // device's state then, with no phase or block; a device row repeats the host's).
  CategoryBytes running = rec.base_by_category;
  CategoryBytes host = rec.host_base;
  std::size_t allocated = rec.base_allocated, reserved = rec.base_reserved;
  std::size_t i = 0, h = 0;
  while (i < rec.events.size() || h < rec.host_events.size()) {
    const bool take_host =
        h < rec.host_events.size() &&
        (i == rec.events.size() || rec.host_events[h].time_ns < rec.events[i].time_ns);
    std::int64_t t = 0;
    std::string_view phase, block;
    if (take_host) {
      t = rec.host_events[h].time_ns;
      host = rec.host_events[h++].after;
    } else {
      const TimelineEvent& e = rec.events[i++];
      std::size_t& cat = running[category_index(e.category)];
      if (e.kind == EventKind::kAlloc) cat += e.size;
      if (e.kind == EventKind::kFreeRequested) cat = cat >= e.size ? cat - e.size : 0;
      t = e.time_ns;
      allocated = e.allocated;
      reserved = e.reserved;
      phase = interned_name(e.phase);
      block = interned_name(e.block);
    }
    char ts[40];
    std::snprintf(ts, sizeof ts, "%.6f", static_cast<double>(t - rec.start_ns) / 1e6);
    out += ts;
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      out += ',';
      append_number(out, running[c]);
    }
    out += ',';
    append_number(out, allocated);
    out += ',';
    append_number(out, reserved);
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      out += ',';
      append_number(out, host[c]);
    }
    out += ',';
    append_number(out, total_bytes(host));
    out += ',';
    append_field(out, phase);
    out += ',';
    append_field(out, block);
    out += '\n';
  }
  return out;
}

}  // namespace memfit
