#include "tests/profiler/export_testutil.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <set>

namespace memfit::exporttest {

RecordingBuilder::RecordingBuilder(std::int64_t start_ns) : now_(start_ns) {
  rec_.start_ns = start_ns;
  rec_.end_ns = start_ns;
}

void RecordingBuilder::take(PeakInfo& p, std::int64_t t, std::uint32_t phase,
                            std::uint32_t block) const {
  p.allocated = rec_.current_allocated;
  p.time_ns = t;
  p.by_category = rec_.current_by_category;
  p.phase = phase;
  p.block = block;
  std::map<std::uint32_t, std::size_t> per_block;
  for (const auto& [addr, l] : live_) per_block[l.block] += l.size;
  p.blocks.clear();
  for (const auto& [b, n] : per_block) p.blocks.push_back({b, n});
  std::stable_sort(p.blocks.begin(), p.blocks.end(),
                   [](const BlockBytes& a, const BlockBytes& b) { return a.bytes > b.bytes; });
}

RecordingBuilder& RecordingBuilder::begin_steps() {
  now_ += 1;  // after the last event
  rec_.steps_begin_ns = now_;
  take(rec_.step_peak, now_, intern_name("step 1"), 0);
  rec_.step_peak_reserved = rec_.current_reserved;
  return *this;
}

void RecordingBuilder::push(TimelineEvent e) {
  now_ += 1000;  // 1 us between events
  e.time_ns = now_;
  std::size_t& cat = rec_.current_by_category[category_index(e.category)];
  if (e.kind == EventKind::kAlloc) {
    cat += e.size;
    rec_.current_allocated += e.size;
  } else if (e.kind == EventKind::kFreeRequested) {
    cat -= e.size;
    rec_.current_allocated -= e.size;
  } else if (e.kind == EventKind::kSegmentAlloc) {
    rec_.current_reserved += e.size;
  } else if (e.kind == EventKind::kSegmentFree) {
    rec_.current_reserved -= e.size;
  }
  e.allocated = rec_.current_allocated;
  e.reserved = rec_.current_reserved;
  rec_.peak_reserved = std::max(rec_.peak_reserved, rec_.current_reserved);
  if (rec_.current_allocated > rec_.peak.allocated) take(rec_.peak, e.time_ns, e.phase, e.block);
  if (rec_.has_steps()) {
    rec_.step_peak_reserved = std::max(rec_.step_peak_reserved, rec_.current_reserved);
    if (rec_.current_allocated > rec_.step_peak.allocated) {
      take(rec_.step_peak, e.time_ns, e.phase, e.block);
    }
  }
  rec_.events.push_back(e);
  rec_.end_ns = now_;
}

RecordingBuilder& RecordingBuilder::segment_alloc(std::uintptr_t addr, std::size_t size) {
  segments_[addr] = size;
  TimelineEvent e;
  e.kind = EventKind::kSegmentAlloc;
  e.addr = addr;
  e.size = size;
  push(e);
  return *this;
}

RecordingBuilder& RecordingBuilder::segment_free(std::uintptr_t addr) {
  TimelineEvent e;
  e.kind = EventKind::kSegmentFree;
  e.addr = addr;
  e.size = segments_.at(addr);
  segments_.erase(addr);
  push(e);
  return *this;
}

RecordingBuilder& RecordingBuilder::alloc(std::uintptr_t addr, std::size_t size, Category c,
                                          const std::string& phase, const std::string& block,
                                          RangeKind kind) {
  TimelineEvent e;
  e.kind = EventKind::kAlloc;
  e.addr = addr;
  e.size = size;
  e.category = c;
  e.phase = intern_name(phase);
  e.phase_kind = phase.empty() ? RangeKind::kOther : kind;
  e.block = intern_name(block);
  e.tag = tag_;
  tag_ = 0;
  live_[addr] = {size, c, e.block};
  push(e);
  return *this;
}

RecordingBuilder& RecordingBuilder::free(std::uintptr_t addr) {
  const Live l = live_.at(addr);
  live_.erase(addr);
  TimelineEvent e;
  e.kind = EventKind::kFreeRequested;
  e.addr = addr;
  e.size = l.size;
  e.category = l.category;
  push(e);
  e.kind = EventKind::kFreeCompleted;
  push(e);
  return *this;
}

RecordingBuilder& RecordingBuilder::range(RangeKind kind, const std::string& name,
                                          std::int64_t begin_ns, std::int64_t end_ns,
                                          std::uint64_t thread, int depth) {
  rec_.ranges.push_back({kind, intern_name(name), begin_ns, end_ns, thread, depth});
  return *this;
}

RecordingBuilder& RecordingBuilder::host(Category c, std::size_t bytes, bool pinned) {
  now_ += 10;
  CategoryBytes& after = rec_.host_current;
  std::size_t& b = after[category_index(c)];
  b = pinned ? b + bytes : b - bytes;
  rec_.host_events.push_back({now_, pinned, c, bytes, intern_name("region"), after});
  if (total_bytes(after) > rec_.host_peak) {
    rec_.host_peak = total_bytes(after);
    rec_.host_peak_ns = now_;
    rec_.host_at_peak = after;
  }
  return *this;
}

Recording RecordingBuilder::build() const { return rec_; }

ProfileReport sample_report(const std::string& block_name) {
  RecordingBuilder b;
  const std::int64_t t0 = b.now();
  b.segment_alloc(0x10000, 4 << 20)
      .alloc(0x10000, 1 << 20, Category::kParameter, "", "embedding")
      .alloc(0x110000, 512 << 10, Category::kOptimizerState, "optimizer", "")
      .alloc(0x190000, 1 << 20, Category::kActivation, "forward", block_name)
      .alloc(0x290000, 256 << 10, Category::kTemporary, "forward, \"quoted\"", block_name)
      .free(0x290000)
      .free(0x190000)
      .alloc(0x190000, 512 << 10, Category::kGradient, "backward", "head")
      .free(0x190000);
  b.range(RangeKind::kStep, "step 1", t0 + 500, b.now(), 1, 0)
      .range(RangeKind::kForward, "forward", t0 + 600, t0 + 6000, 1, 1)
      .range(RangeKind::kBlock, block_name, t0 + 700, t0 + 5000, 1, 2);
  ProfileReport r;
  r.model = "gpt-test";
  r.backend = "cpu";
  r.steps = 1;
  r.recording = b.build();
  const Recording& rec = r.recording;
  // Stats as an allocator that served exactly these events would report them.
  r.stats.allocated_bytes[kStatAll].current = static_cast<std::int64_t>(rec.current_allocated);
  r.stats.allocated_bytes[kStatAll].peak = static_cast<std::int64_t>(rec.peak.allocated);
  r.stats.reserved_bytes[kStatAll].current = static_cast<std::int64_t>(rec.current_reserved);
  r.stats.reserved_bytes[kStatAll].peak = static_cast<std::int64_t>(rec.peak_reserved);
  r.stats.num_device_alloc = 1;
  return r;
}

ProfileReport setup_spike_report() {
  RecordingBuilder b;
  const std::int64_t t0 = b.now();
  b.segment_alloc(0x100000, 8 << 20)
      .tag("wte")
      .alloc(0x100000, 1 << 20, Category::kParameter, "setup", "", RangeKind::kSetup)
      .alloc(0x200000, 512 << 10, Category::kOptimizerState, "setup", "", RangeKind::kSetup)
      .alloc(0x300000, 4 << 20, Category::kTemporary, "setup", "", RangeKind::kSetup)
      .free(0x300000);
  const std::int64_t t_setup = b.now();
  b.begin_steps()
      .alloc(0x300000, 1 << 20, Category::kActivation, "forward", "h0")
      .alloc(0x400000, 512 << 10, Category::kActivation, "forward", "h1")
      .free(0x400000)
      .free(0x300000)
      .alloc(0x300000, 1 << 20, Category::kGradient, "backward", "h0", RangeKind::kBackward)
      .free(0x300000);
  const std::int64_t t_end = b.now();
  b.range(RangeKind::kSetup, "setup", t0 + 1, t_setup, 1, 0)
      .range(RangeKind::kStep, "step", t_setup + 1, t_end, 1, 0)
      .range(RangeKind::kForward, "forward", t_setup + 2, t_setup + 5000, 1, 1)
      .range(RangeKind::kBackward, "backward", t_setup + 5001, t_end, 1, 1);
  ProfileReport r;
  r.command = "train";
  r.model = "gpt-spike";
  r.backend = "cpu";
  r.steps = 1;
  r.recording = b.build();
  std::sort(r.recording.ranges.begin(), r.recording.ranges.end(),
            [](const RangeRecord& a, const RangeRecord& c) { return a.begin_ns < c.begin_ns; });
  return r;
}

std::size_t column(const std::vector<std::string>& header, const std::string& name) {
  const auto it = std::find(header.begin(), header.end(), name);
  EXPECT_NE(it, header.end()) << "no column " << name;
  return static_cast<std::size_t>(it - header.begin());
}

std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
      continue;
    }
    if (c == '"') {
      quoted = true;
      any = true;
    } else if (c == ',') {
      row.push_back(field);
      field.clear();
      any = true;
    } else if (c == '\n') {
      row.push_back(field);
      rows.push_back(row);
      row.clear();
      field.clear();
      any = false;
    } else if (c != '\r') {
      field += c;
      any = true;
    }
  }
  if (any) {
    row.push_back(field);
    rows.push_back(row);
  }
  return rows;
}

std::string html_balance_error(const std::string& html) {
  static const std::set<std::string> kVoid = {"meta", "br",   "hr",   "img", "input", "link",
                                              "col",  "area", "base", "wbr", "source"};
  std::vector<std::string> open;
  std::size_t i = 0;
  while (i < html.size()) {
    const char c = html[i];
    if (c == '&') {
      std::size_t j = i + 1;
      while (j < html.size() &&
             (std::isalnum(static_cast<unsigned char>(html[j])) || html[j] == '#'))
        ++j;
      if (j == i + 1 || j >= html.size() || html[j] != ';') {
        return "a bare '&' at offset " + std::to_string(i);
      }
      i = j + 1;
      continue;
    }
    if (c == '>') return "a bare '>' at offset " + std::to_string(i);
    if (c != '<') {
      ++i;
      continue;
    }
    if (html.compare(i, 4, "<!--") == 0) {
      const std::size_t e = html.find("-->", i);
      if (e == std::string::npos) return "an unclosed comment";
      i = e + 3;
      continue;
    }
    if (html.compare(i, 2, "<!") == 0) {
      const std::size_t e = html.find('>', i);
      if (e == std::string::npos) return "an unclosed declaration";
      i = e + 1;
      continue;
    }
    const bool closing = i + 1 < html.size() && html[i + 1] == '/';
    std::size_t j = i + (closing ? 2 : 1);
    const std::size_t name_start = j;
    while (j < html.size() && (std::isalnum(static_cast<unsigned char>(html[j])))) ++j;
    std::string name = html.substr(name_start, j - name_start);
    if (name.empty()) return "a '<' that starts no tag at offset " + std::to_string(i);
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    // Attributes: skip to the closing '>' outside quotes.
    char quote = 0;
    while (j < html.size() && (quote != 0 || html[j] != '>')) {
      if (quote != 0 && html[j] == quote)
        quote = 0;
      else if (quote == 0 && (html[j] == '"' || html[j] == '\''))
        quote = html[j];
      else if (quote == 0 && html[j] == '<')
        return "a '<' inside tag <" + name + ">";
      ++j;
    }
    if (j >= html.size()) return "an unterminated tag <" + name + ">";
    const bool self_closing = html[j - 1] == '/';
    const std::string attrs = html.substr(name_start + name.size(), j - name_start - name.size());
    i = j + 1;
    if (name == "script" && !closing) {
      // The page's own script and data carry data-memfit; any other is a name that escaped.
      if (attrs.find("data-memfit") == std::string::npos) {
        return "a <script> element that is not the page's own (no data-memfit)";
      }
      const std::size_t end = html.find("</script>", i);
      if (end == std::string::npos) return "an unclosed <script>";
      i = end + 9;
      continue;
    }
    if (closing) {
      if (open.empty() || open.back() != name) {
        return "</" + name + "> closes " +
               (open.empty() ? std::string("nothing") : "<" + open.back() + ">");
      }
      open.pop_back();
    } else if (!self_closing && kVoid.count(name) == 0) {
      open.push_back(name);
      if (name == "style") {  // raw text up to </style>
        const std::size_t e = html.find("</style>", i);
        if (e == std::string::npos) return "an unclosed <style>";
        i = e;
      }
    }
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  return "";
}

std::string temp_dir(const std::string& name) {
  static std::atomic<int> counter{0};
  const auto base =
      std::filesystem::temp_directory_path() / ("memfit_export_" + std::to_string(::getpid()) +
                                                "_" + std::to_string(counter++) + "_" + name);
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base);
  return base.string();
}

bool is_root() { return ::geteuid() == 0; }

}  // namespace memfit::exporttest
