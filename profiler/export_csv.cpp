// timeline.csv: one row per kept allocator event (profiler/report.h), RFC 4180 quoting.
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
  out.reserve(64 + rec.events.size() * 64);
  out += "time_ms";
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    out += ',';
    out += category_name(static_cast<Category>(c));
  }
  out += ",allocated,reserved,phase,block\n";

  CategoryBytes running = rec.base_by_category;
  for (const TimelineEvent& e : rec.events) {
    std::size_t& cat = running[category_index(e.category)];
    if (e.kind == EventKind::kAlloc) cat += e.size;
    if (e.kind == EventKind::kFreeRequested) cat = cat >= e.size ? cat - e.size : 0;
    char t[40];
    std::snprintf(t, sizeof t, "%.6f", static_cast<double>(e.time_ns - rec.start_ns) / 1e6);
    out += t;
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      out += ',';
      append_number(out, running[c]);
    }
    out += ',';
    append_number(out, e.allocated);
    out += ',';
    append_number(out, e.reserved);
    out += ',';
    append_field(out, interned_name(e.phase));
    out += ',';
    append_field(out, interned_name(e.block));
    out += '\n';
  }
  return out;
}

}  // namespace memfit
