#include "profiler/snapshot_import.h"

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "memory/category.h"
#include "memory/error.h"

namespace memfit {

namespace {

// Typed look-ups that name the place in the file when the data is not a snapshot's.
class Doc {
 public:
  explicit Doc(std::string_view source) : source_(source) {}

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw InvalidArgument(std::string(source_) + ": " + where + ": " + what +
                          " (not a memory_viz snapshot as torch.cuda.memory._snapshot() writes)");
  }
  const PickleValue* find(const PickleValue& d, const std::string& where, const char* key) const {
    if (!d.is_dict())
      fail(where, std::string("expected a dict, found ") + pickle_kind_name(d.kind()));
    return d.find(key);
  }
  const PickleValue& need(const PickleValue& d, const std::string& where, const char* key) const {
    const PickleValue* v = find(d, where, key);
    if (v == nullptr) fail(where, std::string("no key '") + key + "'");
    return *v;
  }
  const std::vector<PickleValue>& seq(const PickleValue& v, const std::string& where) const {
    if (!v.is_sequence())
      fail(where, std::string("expected a list, found ") + pickle_kind_name(v.kind()));
    return v.items();
  }
  std::int64_t integer(const PickleValue& v, const std::string& where) const {
    if (!v.is_int()) fail(where, std::string("expected int, found ") + pickle_kind_name(v.kind()));
    return v.as_int();
  }
  std::size_t size(const PickleValue& d, const std::string& where, const char* key) const {
    const std::int64_t v = integer(need(d, where, key), where + "['" + key + "']");
    if (v < 0) fail(where + "['" + key + "']", "negative size " + std::to_string(v));
    return static_cast<std::size_t>(v);
  }
  std::size_t size_or(const PickleValue& d, const std::string& where, const char* key,
                      std::size_t dflt) const {
    return find(d, where, key) ? size(d, where, key) : dflt;
  }
  const std::string& str(const PickleValue& d, const std::string& where, const char* key) const {
    const PickleValue& v = need(d, where, key);
    if (!v.is_str()) {
      fail(where + "['" + key + "']",
           std::string("expected str, found ") + pickle_kind_name(v.kind()));
    }
    return v.as_str();
  }

 private:
  std::string_view source_;
};

Category category_of(const PickleValue& entry) {
  const PickleValue* c = entry.find("category");
  if (c == nullptr || !c->is_str()) return Category::kUnknown;
  try {
    return parse_category(c->as_str());
  } catch (const InvalidArgument&) {
    return Category::kUnknown;  // PyTorch's own names ("activation", "parameter", ...) mostly match
  }
}

std::string tag_of(const PickleValue& entry) {
  const PickleValue* frames = entry.find("frames");
  if (frames == nullptr || !frames->is_sequence() || frames->items().empty()) return {};
  const PickleValue* name = frames->items().front().find("name");
  return name != nullptr && name->is_str() ? name->as_str() : std::string();
}

struct Entry {
  enum Kind {
    kAlloc,
    kFreeRequested,
    kFreeCompleted,
    kSegmentAlloc,
    kSegmentFree,
    kSegmentMap,
    kSegmentUnmap,
    kOther
  } kind;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  StreamId stream = 0;
  const PickleValue* raw = nullptr;
};

bool grows_reserved(Entry::Kind k) { return k == Entry::kSegmentAlloc || k == Entry::kSegmentMap; }
bool shrinks_reserved(Entry::Kind k) {
  return k == Entry::kSegmentFree || k == Entry::kSegmentUnmap;
}

const std::vector<PickleValue>* device_traces(const Doc& doc, const PickleValue& snapshot) {
  if (snapshot.kind() == PickleValue::Kind::kList) return nullptr;  // legacy: no traces
  const PickleValue* t = doc.find(snapshot, "the top level", "device_traces");
  if (t == nullptr) {
    doc.fail("the top level",
             "no key 'device_traces' (record it with "
             "torch.cuda.memory._record_memory_history())");
  }
  return &doc.seq(*t, "['device_traces']");
}

std::vector<int> busy_devices(const Doc& doc, const std::vector<PickleValue>* traces) {
  std::vector<int> busy;
  for (std::size_t d = 0; traces && d < traces->size(); ++d) {
    if (!doc.seq((*traces)[d], "device_traces[" + std::to_string(d) + "]").empty()) {
      busy.push_back(static_cast<int>(d));
    }
  }
  return busy;
}

// What the file says about PyTorch's allocator settings; the segments and trace entries
// are looked at by the caller for the files without settings.
RecordedAllocator recorded_settings(const Doc& doc, const PickleValue& snapshot) {
  RecordedAllocator r;
  if (!snapshot.is_dict()) return r;
  const PickleValue* st = snapshot.find("allocator_settings");
  if (st == nullptr) return r;
  if (!st->is_dict()) {
    doc.fail("['allocator_settings']",
             std::string("expected a dict, found ") + pickle_kind_name(st->kind()));
  }
  r.has_settings = true;
  if (const PickleValue* c = st->find("PYTORCH_CUDA_ALLOC_CONF"); c && c->is_str()) {
    r.alloc_conf = c->as_str();
  }
  if (const PickleValue* e = st->find("expandable_segments");
      e && e->kind() == PickleValue::Kind::kBool && e->as_bool()) {
    r.expandable_segments = true;
    r.expandable_evidence = "allocator_settings['expandable_segments']";
  }
  return r;
}

}  // namespace

std::vector<int> traced_devices(const PickleValue& snapshot, std::string_view source) {
  Doc doc(source);
  if (snapshot.kind() != PickleValue::Kind::kList) doc.need(snapshot, "the top level", "segments");
  return busy_devices(doc, device_traces(doc, snapshot));
}

AllocatorConfig replay_alloc_conf(const ImportedSnapshot& s) {
  AllocatorConfig c;
  c.expandable_segments = s.recorded.expandable_segments;
  return c;
}

ImportedSnapshot import_snapshot(const PickleValue& snapshot, std::string_view source, int device) {
  Doc doc(source);
  ImportedSnapshot out;
  const std::vector<PickleValue>* segments = nullptr;
  if (snapshot.kind() == PickleValue::Kind::kList) {
    out.legacy = true;
    segments = &snapshot.items();
  } else {
    segments = &doc.seq(doc.need(snapshot, "the top level", "segments"), "['segments']");
  }
  const std::vector<PickleValue>* traces = device_traces(doc, snapshot);
  out.recorded = recorded_settings(doc, snapshot);

  // Which device.
  if (device < 0) {
    const std::vector<int> busy = busy_devices(doc, traces);
    if (busy.size() > 1) {
      std::string list;
      for (int d : busy) list += (list.empty() ? "" : ", ") + std::to_string(d);
      throw InvalidArgument(std::string(source) + ": devices " + list +
                            " all have traces: choose one by its index");
    }
    device = busy.empty() ? 0 : busy.front();
  } else if (traces && static_cast<std::size_t>(device) >= traces->size()) {
    throw InvalidArgument(std::string(source) + ": device " + std::to_string(device) +
                          " has no trace: device_traces has " + std::to_string(traces->size()) +
                          " device(s)");
  }
  out.device = device;

  // The file's own segments (the state at the end).
  std::vector<Entry> live_at_end;
  for (std::size_t i = 0; i < segments->size(); ++i) {
    const std::string where = "segments[" + std::to_string(i) + "]";
    const PickleValue& seg = (*segments)[i];
    const PickleValue* dev = doc.find(seg, where, "device");
    const PickleValue* expandable = doc.find(seg, where, "is_expandable");
    if (!out.recorded.has_settings && expandable != nullptr &&
        expandable->kind() == PickleValue::Kind::kBool && expandable->as_bool()) {
      out.recorded.expandable_segments = true;  // the allocator is process-wide
      out.recorded.expandable_evidence = "segments[]['is_expandable']";
    }
    if (dev != nullptr && doc.integer(*dev, where + "['device']") != device) continue;
    const std::size_t total = doc.size(seg, where, "total_size");
    const std::size_t address = doc.size(seg, where, "address");
    const StreamId stream = static_cast<StreamId>(doc.size_or(seg, where, "stream", 0));
    ++out.segments.num_segments;
    out.segments.reserved_bytes += total;
    out.segments.largest_segment_bytes = std::max(out.segments.largest_segment_bytes, total);
    std::size_t allocated = 0, offset = 0;
    const std::vector<PickleValue>& blocks =
        doc.seq(doc.need(seg, where, "blocks"), where + "['blocks']");
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      const std::string bw = where + "['blocks'][" + std::to_string(b) + "]";
      const std::size_t size = doc.size(blocks[b], bw, "size");
      // Legacy blocks have no address: they tile the segment in order.
      const std::size_t addr = doc.size_or(blocks[b], bw, "address", address + offset);
      offset += size;
      if (doc.str(blocks[b], bw, "state") != "active_allocated") continue;
      const std::size_t requested = doc.size_or(blocks[b], bw, "requested_size", size);
      allocated += size;
      out.segments.requested_bytes += requested;
      ++out.segments.num_active_blocks;
      live_at_end.push_back({Entry::kAlloc, addr, requested, stream, &blocks[b]});
    }
    out.segments.allocated_bytes += doc.size_or(seg, where, "allocated_size", allocated);
    out.segments.active_bytes += doc.size_or(seg, where, "active_size", allocated);
  }

  // The trace entries.
  std::vector<Entry> entries;
  if (traces && static_cast<std::size_t>(device) < traces->size()) {
    const std::string tw = "device_traces[" + std::to_string(device) + "]";
    const std::vector<PickleValue>& list = doc.seq((*traces)[device], tw);
    entries.reserve(list.size());
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string where = tw + "[" + std::to_string(i) + "]";
      const PickleValue& e = list[i];
      const std::string& action = doc.str(e, where, "action");
      Entry x{Entry::kOther};
      x.raw = &e;
      if (action == "alloc") x.kind = Entry::kAlloc;
      if (action == "free_requested") x.kind = Entry::kFreeRequested;
      if (action == "free_completed") x.kind = Entry::kFreeCompleted;
      if (action == "segment_alloc") x.kind = Entry::kSegmentAlloc;
      if (action == "segment_free") x.kind = Entry::kSegmentFree;
      if (action == "segment_map") x.kind = Entry::kSegmentMap;
      if (action == "segment_unmap") x.kind = Entry::kSegmentUnmap;
      if (action == "oom") ++out.num_ooms;
      out.num_segment_allocs += x.kind == Entry::kSegmentAlloc;
      out.num_segment_frees += x.kind == Entry::kSegmentFree;
      out.num_segment_maps += x.kind == Entry::kSegmentMap;
      out.num_segment_unmaps += x.kind == Entry::kSegmentUnmap;
      if (x.kind != Entry::kOther) {
        x.addr = doc.size(e, where, "addr");
        x.size = doc.size(e, where, "size");
        x.stream = static_cast<StreamId>(doc.size_or(e, where, "stream", 0));
      }
      entries.push_back(x);
    }
  }
  out.num_entries = entries.size();
  if (!out.recorded.has_settings && out.num_segment_maps + out.num_segment_unmaps > 0) {
    out.recorded.expandable_segments = true;
    out.recorded.expandable_evidence = "segment_map / segment_unmap trace entries";
  }

  // PyTorch's reserved over the trace: walk back from the end state, then forward for the peak.
  std::size_t start = out.segments.reserved_bytes;
  bool any_segment_event = false;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (grows_reserved(it->kind)) start = start >= it->size ? start - it->size : 0;
    if (shrinks_reserved(it->kind)) start += it->size;
    any_segment_event |= grows_reserved(it->kind) || shrinks_reserved(it->kind);
  }
  if (any_segment_event) {
    std::size_t now = start, peak = start;
    for (const Entry& e : entries) {
      if (grows_reserved(e.kind)) now += e.size;
      if (shrinks_reserved(e.kind)) now = now >= e.size ? now - e.size : 0;
      peak = std::max(peak, now);
    }
    out.segments.trace_start_reserved_bytes = start;
    out.segments.trace_peak_reserved_bytes = peak;
  }

  // A free_requested is the free only when no free_completed of its address follows before
  // the address is allocated again.
  std::vector<char> request_is_free(entries.size(), 0);
  {
    std::unordered_set<std::uintptr_t> completion_ahead;
    for (std::size_t i = entries.size(); i-- > 0;) {
      const Entry& e = entries[i];
      if (e.kind == Entry::kFreeCompleted) completion_ahead.insert(e.addr);
      if (e.kind == Entry::kAlloc) completion_ahead.erase(e.addr);
      if (e.kind == Entry::kFreeRequested) request_is_free[i] = completion_ahead.erase(e.addr) == 0;
    }
  }
  auto is_free = [&](std::size_t i) {
    return entries[i].kind == Entry::kFreeCompleted ||
           (entries[i].kind == Entry::kFreeRequested && request_is_free[i]);
  };

  // Live at the start: freed before the trace allocated them, or active at the end unseen.
  std::unordered_map<std::uintptr_t, std::uint64_t> live;  // address -> trace id
  {
    std::unordered_set<std::uintptr_t> seen;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const Entry& e = entries[i];
      if (e.kind == Entry::kAlloc) seen.insert(e.addr);
      if (is_free(i) && seen.insert(e.addr).second && e.size > 0) {
        live[e.addr] = out.trace.alloc(e.size, category_of(*e.raw), e.stream, tag_of(*e.raw));
        ++out.num_initially_live;
      }
    }
    for (const Entry& b : live_at_end) {
      if (seen.count(b.addr) != 0 || b.size == 0) continue;
      live[b.addr] = out.trace.alloc(b.size, Category::kUnknown, b.stream, tag_of(*b.raw));
      ++out.num_initially_live;
    }
  }

  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (shrinks_reserved(e.kind)) {
      // One empty_cache per run of releases: PyTorch released its cached memory here.
      if (i == 0 || !shrinks_reserved(entries[i - 1].kind)) {
        out.trace.empty_cache();
        ++out.num_empty_cache;
      }
    } else if (e.kind == Entry::kAlloc) {
      if (e.size == 0) continue;
      auto old = live.find(e.addr);
      if (old != live.end()) {  // allocated again without a free in the trace: a lost free
        out.trace.free(old->second);
        ++out.num_frees;
      }
      live[e.addr] = out.trace.alloc(e.size, category_of(*e.raw), e.stream, tag_of(*e.raw));
      ++out.num_allocs;
    } else if (is_free(i)) {
      auto it = live.find(e.addr);
      if (it == live.end()) continue;  // a second free of the same block (size 0 skipped)
      out.trace.free(it->second);
      live.erase(it);
      ++out.num_frees;
    } else if (e.kind != Entry::kFreeRequested) {
      ++out.ignored_entries;
    }
  }
  return out;
}

}  // namespace memfit
