#include "memory/alloc_trace.h"

#include <algorithm>
#include <charconv>
#include <istream>
#include <ostream>
#include <sstream>
#include <string>
#include <unordered_map>

#include "memory/check.h"
#include "memory/error.h"
#include "memory/size.h"

namespace memfit {

const char* trace_op_kind_name(TraceOpKind k) {
  switch (k) {
    case TraceOpKind::kAlloc:
      return "alloc";
    case TraceOpKind::kFree:
      return "free";
    case TraceOpKind::kRecordStream:
      return "record_stream";
    case TraceOpKind::kEmptyCache:
      return "empty_cache";
    case TraceOpKind::kStep:
      return "step";
    case TraceOpKind::kPhase:
      return "phase";
  }
  return "invalid";
}

// ---- builder and validation ---------------------------------------------------------------

std::uint64_t AllocTrace::alloc(std::size_t bytes, Category category, StreamId stream,
                                std::string_view tag) {
  const std::uint64_t id = next_id_++;
  ops.push_back({TraceOpKind::kAlloc, id, bytes, category, stream, std::string(tag)});
  return id;
}

void AllocTrace::free(std::uint64_t id) { ops.push_back({TraceOpKind::kFree, id, 0, {}, {}, {}}); }

void AllocTrace::record_stream(std::uint64_t id, StreamId stream) {
  ops.push_back({TraceOpKind::kRecordStream, id, 0, {}, stream, {}});
}

void AllocTrace::empty_cache() { ops.push_back({TraceOpKind::kEmptyCache, 0, 0, {}, {}, {}}); }

void AllocTrace::step(std::uint64_t n) { ops.push_back({TraceOpKind::kStep, n, 0, {}, {}, {}}); }

void AllocTrace::phase(std::string_view name) {
  ops.push_back({TraceOpKind::kPhase, 0, 0, {}, {}, std::string(name)});
}

namespace {

[[noreturn]] void bad_op(std::size_t index, const TraceOp& op, const std::string& why) {
  std::ostringstream os;
  os << "malformed allocation trace: op " << index << " (" << trace_op_kind_name(op.kind);
  if (op.kind == TraceOpKind::kAlloc || op.kind == TraceOpKind::kFree ||
      op.kind == TraceOpKind::kRecordStream)
    os << " id " << op.id;
  os << "): " << why;
  throw InvalidArgument(os.str());
}

}  // namespace

TraceSummary AllocTrace::validate() const {
  struct Live {
    std::size_t size;
    Category category;
    std::size_t op;
  };
  std::unordered_map<std::uint64_t, Live> live;
  std::unordered_map<std::uint64_t, std::size_t> freed_at;  // id -> op index of its free
  TraceSummary s;
  std::size_t live_bytes = 0;
  bool have_step = false;
  std::uint64_t last_step = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const TraceOp& op = ops[i];
    switch (op.kind) {
      case TraceOpKind::kAlloc: {
        if (op.size == 0) bad_op(i, op, "size 0; an allocation needs at least 1 byte");
        if (category_index(op.category) >= kCategoryCount) bad_op(i, op, "invalid category");
        auto it = live.find(op.id);
        if (it != live.end())
          bad_op(i, op,
                 "id is already live (allocated at op " + std::to_string(it->second.op) +
                     " and not freed); free it first or use a new id");
        live.emplace(op.id, Live{op.size, op.category, i});
        freed_at.erase(op.id);
        live_bytes = checked_add(live_bytes, op.size, "trace live bytes");
        s.peak_live_bytes = std::max(s.peak_live_bytes, live_bytes);
        if (!s.step_peak_live_bytes.empty())
          s.step_peak_live_bytes.back() = std::max(s.step_peak_live_bytes.back(), live_bytes);
        s.bytes_by_category[category_index(op.category)] += op.size;
        ++s.num_allocs;
        break;
      }
      case TraceOpKind::kFree:
      case TraceOpKind::kRecordStream: {
        auto it = live.find(op.id);
        if (it == live.end()) {
          auto f = freed_at.find(op.id);
          bad_op(i, op,
                 f != freed_at.end()
                     ? "id is not live: already freed at op " + std::to_string(f->second)
                     : std::string("id was never allocated"));
        }
        if (op.kind == TraceOpKind::kFree) {
          live_bytes -= it->second.size;
          live.erase(it);
          freed_at[op.id] = i;
          ++s.num_frees;
        }
        break;
      }
      case TraceOpKind::kStep:
        if (have_step && op.id <= last_step)
          bad_op(i, op,
                 "step " + std::to_string(op.id) + " after step " + std::to_string(last_step) +
                     "; step numbers must increase");
        have_step = true;
        last_step = op.id;
        ++s.num_steps;
        s.step_peak_live_bytes.push_back(live_bytes);
        break;
      case TraceOpKind::kEmptyCache:
      case TraceOpKind::kPhase:
        break;
    }
  }
  for (const auto& [id, l] : live) {
    s.persistent_bytes += l.size;
    s.persistent_by_category[category_index(l.category)] += l.size;
    ++s.num_persistent;
  }
  return s;
}

// ---- text form ----------------------------------------------------------------------------

void write_trace(std::ostream& out, const AllocTrace& trace) {
  out << "# memfit allocation trace v1: " << trace.ops.size() << " ops\n";
  for (const TraceOp& op : trace.ops) {
    out << trace_op_kind_name(op.kind);
    switch (op.kind) {
      case TraceOpKind::kAlloc:
        out << ' ' << op.id << ' ' << op.size << ' ' << category_name(op.category) << ' '
            << op.stream;
        if (!op.tag.empty()) out << ' ' << op.tag;
        break;
      case TraceOpKind::kFree:
        out << ' ' << op.id;
        break;
      case TraceOpKind::kRecordStream:
        out << ' ' << op.id << ' ' << op.stream;
        break;
      case TraceOpKind::kEmptyCache:
        break;
      case TraceOpKind::kStep:
        out << ' ' << op.id;
        break;
      case TraceOpKind::kPhase:
        out << ' ' << op.tag;
        break;
    }
    out << '\n';
  }
}

namespace {

class LineParser {
 public:
  LineParser(std::string_view line, std::string_view source, std::size_t line_no)
      : line_(line), source_(source), line_no_(line_no) {}

  std::string_view word(const char* what) {
    skip_space();
    const std::size_t b = pos_;
    while (pos_ < line_.size() && line_[pos_] != ' ' && line_[pos_] != '\t') ++pos_;
    if (b == pos_) fail(std::string("missing ") + what);
    return line_.substr(b, pos_ - b);
  }
  std::uint64_t number(const char* what) {
    const std::string_view w = word(what);
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
    if (ec != std::errc() || p != w.data() + w.size())
      fail(std::string(what) + " '" + std::string(w) + "' is not a non-negative integer");
    return v;
  }
  std::string_view rest() {
    skip_space();
    std::string_view r = line_.substr(pos_);
    while (!r.empty() && (r.back() == ' ' || r.back() == '\t' || r.back() == '\r'))
      r.remove_suffix(1);
    pos_ = line_.size();
    return r;
  }
  void end() {
    if (!rest().empty()) fail("unexpected text after the operation");
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw InvalidArgument(std::string(source_) + ":" + std::to_string(line_no_) + ": " + why +
                          "; expected one of: alloc ID SIZE CATEGORY STREAM [TAG] | free ID | "
                          "record_stream ID STREAM | empty_cache | step N | phase NAME");
  }

 private:
  void skip_space() {
    while (pos_ < line_.size() && (line_[pos_] == ' ' || line_[pos_] == '\t')) ++pos_;
  }
  std::string_view line_;
  std::string_view source_;
  std::size_t line_no_;
  std::size_t pos_ = 0;
};

}  // namespace

AllocTrace read_trace(std::istream& in, std::string_view source) {
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_trace(std::move(ss).str(), source);
}

AllocTrace parse_trace(std::string_view text, std::string_view source) {
  AllocTrace trace;
  std::size_t line_no = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t nl = std::min(text.find('\n', at), text.size());
    std::string_view l = text.substr(at, nl - at);
    at = nl + 1;
    ++line_no;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);  // CRLF
    while (!l.empty() && (l.front() == ' ' || l.front() == '\t')) l.remove_prefix(1);
    if (l.empty() || l.front() == '#') continue;
    LineParser p(l, source, line_no);
    const std::string_view kind = p.word("operation");
    TraceOp op;
    if (kind == "alloc") {
      op.kind = TraceOpKind::kAlloc;
      op.id = p.number("id");
      if (op.id == UINT64_MAX) p.fail("id 2^64-1 is reserved");
      op.size = p.number("size");
      const std::string_view cat = p.word("category");
      try {
        op.category = parse_category(cat);
      } catch (const InvalidArgument& e) {
        p.fail(e.what());
      }
      op.stream = p.number("stream");
      op.tag = std::string(p.rest());
    } else if (kind == "free") {
      op.kind = TraceOpKind::kFree;
      op.id = p.number("id");
      p.end();
    } else if (kind == "record_stream") {
      op.kind = TraceOpKind::kRecordStream;
      op.id = p.number("id");
      op.stream = p.number("stream");
      p.end();
    } else if (kind == "empty_cache") {
      op.kind = TraceOpKind::kEmptyCache;
      p.end();
    } else if (kind == "step") {
      op.kind = TraceOpKind::kStep;
      op.id = p.number("step number");
      p.end();
    } else if (kind == "phase") {
      op.kind = TraceOpKind::kPhase;
      op.tag = std::string(p.rest());
      if (op.tag.empty()) p.fail("missing phase name");
    } else {
      p.fail("unknown operation '" + std::string(kind) + "'");
    }
    if (op.kind == TraceOpKind::kAlloc) trace.next_id_ = std::max(trace.next_id_, op.id + 1);
    trace.ops.push_back(std::move(op));
  }
  return trace;
}

}  // namespace memfit
