#!/usr/bin/python3
"""Writes tests/profiler/data/torch_snapshot.pickle: a memory snapshot in the layout PyTorch 2.x's
torch.cuda.memory._snapshot() returns (after torch.cuda.memory._record_memory_history()),
pickled by Python's own pickle, for memfit's snapshot import and `memfit replay` tests.

Why built by hand: this machine has no GPU, so _snapshot() cannot run. The dict below has the
keys and value types PyTorch 2.x writes (torch/cuda/memory.py, the `_snapshot` docstring;
torch/csrc/cuda/memory_snapshot.cpp): segments with device, address, total_size,
allocated_size, active_size, requested_size, stream, segment_type, segment_pool_id,
is_expandable, frames and blocks (address, size, requested_size, state, frames); one trace
list per device of entries with action, addr, size, stream, time_us, frames (oom: device_free
and no addr); allocator_settings, including max_split_size = SIZE_MAX as PyTorch reports
"unlimited". Trace sizes are requested sizes (PyTorch records orig_size); block sizes are
rounded up to 512 bytes, as the caching allocator does. No "category" keys: _snapshot()
writes none.

The story (one device, stream 0, a 20 MiB large segment A held from before recording):
  before recording: weights W1, W2 (4 MiB each) and X (3,000,000 B) allocated in A
  step 1: X freed; activations a1, a2 in A; small segment B (2 MiB) allocated; temporaries
          t1, t2 in B; t1, a2, a1 freed; an OOM of 40 MiB (PyTorch records it, nothing
          changes)
  step 2: a3 in A, t3 in B; t2 freed on a side stream's behalf (free_requested only: its
          completion was not recorded, it is still active_pending_free at the end); a3 freed
  snapshot: A = W1 W2 free; B = t3 free t2(pending) free

Deterministic (no clocks, no randomness); prints the figures the tests assert.
Usage: /usr/bin/python3 scripts/make_snapshot_fixture.py [OUT]
"""
import os
import pickle
import sys

MiB = 1 << 20
SIZE_MAX = (1 << 64) - 1
A = 0x7F3A00000000
B = A + 20 * MiB
T0 = 1_700_000_000_000_000  # time_us; PyTorch's are microseconds since the epoch


def rounded(n):
    return (n + 511) // 512 * 512


def frames(*names):
    # Innermost first, as PyTorch records Python frames.
    return [{"filename": "train.py", "line": 10 + i, "name": n} for i, n in enumerate(names)]


def build():
    trace = []
    t = [T0]

    def entry(action, addr, size, fr=()):
        t[0] += 7
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t[0],
             "frames": frames(*fr)}
        trace.append(e)

    def alloc(addr, size, *fr):
        entry("alloc", addr, size, fr)

    def free(addr, size, *fr, completed=True):
        entry("free_requested", addr, size, fr)
        if completed:
            entry("free_completed", addr, size, fr)

    W1, W2, X = A, A + 4 * MiB, A + 8 * MiB
    x_size = 3_000_000
    a1, a1_size = X, 2_000_000
    a2, a2_size = X + rounded(2_000_000), 1_500_000
    t1, t1_size = B, 300_000
    t2, t2_size = B + rounded(300_000), 200_000
    a3, a3_size = X, 5_000_000
    t3, t3_size = B, 100_000

    # step 1
    free(X, x_size, "load_batch", "train_step")
    alloc(a1, a1_size, "forward", "train_step")
    alloc(a2, a2_size, "forward", "train_step")
    entry("segment_alloc", B, 2 * MiB, ("forward", "train_step"))
    alloc(t1, t1_size, "attention", "forward")
    alloc(t2, t2_size, "attention", "forward")
    free(t1, t1_size, "attention", "forward")
    free(a2, a2_size, "backward", "train_step")
    free(a1, a1_size, "backward", "train_step")
    t[0] += 7
    trace.append({"action": "oom", "size": 40 * MiB, "stream": 0, "time_us": t[0],
                  "device_free": 1 * MiB, "frames": frames("huge_op", "train_step")})
    # step 2
    alloc(a3, a3_size, "forward", "train_step")
    alloc(t3, t3_size, "attention", "forward")
    free(t2, t2_size, "side_stream_copy", "train_step", completed=False)
    free(a3, a3_size, "backward", "train_step")
    t[0] += 7
    trace.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": t[0],
                  "frames": []})

    def block(addr, size, requested, state, fr=()):
        return {"address": addr, "size": size, "requested_size": requested, "state": state,
                "frames": frames(*fr)}

    seg_a_blocks = [
        block(W1, 4 * MiB, 4 * MiB, "active_allocated", ("init_weights",)),
        block(W2, 4 * MiB, 4 * MiB, "active_allocated", ("init_weights",)),
        block(X, 12 * MiB, 0, "inactive"),
    ]
    b_t3 = rounded(t3_size)
    b_t2 = rounded(t2_size)
    seg_b_blocks = [
        block(t3, b_t3, t3_size, "active_allocated", ("attention", "forward")),
        block(t3 + b_t3, t2 - (t3 + b_t3), 0, "inactive"),
        block(t2, b_t2, t2_size, "active_pending_free", ("attention", "forward")),
        block(t2 + b_t2, B + 2 * MiB - (t2 + b_t2), 0, "inactive"),
    ]

    def segment(addr, total, kind, blocks):
        alloc_sz = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        active_sz = sum(b["size"] for b in blocks if b["state"].startswith("active"))
        req = sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
        assert sum(b["size"] for b in blocks) == total
        return {"device": 0, "address": addr, "total_size": total, "allocated_size": alloc_sz,
                "active_size": active_sz, "requested_size": req, "stream": 0,
                "segment_type": kind, "segment_pool_id": (0, 0), "is_expandable": False,
                "frames": [], "blocks": blocks}

    snapshot = {
        "segments": [segment(A, 20 * MiB, "large", seg_a_blocks),
                     segment(B, 2 * MiB, "small", seg_b_blocks)],
        "device_traces": [trace],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": SIZE_MAX,
            "garbage_collection_threshold": 0.0, "expandable_segments": False,
            "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {str(1 << k): 0 for k in range(16)},
        },
    }
    return snapshot


def expected(snap):
    """The figures memfit's import must find, computed by its documented rules."""
    segs = snap["segments"]
    trace = snap["device_traces"][0]
    out = {
        "num_segments": len(segs),
        "reserved_bytes": sum(s["total_size"] for s in segs),
        "allocated_bytes": sum(s["allocated_size"] for s in segs),
        "active_bytes": sum(s["active_size"] for s in segs),
        "largest_segment_bytes": max(s["total_size"] for s in segs),
        "num_entries": len(trace),
    }
    seg_delta = [(e["action"], e["size"]) for e in trace if e["action"].startswith("segment_")]
    start = out["reserved_bytes"] - sum(s if a == "segment_alloc" else -s for a, s in seg_delta)
    now = peak = start
    for a, s in seg_delta:
        now += s if a == "segment_alloc" else -s
        peak = max(peak, now)
    out["trace_peak_reserved_bytes"] = peak
    # Frees: free_completed, or free_requested without a later completion.
    completed = set()
    is_free = [False] * len(trace)
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        if e["action"] == "free_completed":
            completed.add(e["addr"])
            is_free[i] = True
        elif e["action"] == "alloc":
            completed.discard(e["addr"])
        elif e["action"] == "free_requested":
            is_free[i] = e["addr"] not in completed
            completed.discard(e["addr"])
    live, seen, initial = {}, set(), 0
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            seen.add(e["addr"])
        elif is_free[i] and e["addr"] not in seen:
            seen.add(e["addr"])
            live[e["addr"]] = e["size"]
            initial += 1
    for s in segs:
        for b in s["blocks"]:
            if b["state"] == "active_allocated" and b["address"] not in seen:
                live[b["address"]] = b["requested_size"]
                initial += 1
    peak_live = sum(live.values())
    allocs = frees = 0
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            allocs += 1
        elif is_free[i] and e["addr"] in live:
            del live[e["addr"]]
            frees += 1
        peak_live = max(peak_live, sum(live.values()))
    out.update(num_initially_live=initial, num_allocs=allocs, num_frees=frees,
               peak_live_bytes=peak_live, end_live_bytes=sum(live.values()))
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        root, "tests", "profiler", "data", "torch_snapshot.pickle")
    snap = build()
    data = pickle.dumps(snap, protocol=4)  # what torch's pickle.dump of a snapshot writes by default
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    print(f"wrote {path} ({len(data)} bytes, protocol 4)")
    for k, v in expected(snap).items():
        print(f"{k} = {v}")


if __name__ == "__main__":
    main()
