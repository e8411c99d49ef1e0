#!/usr/bin/python3
"""Writes tests/core/data/conv_golden.bin: torch.nn.functional.conv2d forward and backward on a
few small convolutions (strides, padding, odd sizes), for memfit's conv2d tests.

memfit's test (tests/core/conv_golden_test.cpp) reads the committed file and never needs
PyTorch. Run with Debian's python3-torch:   /usr/bin/python3 scripts/make_conv_golden.py [--out PATH]
Deterministic: torch.manual_seed, one thread, so two runs write identical bytes.

Format: the shared "golden file" layout (see scripts/make_gpt_golden.py), little-endian:
  char magic[8] = "MFGOLDEN"; u32 version = 1; u32 count; then count entries:
  u32 name_len; char name[name_len]; u32 dtype (0 f32, 1 i32); u32 ndim; i64 dims[ndim];
  numel * 4 bytes of data.
Entries: cases i32(1); for each case i, "case<i>/desc" i32(11) [n, h, w, c, k, r, s, stride_h,
stride_w, pad_h, pad_w], and f32 tensors in memfit's channels-last layouts:
  case<i>/inp (N,H,W,C), case<i>/weight (K,R,S,C), case<i>/dout (N,P,Q,K),
  case<i>/out (N,P,Q,K), case<i>/dinp (N,H,W,C), case<i>/dweight (K,R,S,C).
Inputs are f32 values; the convolution and its gradients are computed in float64 from them
(torch's NCHW layout via permutes) and rounded to f32 once, so the file holds the exact
answer to within f32 rounding.
"""

import argparse
import os
import struct

import torch

MAGIC = b"MFGOLDEN"
VERSION = 1
DT_F32, DT_I32 = 0, 1
SEED = 20250301

# n, h, w, c, k, r, s, stride_h, stride_w, pad_h, pad_w
CASES = [
    (2, 5, 7, 3, 4, 3, 3, 1, 1, 1, 1),
    (3, 9, 6, 5, 7, 3, 2, 2, 3, 1, 0),
    (1, 8, 8, 17, 9, 1, 1, 1, 1, 0, 0),
    (2, 11, 10, 4, 6, 4, 3, 3, 2, 2, 1),
]


def entry(name, dtype, tensor):
    dims = list(tensor.shape)
    data = tensor.contiguous().numpy().tobytes()
    head = struct.pack("<I", len(name)) + name.encode() + struct.pack("<II", dtype, len(dims))
    return head + struct.pack("<%dq" % len(dims), *dims) + data


def make_case(desc):
    n, h, w, c, k, r, s, sh, sw, ph, pw = desc
    inp = torch.rand(n, h, w, c, dtype=torch.float32) * 2 - 1
    weight = torch.rand(k, r, s, c, dtype=torch.float32) * 2 - 1
    p = (h + 2 * ph - r) // sh + 1
    q = (w + 2 * pw - s) // sw + 1
    dout = torch.rand(n, p, q, k, dtype=torch.float32) * 2 - 1
    # NHWC -> NCHW, KRSC -> KCRS, in float64 with gradients.
    x = inp.double().permute(0, 3, 1, 2).contiguous().requires_grad_(True)
    wt = weight.double().permute(0, 3, 1, 2).contiguous().requires_grad_(True)
    y = torch.nn.functional.conv2d(x, wt, stride=(sh, sw), padding=(ph, pw))
    assert tuple(y.shape) == (n, k, p, q)
    y.backward(dout.double().permute(0, 3, 1, 2))
    out = y.detach().permute(0, 2, 3, 1).float()
    dinp = x.grad.permute(0, 2, 3, 1).float()
    dweight = wt.grad.permute(0, 2, 3, 1).float()
    return {"inp": inp, "weight": weight, "dout": dout, "out": out, "dinp": dinp,
            "dweight": dweight}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "core", "data",
                                                  "conv_golden.bin"))
    args = ap.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    entries = [entry("cases", DT_I32, torch.tensor([len(CASES)], dtype=torch.int32))]
    cases = []
    for i, desc in enumerate(CASES):
        t = make_case(desc)
        cases.append(t)
        entries.append(entry("case%d/desc" % i, DT_I32, torch.tensor(desc, dtype=torch.int32)))
        for name in ("inp", "weight", "dout", "out", "dinp", "dweight"):
            entries.append(entry("case%d/%s" % (i, name), DT_F32, t[name]))
    blob = MAGIC + struct.pack("<II", VERSION, len(entries)) + b"".join(entries)
    with open(args.out, "wb") as f:
        f.write(blob)
    # Read back: the bytes hold what was computed.
    with open(args.out, "rb") as f:
        assert f.read() == blob
    print("wrote %s: %d cases, %d bytes" % (os.path.normpath(args.out), len(CASES), len(blob)))


if __name__ == "__main__":
    main()
