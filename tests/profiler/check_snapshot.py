#!/usr/bin/python3
"""Checks a snapshot.pickle the way PyTorch's memory_viz reads it (run by export_pickle_test).

1. Python's own pickle loads it (plain data only: no classes are named in it).
2. The keys and types of torch.cuda.memory._snapshot()'s layout are present.
3. MemoryViz.js's rules hold: if any trace entry has a "category", one is "unknown"
   (annotate_snapshot fails otherwise); blocks tile their segments; walking the trace back
   from the end as MemoryView.simulate_memory does, every live block lies in a live segment
   and every free_requested finds its block.
4. If torch is importable and its _memory_viz reads the dict layout (torch >= 2.1), its
   functions that need no GPU run on it: segsum, trace, trace_plot, segment_plot.
Prints "ok" and exits 0, or prints what failed and exits 1.
Usage: check_snapshot.py FILE
"""
import pickle
import sys


def fail(msg):
    print("check_snapshot: " + msg)
    sys.exit(1)


def need(d, key, types, where):
    if key not in d:
        fail(f"{where}: no key {key!r}")
    if not isinstance(d[key], types):
        fail(f"{where}[{key!r}]: {type(d[key]).__name__}, expected {types}")
    return d[key]


def main(path):
    with open(path, "rb") as f:
        snap = pickle.load(f)
    if not isinstance(snap, dict):
        fail("top level is not a dict")
    segments = need(snap, "segments", list, "top")
    traces = need(snap, "device_traces", list, "top")
    need(snap, "allocator_settings", dict, "top")
    for i, s in enumerate(segments):
        w = f"segments[{i}]"
        for k in ("device", "address", "total_size", "allocated_size", "active_size",
                  "requested_size", "stream"):
            need(s, k, int, w)
        if need(s, "segment_type", str, w) not in ("large", "small"):
            fail(f"{w}: segment_type {s['segment_type']!r}")
        addr = s["address"]
        for j, b in enumerate(need(s, "blocks", list, w)):
            bw = f"{w}.blocks[{j}]"
            if need(b, "address", int, bw) != addr:
                fail(f"{bw}: address {b['address']} but the blocks before end at {addr}")
            addr += need(b, "size", int, bw)
            need(b, "requested_size", int, bw)
            need(b, "frames", list, bw)
            if need(b, "state", str, bw) not in ("active_allocated", "active_pending_free", "inactive"):
                fail(f"{bw}: state {b['state']!r}")
        if addr != s["address"] + s["total_size"]:
            fail(f"{w}: blocks cover {addr - s['address']} of {s['total_size']} bytes")
    categories = set()
    for d, trace in enumerate(traces):
        for i, e in enumerate(trace):
            w = f"device_traces[{d}][{i}]"
            need(e, "action", str, w)
            for k in ("size", "stream", "time_us") + (() if e["action"] == "oom" else ("addr",)):
                need(e, k, int, w)
            for fr in need(e, "frames", list, w):
                for k, t in (("filename", str), ("line", int), ("name", str)):
                    need(fr, k, t, w + ".frames")
            if "category" in e:
                categories.add(e["category"])
        simulate(snap, d, trace)
    if categories and "unknown" not in categories:
        fail(f"categories {sorted(categories)} without 'unknown': MemoryViz.js fails on that")
    try_torch(snap)
    print("ok")


def simulate(snap, device, trace):
    """MemoryView.simulate_memory of MemoryViz.js, checked at every step back from the end."""
    segs = {}
    blocks = {}
    for s in snap["segments"]:
        if s["device"] != device:
            continue
        segs[s["address"]] = s["total_size"]
        for b in s["blocks"]:
            if b["state"] != "inactive":
                blocks[b["address"]] = b["size"]
    # annotate_snapshot folds free_requested + free_completed of one address into "free".
    events = []
    for e in trace:
        if (e["action"] == "free_completed" and events and events[-1]["action"] == "free_requested"
                and events[-1]["addr"] == e["addr"]):
            events[-1] = dict(events[-1], action="free")
            continue
        events.append(e)
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        a = e["action"]
        if a in ("free", "free_completed"):
            blocks[e["addr"]] = e["size"]
        elif a == "free_requested":
            if e["addr"] not in blocks:
                fail(f"event {i}: free_requested of {e['addr']:#x} finds no block (MemoryViz.js throws)")
        elif a == "alloc":
            blocks.pop(e["addr"], None)
        elif a == "segment_free":
            segs[e["addr"]] = e["size"]
        elif a == "segment_alloc":
            if segs.pop(e["addr"], None) is None:
                fail(f"event {i}: segment_alloc of {e['addr']:#x} that the later state lacks")
        for addr in blocks:
            if not any(s <= addr < s + n for s, n in segs.items()):
                fail(f"before event {i}: block {addr:#x} lies in no segment (MemoryViz.js throws)")


def try_torch(snap):
    try:
        from torch.cuda import _memory_viz as mv
    except Exception as e:  # noqa: BLE001 - any import failure means: no torch here
        print(f"torch not importable ({type(e).__name__}); memory_viz functions not run")
        return
    if not hasattr(mv, "segsum"):
        print("torch's _memory_viz predates the dict snapshot layout (torch < 2.1); not run")
        return
    mv.segsum(snap)
    mv.trace(snap)
    for fn in ("trace_plot", "segment_plot"):
        if hasattr(mv, fn):
            html = getattr(mv, fn)(snap)
            if "snapshot.pickle" not in html:
                fail(f"{fn} made no page")
    print("torch _memory_viz: segsum, trace, trace_plot, segment_plot ran")


if __name__ == "__main__":
    main(sys.argv[1])
