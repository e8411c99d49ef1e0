// snapshot.pickle: a ProfileReport in the layout of PyTorch's torch.cuda.memory._snapshot(),
// which pytorch.org/memory_viz and torch/cuda/_memory_viz.py read.
//
// Layout (PyTorch 2.x, torch/cuda/memory.py `_snapshot` docstring and what
// torch/csrc/cuda/memory_snapshot.cpp writes):
//   {"segments": [{"device", "address", "total_size", "allocated_size", "active_size",
//                  "requested_size", "stream", "segment_type": "large"|"small",
//                  "segment_pool_id": (0, 0) | (0, 1), "is_expandable", "frames": [],
//                  "blocks": [{"address", "size", "requested_size", "state", "frames"}]}],
//    "device_traces": [[{"action", "addr", "size", "stream", "time_us", "frames",
//                        "category", ("device_free" for oom)}]],   one list per device
//    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF", "max_split_size", ...}}
// memfit has one device (0). time_us is Unix-epoch microseconds, as PyTorch writes it (memory_viz
// prints it as a date). Frames are {"filename", "line", "name"}, innermost first as
// PyTorch writes them: the tensor's tag ("tensor"), the block ("block") and the phase
// ("phase") open when the event happened, so memory_viz shows "block:0:h3" / "phase:0:forward"
// where it would show Python source lines. A block in "segments" gets the frames of the
// alloc event that made it, when the recording still holds it.
//
// Categories: MemoryViz.js colors allocations by the trace entries' "category" and, when any
// entry has one, looks up "unknown" for entries without; if no entry says "unknown" it fails
// (annotate_snapshot pushes onto a misspelled `snapshot.categores`). So segment events carry
// "unknown" (a segment has no category) and every device trace ends with a "snapshot" entry
// (PyTorch records one when a snapshot is taken during tracing) whose category is "unknown".
//
// Details users' tools read, as PyTorch 2.x writes them (checked against real snapshots):
// allocator_settings["max_split_size"] is -1 when unset (PyTorch stores SIZE_MAX in an int64,
// and every real 2.x snapshot with settings carries -1), else the bytes. segment_pool_id is
// (0, 0) for the default pool, as PyTorch writes its own; memfit's persistent pools
// (gradients and optimizer state, caching_allocator.h) are written as a private pool, (0, 1),
// the form of a user-created MemPool's id (SegmentInfo::persistent says which).
// A large file is pickle protocol 4 with frames, as pickle.dump writes PyTorch's own
// (write_pickle, profiler/pickle.h); never protocol 5, which memory_viz cannot read.
//
// The events are the Recording's kept ones; blocks freed in the trace but allocated before it
// (dropped or before the Recorder) show in memory_viz as allocated at the start, which is
// what memory_viz does with PyTorch's own ring-buffered traces too.
#include <string>
#include <unordered_map>

#include "memory/alloc_conf.h"
#include "profiler/pickle.h"
#include "profiler/report.h"
#include "profiler/scoped_range.h"

namespace memfit {

namespace {

PickleValue frame(const char* file, std::string_view name) {
  PickleValue f = PickleValue::dict();
  f.add("filename", PickleValue::str(file));
  f.add("line", PickleValue::integer(0));
  f.add("name", PickleValue::str(std::string(name)));
  return f;
}

PickleValue frames_of(const TimelineEvent& e) {
  PickleValue fs = PickleValue::list();
  if (e.tag != 0) fs.append(frame("tensor", interned_name(e.tag)));
  if (e.block != 0) fs.append(frame("block", interned_name(e.block)));
  if (e.phase != 0) fs.append(frame("phase", interned_name(e.phase)));
  return fs;
}

PickleValue i64(std::uint64_t v) { return PickleValue::integer(static_cast<std::int64_t>(v)); }

// (0, 0): PyTorch's default pool; (0, 1): memfit's persistent pool (see the header comment).
PickleValue segment_pool_id(const SegmentInfo& s) {
  return PickleValue::tuple({PickleValue::integer(0), PickleValue::integer(s.persistent ? 1 : 0)});
}

PickleValue allocator_settings(const AllocatorConfig& c) {
  PickleValue s = PickleValue::dict();
  s.add("PYTORCH_CUDA_ALLOC_CONF", PickleValue::str(c.to_string()));
  // PyTorch writes SIZE_MAX as an int64 (-1) for "no limit"; memfit's 0 means the same.
  s.add("max_split_size", c.max_split_size == 0 ? PickleValue::integer(-1) : i64(c.max_split_size));
  s.add("garbage_collection_threshold", PickleValue::real(c.garbage_collection_threshold));
  s.add("expandable_segments", PickleValue::boolean(c.expandable_segments));
  s.add("release_lock_on_cudamalloc", PickleValue::boolean(false));
  // PyTorch keys its divisions by power-of-two interval ("1", "2", ..., "32768" MiB); memfit
  // has one setting for every interval.
  PickleValue div = PickleValue::dict();
  for (std::int64_t k = 1; k <= 32768; k *= 2) {
    div.add(std::to_string(k), PickleValue::integer(c.roundup_power2_divisions));
  }
  s.add("roundup_power2_divisions", std::move(div));
  s.add("memfit_budget", i64(c.budget));
  return s;
}

}  // namespace

std::string snapshot_pickle(const ProfileReport& r) {
  const Recording& rec = r.recording;

  // The alloc event behind each address still live at the end, for the blocks' frames.
  std::unordered_map<std::uintptr_t, std::size_t> last_alloc;
  PickleValue trace = PickleValue::list();
  trace.items().reserve(rec.events.size() + 1);
  for (std::size_t i = 0; i < rec.events.size(); ++i) {
    const TimelineEvent& e = rec.events[i];
    if (e.kind == EventKind::kAlloc) last_alloc[e.addr] = i;
    if (e.kind == EventKind::kFreeCompleted) last_alloc.erase(e.addr);
    PickleValue t = PickleValue::dict();
    t.add("action", PickleValue::str(event_kind_name(e.kind)));
    t.add("addr", i64(e.addr));
    t.add("size", i64(e.size));
    t.add("stream", i64(e.stream));
    t.add("time_us", PickleValue::integer(rec.epoch_ns(e.time_ns) / 1000));
    t.add("frames", frames_of(e));
    t.add("category",
          PickleValue::str(is_segment_event(e.kind) ? "unknown" : category_name(e.category)));
    // (memory_viz_colors in report.cpp reads the categories in this same order.)
    if (e.kind == EventKind::kOom) {
      // What the device had free: its total less what memfit held, when the total is known.
      const std::size_t free =
          r.device_total_bytes > e.reserved ? r.device_total_bytes - e.reserved : 0;
      t.add("device_free", i64(free));
    }
    trace.append(std::move(t));
  }
  PickleValue snap_entry = PickleValue::dict();
  snap_entry.add("action", PickleValue::str("snapshot"));
  snap_entry.add("addr", PickleValue::integer(0));
  snap_entry.add("size", PickleValue::integer(0));
  snap_entry.add("stream", PickleValue::integer(0));
  snap_entry.add("time_us", PickleValue::integer(rec.epoch_ns(rec.end_ns) / 1000));
  snap_entry.add("frames", PickleValue::list());
  snap_entry.add("category", PickleValue::str("unknown"));
  trace.append(std::move(snap_entry));

  PickleValue segments = PickleValue::list();
  for (const SegmentInfo& s : r.snapshot.segments) {
    PickleValue seg = PickleValue::dict();
    seg.add("device", PickleValue::integer(0));
    seg.add("address", i64(s.address));
    seg.add("total_size", i64(s.total_size));
    seg.add("allocated_size", i64(s.allocated_size));
    seg.add("active_size", i64(s.active_size));
    seg.add("requested_size", i64(s.requested_size));
    seg.add("stream", i64(s.stream));
    seg.add("segment_type", PickleValue::str(s.is_large ? "large" : "small"));
    seg.add("segment_pool_id", segment_pool_id(s));
    seg.add("is_expandable", PickleValue::boolean(s.is_expandable));
    seg.add("frames", PickleValue::list());
    PickleValue blocks = PickleValue::list();
    for (const BlockInfo& b : s.blocks) {
      PickleValue blk = PickleValue::dict();
      blk.add("address", i64(b.address));
      blk.add("size", i64(b.size));
      blk.add("requested_size", i64(b.requested_size));
      blk.add("state", PickleValue::str(block_state_name(b.state)));
      PickleValue fs = PickleValue::list();
      if (b.state != BlockState::kInactive) {
        auto it = last_alloc.find(b.address);
        if (it != last_alloc.end()) {
          fs = frames_of(rec.events[it->second]);
        } else if (!b.tag.empty()) {
          fs.append(frame("tensor", b.tag));
        }
      }
      blk.add("frames", std::move(fs));
      blk.add("category", PickleValue::str(category_name(b.category)));
      blocks.append(std::move(blk));
    }
    seg.add("blocks", std::move(blocks));
    segments.append(std::move(seg));
  }

  PickleValue root = PickleValue::dict();
  root.add("segments", std::move(segments));
  root.add("device_traces", PickleValue::list({std::move(trace)}));
  root.add("allocator_settings", allocator_settings(r.config));
  return write_pickle(root);
}

}  // namespace memfit
