#!/usr/bin/python3
"""Writes tests/core/data/gpt_golden.bin: a tiny GPT's initial parameters, logits, loss and
gradients, and a 10-step AdamW loss trajectory, computed by PyTorch (scripts/torch_gpt.py).

memfit's golden test (tests/core) reads the committed file and never needs PyTorch. Run with
Debian's python3-torch:   /usr/bin/python3 scripts/make_gpt_golden.py [--out PATH]
Deterministic: torch.manual_seed, one thread, so two runs write identical bytes.

Format (little-endian; the shared spec's "golden file"):
  char magic[8] = "MFGOLDEN"; u32 version = 1; u32 count; then count entries:
  u32 name_len; char name[name_len]; u32 dtype (0 f32, 1 i32); u32 ndim; i64 dims[ndim];
  numel * 4 bytes of data.
Entries: config i32(10) [vocab, seq_len, layers, hidden, heads, mlp_ratio, tied, B, T, steps],
adamw f32(5) [lr, beta1, beta2, eps, weight_decay], tokens i32(B,T), targets i32(B,T),
param/<name> (initial), logits f32(B,T,V), loss f32(1), grad/<name>, trajectory f32(steps):
step k records the loss, runs backward, then one torch.optim.AdamW step (foreach=False) in f32.
After writing, the file is read back and checked against the values in memory.
"""

import argparse
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import GptConfig, TorchGpt, init_parameters  # noqa: E402

MAGIC = b"MFGOLDEN"
VERSION = 1
DT_F32, DT_I32 = 0, 1

CFG = GptConfig(vocab=64, seq_len=16, layers=2, hidden=32, heads=4, mlp_ratio=4, tied_head=True)
B, T, STEPS = 4, 16, 10
LR, BETA1, BETA2, EPS, WD = 1e-3, 0.9, 0.999, 1e-8, 0.01
SEED = 20240611


def compute():
    """Ordered list of (name, numpy array) entries."""
    torch.manual_seed(SEED)
    params = init_parameters(CFG)
    tokens = torch.randint(0, CFG.vocab, (B, T), dtype=torch.int64)
    targets = torch.randint(0, CFG.vocab, (B, T), dtype=torch.int64)
    model = TorchGpt(CFG, params=params)

    entries = [
        ("config", np.array([CFG.vocab, CFG.seq_len, CFG.layers, CFG.hidden, CFG.heads,
                             CFG.mlp_ratio, int(CFG.tied_head), B, T, STEPS], dtype=np.int32)),
        ("adamw", np.array([LR, BETA1, BETA2, EPS, WD], dtype=np.float32)),
        ("tokens", tokens.to(torch.int32).numpy()),
        ("targets", targets.to(torch.int32).numpy()),
    ]
    for name, p in params.items():
        entries.append(("param/" + name, p.detach().clone().numpy()))

    loss, logits = model(tokens, targets)
    loss.backward()
    entries.append(("logits", logits.detach().clone().numpy()))
    entries.append(("loss", np.array([loss.item()], dtype=np.float32)))
    for name, p in params.items():
        entries.append(("grad/" + name, p.grad.detach().clone().numpy()))

    # The trajectory restarts from the initial parameters (step 0's loss is `loss` again).
    for p in params.values():
        p.grad = None
    opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=(BETA1, BETA2), eps=EPS,
                            weight_decay=WD, foreach=False)
    traj = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step_loss, _ = model(tokens, targets)
        traj.append(step_loss.item())
        step_loss.backward()
        opt.step()
    entries.append(("trajectory", np.array(traj, dtype=np.float32)))
    return entries


def encode(entries):
    out = bytearray(MAGIC)
    out += struct.pack("<II", VERSION, len(entries))
    for name, arr in entries:
        if arr.dtype == np.float32:
            dt, le = DT_F32, "<f4"
        elif arr.dtype == np.int32:
            dt, le = DT_I32, "<i4"
        else:
            raise TypeError(f"{name}: dtype {arr.dtype} (only f32, i32)")
        nb = name.encode("ascii")
        out += struct.pack("<I", len(nb)) + nb
        out += struct.pack("<II", dt, arr.ndim)
        out += struct.pack(f"<{arr.ndim}q", *arr.shape)
        out += np.ascontiguousarray(arr, dtype=le).tobytes()
    return bytes(out)


def decode(data):
    """The reader: dict name -> numpy array; raises ValueError on any malformed byte."""
    if data[:8] != MAGIC:
        raise ValueError("bad magic")
    version, count = struct.unpack_from("<II", data, 8)
    if version != VERSION:
        raise ValueError(f"version {version}, expected {VERSION}")
    off, res = 16, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + n].decode("ascii")
        off += n
        dt, ndim = struct.unpack_from("<II", data, off)
        off += 8
        dims = struct.unpack_from(f"<{ndim}q", data, off)
        off += 8 * ndim
        numel = int(np.prod(dims, dtype=np.int64)) if ndim else 1
        if dt not in (DT_F32, DT_I32) or off + 4 * numel > len(data):
            raise ValueError(f"{name}: dtype {dt} or size out of range")
        arr = np.frombuffer(data, dtype="<f4" if dt == DT_F32 else "<i4", count=numel,
                            offset=off).reshape(dims)
        off += 4 * numel
        if name in res:
            raise ValueError(f"duplicate entry {name}")
        res[name] = arr
    if off != len(data):
        raise ValueError(f"{len(data) - off} trailing bytes")
    return res


def verify(path, entries):
    with open(path, "rb") as f:
        got = decode(f.read())
    assert list(got) == [n for n, _ in entries], "entry names/order differ"
    for name, arr in entries:
        g = got[name]
        assert g.shape == arr.shape and g.dtype.kind == arr.dtype.kind, name
        assert np.array_equal(g, arr), f"{name}: values differ"
    cfg = got["config"]
    V, Tmax, L, C, H, R, tied, b, t, steps = (int(x) for x in cfg)
    assert got["logits"].shape == (b, t, V) and got["trajectory"].shape == (steps,)
    assert got["param/wte"].shape == (V, C) and got[f"param/h.{L - 1}.mlp.fc.weight"].shape == (
        R * C, C)
    assert ("param/head.weight" in got) == (tied == 0)
    assert abs(float(got["loss"][0]) - float(got["trajectory"][0])) == 0.0
    # Initial loss near ln(V) (small init), and training on one batch lowers it.
    assert abs(float(got["loss"][0]) - np.log(V)) < 0.1, got["loss"]
    assert got["trajectory"][-1] < got["trajectory"][0]
    return got


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "core", "data",
                                                  "gpt_golden.bin"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # one reduction order, so the bytes do not depend on the machine
    entries = compute()
    data = encode(entries)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, args.out)
    got = verify(args.out, entries)
    print(f"wrote {args.out}: {len(data)} bytes, {len(got)} entries, torch {torch.__version__}, "
          f"loss {float(got['loss'][0]):.6f}, trajectory[-1] {float(got['trajectory'][-1]):.6f}")


if __name__ == "__main__":
    main()
