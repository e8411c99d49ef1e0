#!/usr/bin/python3
"""Writes tests/core/data/llama_golden.bin (or qwen3_golden.bin): a tiny Llama's initial
parameters, logits, loss and gradients, and a 10-step AdamW loss trajectory, computed by
PyTorch (scripts/torch_llama.py).

--model llama (the default, llama_golden.bin) is Qwen2-like so that every optional piece of
Llama 3 and Qwen2 is exercised: grouped-query attention (4 query heads, 2 kv heads), q/k/v
bias, llama3 rope scaling whose three wavelength bands (kept, interpolated, divided) each hold
one of the head's 4 frequencies, an untied head.
--model qwen3 (qwen3_golden.bin) is Qwen3-like: the per-head q/k RMSNorms, no biases, a tied
head, rope_theta 1e6 without scaling, the same sizes.
Init: torch_llama's (weights N(0, 0.02), RMSNorm gains 1 + 0.1 N(0, 1), biases 0.02 N(0, 1)),
then the q/k/v weights times QKV_SCALE so that the attention depends on the rotary angles.

memfit's golden test (tests/core/llama_golden_test.cpp) reads the committed files and never
needs PyTorch. Run with Debian's python3-torch (apt-get install python3-torch):
    /usr/bin/python3 scripts/make_llama_golden.py [--model llama|qwen3] [--out PATH]
Deterministic: torch.manual_seed, one thread, so two runs on one machine write identical bytes
(another CPU's kernels may differ in the last bit: gpt_golden.bin regenerated here does).

Format: make_gpt_golden.py's MFGOLDEN version 1 (its encoder and reader are reused).
Entries, in order:
  config i32(16) [vocab, seq_len, layers, hidden, heads, kv_heads, head_dim, intermediate,
                  tied, qkv_bias, proj_bias, mlp_bias, B, T, steps, qk_norm]
                  (llama_golden.bin, written before qk_norm, has the first 15),
  rope f32(6) [rope_theta, factor, low_freq_factor, high_freq_factor,
               original_max_position_embeddings, rms_norm_eps] (factor 0: no scaling),
  adamw f32(5) [lr, beta1, beta2, eps, weight_decay], tokens i32(B,T), targets i32(B,T),
  param/<name> (initial, memfit's names and order), logits f32(B,T,V), loss f32(1),
  grad/<name>, trajectory f32(steps): step k records the loss, runs backward, then one
  torch.optim.AdamW step (foreach=False, weight decay on every parameter) in f32.
After writing, the file is read back and checked against the values in memory.
"""

import argparse
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gpt_golden import decode, encode  # noqa: E402  (the shared MFGOLDEN format)
from torch_llama import (Llama3Scaling, LlamaConfig, TorchLlama, init_parameters,  # noqa: E402
                         rope_inv_freq)

SCALING = Llama3Scaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_position_embeddings=64)
CONFIGS = {
    "llama": LlamaConfig(vocab=64, seq_len=16, layers=2, hidden=32, heads=4, kv_heads=2,
                         head_dim=8, intermediate=48, tied_head=False, qkv_bias=True,
                         proj_bias=False, mlp_bias=False, rms_norm_eps=1e-6,
                         rope_theta=10000.0, rope_scaling=SCALING),
    "qwen3": LlamaConfig(vocab=64, seq_len=16, layers=2, hidden=32, heads=4, kv_heads=2,
                         head_dim=8, intermediate=48, tied_head=True, qkv_bias=False,
                         proj_bias=False, mlp_bias=False, qk_norm=True, rms_norm_eps=1e-6,
                         rope_theta=1000000.0, rope_scaling=None),
}
CFG = CONFIGS["llama"]  # main() sets the one asked for
B, T, STEPS = 4, 16, 10
LR, BETA1, BETA2, EPS, WD = 1e-3, 0.9, 0.999, 1e-8, 0.01
SEED = 20240612
# At std 0.02 the attention scores are ~1e-3, the softmax nearly uniform, and a wrong rotary
# angle or band would move the logits by little more than the tolerance; q, k, v weights at
# std 0.02 * QKV_SCALE make the scores O(1), so where each position attends depends on rotary.
QKV_SCALE = 8.0


def compute():
    """Ordered list of (name, numpy array) entries."""
    torch.manual_seed(SEED)
    params = init_parameters(CFG)
    with torch.no_grad():
        for name, p in params.items():
            if name.endswith("self_attn.qkv.weight"):
                p.mul_(QKV_SCALE)
    tokens = torch.randint(0, CFG.vocab, (B, T), dtype=torch.int64)
    targets = torch.randint(0, CFG.vocab, (B, T), dtype=torch.int64)
    model = TorchLlama(CFG, params=params)

    s = CFG.rope_scaling or Llama3Scaling(factor=0.0, low_freq_factor=0.0,
                                          high_freq_factor=0.0,
                                          original_max_position_embeddings=0)
    entries = [
        ("config", np.array([CFG.vocab, CFG.seq_len, CFG.layers, CFG.hidden, CFG.heads,
                             CFG.kv_heads, CFG.head_dim, CFG.intermediate, int(CFG.tied_head),
                             int(CFG.qkv_bias), int(CFG.proj_bias), int(CFG.mlp_bias), B, T,
                             STEPS, int(CFG.qk_norm)], dtype=np.int32)),
        ("rope", np.array([CFG.rope_theta, s.factor, s.low_freq_factor, s.high_freq_factor,
                           s.original_max_position_embeddings, CFG.rms_norm_eps],
                          dtype=np.float32)),
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


def check_rope():
    """The llama3 frequencies against the rule in double precision, and each band used once."""
    hs, s = CFG.hs, CFG.rope_scaling
    got = rope_inv_freq(hs, CFG.rope_theta, s).double().numpy()
    bands = []
    for i in range(hs // 2):
        f = 1.0 / CFG.rope_theta ** (2 * i / hs)
        wl = 2 * math.pi / f
        if wl < s.original_max_position_embeddings / s.high_freq_factor:
            want, band = f, "kept"
        elif wl > s.original_max_position_embeddings / s.low_freq_factor:
            want, band = f / s.factor, "divided"
        else:
            sm = ((s.original_max_position_embeddings / wl - s.low_freq_factor) /
                  (s.high_freq_factor - s.low_freq_factor))
            want, band = (1 - sm) * f / s.factor + sm * f, "interpolated"
        assert abs(got[i] - want) <= 1e-6 * want, (i, got[i], want)
        bands.append(band)
    assert set(bands) == {"kept", "interpolated", "divided"}, bands
    return got


def verify(path, entries):
    with open(path, "rb") as f:
        got = decode(f.read())
    assert list(got) == [n for n, _ in entries], "entry names/order differ"
    for name, arr in entries:
        g = got[name]
        assert g.shape == arr.shape and g.dtype.kind == arr.dtype.kind, name
        assert np.array_equal(g, arr), f"{name}: values differ"
    V, Tmax, L, C, H, G, hs, Fi, tied, qb, pb, mb, b, t, steps, qn = (
        int(x) for x in got["config"])
    assert got["rope"].shape == (6,) and got["adamw"].shape == (5,)
    assert got["logits"].shape == (b, t, V) and got["trajectory"].shape == (steps,)
    assert got["param/wte"].shape == (V, C)
    assert got[f"param/layers.{L - 1}.self_attn.qkv.weight"].shape == ((H + 2 * G) * hs, C)
    assert got[f"param/layers.{L - 1}.mlp.gate_up.weight"].shape == (2 * Fi, C)
    assert ("param/head.weight" in got) == (tied == 0)
    assert ("param/layers.0.self_attn.qkv.bias" in got) == (qb != 0)
    assert ("param/layers.0.self_attn.proj.bias" in got) == (pb != 0)
    assert ("param/layers.0.mlp.down.bias" in got) == (mb != 0)
    assert ("param/layers.0.self_attn.q_norm.weight" in got) == (qn != 0)
    for name in got:
        if name.startswith("grad/"):
            assert np.abs(got[name]).max() > 0, f"{name}: all zero tests nothing"
    assert abs(float(got["loss"][0]) - float(got["trajectory"][0])) == 0.0
    # Initial loss near ln(V) (small init), and training on one batch lowers it.
    assert abs(float(got["loss"][0]) - np.log(V)) < 0.1, got["loss"]
    assert got["trajectory"][-1] < got["trajectory"][0]
    return got


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(CONFIGS), default="llama")
    ap.add_argument("--out", help="default: tests/core/data/<model>_golden.bin")
    args = ap.parse_args()
    global CFG
    CFG = CONFIGS[args.model]
    if args.out is None:
        args.out = os.path.join(here, "..", "tests", "core", "data", f"{args.model}_golden.bin")
    torch.set_num_threads(1)  # one reduction order, so the bytes do not depend on the machine
    inv_freq = (check_rope() if CFG.rope_scaling else
                rope_inv_freq(CFG.hs, CFG.rope_theta).double().numpy())
    entries = compute()
    data = encode(entries)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, args.out)
    got = verify(args.out, entries)
    print(f"wrote {args.out}: {len(data)} bytes, {len(got)} entries, torch {torch.__version__}, "
          f"inv_freq {np.array2string(inv_freq, precision=6)}, "
          f"loss {float(got['loss'][0]):.6f}, trajectory[-1] {float(got['trajectory'][-1]):.6f}")


if __name__ == "__main__":
    main()
