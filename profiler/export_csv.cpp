// timeline.csv: one row per kept allocator event and per pinned host region's change
// (profiler/report.h), RFC 4180 quoting.
// Columns: time_ms since the recording's start; event (the allocator's event kind: alloc,
// free_requested, free_completed, segment_alloc, segment_free, oom; or host_pin / host_unpin
// for offload's pinned host regions); size_bytes (the block, segment or region); category
// (none for segment events: a segment has none); tensor (the allocation's tag); step and
// micro_batch (the numbers of the enclosing ranges of those kinds, empty outside them); phase
// (the innermost phase range's kind: setup, step, micro_batch, forward, backward, recompute,
// optimizer, offload; empty outside any); block; then the totals after the event: <category>_bytes,
// allocated_bytes, reserved_bytes, host_<category>_bytes, host_pinned_bytes.
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

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

// The step or micro-batch each moment falls in, from the recording's ranges of that kind (any
// thread; the Trainer opens them on one, one at a time), queried in time order; "" outside
// any. Steps are numbered by the Recorder's count (RangeRecord::ordinal: the Trainer names
// every step "step"), else by their order among the kept ranges; micro-batches by their
// names' number (the Trainer's "micro_batch 2" -> "2").
class Enclosing {
 public:
  Enclosing(const Recording& rec, RangeKind kind, bool ordinal) : ordinal_(ordinal) {
    for (const RangeRecord& g : rec.ranges) {
      if (g.kind == kind) ranges_.push_back(&g);  // by begin time, as the recording keeps them
    }
  }
  std::string at(std::int64_t t) {
    while (next_ < ranges_.size() && ranges_[next_]->begin_ns <= t) open_ = next_++;
    if (open_ == kNone || t > ranges_[open_]->end_ns) return {};
    if (ordinal_) {
      const std::uint32_t n = ranges_[open_]->ordinal;
      return std::to_string(n > 0 ? std::size_t{n} : open_ + 1);
    }
    const std::string_view n = interned_name(ranges_[open_]->name);
    const std::size_t sp = n.rfind(' ');
    return std::string(sp == std::string_view::npos ? n : n.substr(sp + 1));
  }

 private:
  static constexpr std::size_t kNone = ~std::size_t{0};
  bool ordinal_;
  std::vector<const RangeRecord*> ranges_;
  std::size_t next_ = 0;
  std::size_t open_ = kNone;
};

}  // namespace

std::string timeline_csv(const ProfileReport& r) {
  const Recording& rec = r.recording;
  std::string out;
  out.reserve(256 + (rec.events.size() + rec.host_events.size()) * 120);
  out += "time_ms,event,size_bytes,category,tensor,step,micro_batch,phase,block";
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    out += ',';
    out += category_name(static_cast<Category>(c));
    out += "_bytes";
  }
  out += ",allocated_bytes,reserved_bytes";
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    out += ",host_";
    out += category_name(static_cast<Category>(c));
    out += "_bytes";
  }
  out += ",host_pinned_bytes\n";

  // Device events and host regions merged in time order; each row is one event and the
  // totals right after it (a host row repeats the device's totals then, and a device row the
  // host's).
  Enclosing steps(rec, RangeKind::kStep, true), micro_batches(rec, RangeKind::kMicroBatch, false);
  CategoryBytes running = rec.base_by_category;
  CategoryBytes host = rec.host_base;
  std::size_t allocated = rec.base_allocated, reserved = rec.base_reserved;
  std::size_t i = 0, h = 0;
  while (i < rec.events.size() || h < rec.host_events.size()) {
    const bool take_host =
        h < rec.host_events.size() &&
        (i == rec.events.size() || rec.host_events[h].time_ns < rec.events[i].time_ns);
    std::int64_t t = 0;
    std::string_view event, category, tensor, phase, block;
    std::size_t size = 0;
    if (take_host) {
      const HostRegionEvent& e = rec.host_events[h++];
      t = e.time_ns;
      host = e.after;
      event = e.pinned ? "host_pin" : "host_unpin";
      size = e.bytes;
      category = category_name(e.category);
      tensor = interned_name(e.tag);
    } else {
      const TimelineEvent& e = rec.events[i++];
      apply_event(running, e);
      t = e.time_ns;
      allocated = e.allocated;
      reserved = e.reserved;
      event = event_kind_name(e.kind);
      size = e.size;
      category = is_segment_event(e.kind) ? std::string_view() : category_name(e.category);
      tensor = interned_name(e.tag);
      phase = e.phase == 0 ? std::string_view() : range_kind_name(e.phase_kind);
      block = interned_name(e.block);
    }
    char ts[40];
    std::snprintf(ts, sizeof ts, "%.6f", static_cast<double>(t - rec.start_ns) / 1e6);
    out += ts;
    out += ',';
    append_field(out, event);
    out += ',';
    append_number(out, size);
    const std::string step = steps.at(t), micro_batch = micro_batches.at(t);
    for (std::string_view f :
         {category, tensor, std::string_view(step), std::string_view(micro_batch), phase, block}) {
      out += ',';
      append_field(out, f);
    }
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
    out += '\n';
  }
  return out;
}

}  // namespace memfit
