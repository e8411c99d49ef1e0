#!/usr/bin/env python3
"""PyTorch anchor for bench/gpu_step_bench.cpp: GPT-2 124M training steps on the same GPU.

    /usr/bin/python3 bench/torch_gpu_step.py            # table, then one JSON line
    MEMFIT_BENCH_STEPS=10 MEMFIT_BENCH_BATCH=4 /usr/bin/python3 bench/torch_gpu_step.py

The same model as memfit's `gpt2` preset (vocab 50257, 12 layers, hidden 768, 12 heads, tied
head, tanh GELU), written out in eager PyTorch: attention materializes the (T, T) scores and
softmax as memfit does (no fused SDPA/flash kernel, so the comparison is of equal algorithms;
--sdpa switches to F.scaled_dot_product_attention where it exists, for information).
Variants (names as in gpu_step_bench):
  f32                    fp32 everywhere, TF32 off (memfit's default)
  bf16                   torch.autocast(bfloat16); fp32 weights are the masters
  bf16+ckpt              + torch.utils.checkpoint around every block
  bf16+ckpt+offload      + AdamW on the CPU: fp32 masters and moments in pinned host memory,
                         gradients copied device -> host, torch.optim.AdamW on the CPU, weights
                         copied back (the simple, non-overlapped form of ZeRO-Offload)
Fixed work: 2 warm-up steps, then MEMFIT_BENCH_STEPS (default 5) timed steps each ended by
torch.cuda.synchronize(); median step time; peaks from torch.cuda.max_memory_allocated /
max_memory_reserved, reset before each timed step.
Without torch or a CUDA device it prints "SKIP: ..." and exits 0.

    python3 bench/torch_gpu_step.py --compare memfit.json torch.json

prints memfit's JSON (gpu_step_bench's "JSON ..." line) beside PyTorch's, variant by variant,
with issue 6's targets: tokens/s >= PyTorch eager at equal settings, peak allocated <= PyTorch's,
offload step <= 1.15x the on-device optimizer step. torch.json may be {} (no anchor). Needs no
torch. tests/gpu/run.sh calls it.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def env_int(name, default):
    v = os.environ.get(name, "")
    try:
        x = int(v) if v else default
        return x if x > 0 else default
    except ValueError:
        return default


def gib(b):
    return f"{b / 2**30:.2f}G"


def compare(memfit_path, torch_path):
    with open(memfit_path) as f:
        m = json.load(f)
    with open(torch_path) as f:
        t = json.load(f)
    tb = {r["name"]: r for r in t.get("results", []) if "step_ms" in r}
    anchor = (f"PyTorch {t.get('torch', '?')} eager ({t.get('attention', '?')} attention)"
              if t else "PyTorch: not run")
    print(f"GPT-2 124M step, seq {m.get('seq')}, batch {m.get('batch')} on {m.get('device')}: "
          f"memfit vs {anchor}")
    print(f"{'variant':<24}{'memfit tok/s':>13}{'torch tok/s':>12}{'ratio':>7}{'':>3}"
          f"{'memfit peak':>12}{'torch peak':>11}{'ratio':>7}")
    missed = []
    for r in m.get("results", []):
        name = r["name"]
        if "step_ms" not in r:
            print(f"{name:<24} memfit FAILED: {r.get('error', '?')[:80]}")
            missed.append(name + " failed")
            continue
        o = tb.get(name)
        if o is None:
            print(f"{name:<24}{r['tokens_per_s']:>13.0f}{'-':>12}{'-':>7}{'':>3}"
                  f"{gib(r['peak_allocated']):>12}{'-':>11}{'-':>7}")
            continue
        tr = r["tokens_per_s"] / o["tokens_per_s"]
        pr = r["peak_allocated"] / o["peak_allocated"]
        flag = ("" if tr >= 1 else " tok/s<torch") + ("" if pr <= 1 else " peak>torch")
        if flag:
            missed.append(name + flag)
        print(f"{name:<24}{r['tokens_per_s']:>13.0f}{o['tokens_per_s']:>12.0f}{tr:>7.2f}{'':>3}"
              f"{gib(r['peak_allocated']):>12}{gib(o['peak_allocated']):>11}{pr:>7.2f}{flag}")
    ratio = m.get("offload_ratio", 0)
    line = (f"offload step / on-device step (bf16+ckpt): memfit {ratio:.2f}x "
            f"(target <= {m.get('offload_target', 1.15)}: {'met' if 0 < ratio <= 1.15 else 'MISSED'})"
            f"; with delayed update {m.get('offload_ratio_dpu', 0):.2f}x")
    if t.get("offload_ratio"):
        line += f"; PyTorch (simple CPU AdamW) {t['offload_ratio']:.2f}x"
    print(line)
    if ratio == 0 or ratio > 1.15:
        missed.append("offload ratio")
    if tb:
        print("targets: " + ("all met" if not missed else "MISSED: " + ", ".join(missed)))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sdpa", action="store_true", help="fused scaled_dot_product_attention")
    ap.add_argument("--compare", nargs=2, metavar=("MEMFIT_JSON", "TORCH_JSON"),
                    help="print memfit beside PyTorch from the two benchmarks' JSON lines")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        import torch.utils.checkpoint as ckpt
    except ImportError as e:
        print(f"SKIP: no torch: {e}")
        return 0
    if not torch.cuda.is_available():
        print(f"SKIP: torch {torch.__version__} sees no CUDA device "
              f"(built with CUDA {torch.version.cuda})")
        return 0

    steps = env_int("MEMFIT_BENCH_STEPS", 5)
    batch = env_int("MEMFIT_BENCH_BATCH", 8)
    seq = min(env_int("MEMFIT_BENCH_SEQ", 1024), 1024)
    warmup = 2
    vocab, layers, hidden, heads = 50257, 12, 768, 12
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    use_sdpa = args.sdpa and hasattr(F, "scaled_dot_product_attention")

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln2 = nn.LayerNorm(hidden)
            self.fc = nn.Linear(hidden, 4 * hidden)
            self.fc_proj = nn.Linear(4 * hidden, hidden)
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)),
                                 persistent=False)

        def attn(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(x).split(c, dim=2)
            q = q.view(b, t, heads, c // heads).transpose(1, 2)
            k = k.view(b, t, heads, c // heads).transpose(1, 2)
            v = v.view(b, t, heads, c // heads).transpose(1, 2)
            if use_sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
                att = F.softmax(att, dim=-1)
                y = att @ v
            return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self, checkpoint):
            super().__init__()
            self.wte = nn.Embedding(vocab, hidden)
            self.wpe = nn.Embedding(1024, hidden)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(hidden)
            self.checkpoint = checkpoint
            for n, p in self.named_parameters():  # GPT-2's initialization
                if p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * layers) if n.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif n.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            t = idx.size(1)
            x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
            for blk in self.blocks:
                if self.checkpoint:
                    try:
                        x = ckpt.checkpoint(blk, x, use_reentrant=False)
                    except TypeError:  # a torch without the keyword: its reentrant form
                        x = ckpt.checkpoint(blk, x)
                else:
                    x = blk(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
            return F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))

    gen = torch.Generator().manual_seed(12345)
    idx = torch.randint(0, vocab, (batch, seq), generator=gen).to(dev)
    tgt = torch.randint(0, vocab, (batch, seq), generator=gen).to(dev)

    def run(name, bf16, checkpoint, offload):
        torch.manual_seed(1337)
        model = GPT(checkpoint).to(dev)
        params = [p for p in model.parameters()]
        if offload:
            # fp32 masters, moments (inside AdamW) and gradient staging on the host, pinned.
            masters = [p.detach().to("cpu").pin_memory() for p in params]
            for m in masters:
                m.grad = torch.zeros_like(m).pin_memory()
            opt = torch.optim.AdamW(masters, lr=3e-4, weight_decay=0.0)
        else:
            kw = {"fused": True} if "fused" in torch.optim.AdamW.__init__.__code__.co_varnames \
                else {}
            try:
                opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.0, **kw)
            except (RuntimeError, TypeError):
                opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.0)

        def step():
            for p in params:
                p.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = model(idx, tgt)
            loss.backward()
            if offload:
                for p, m in zip(params, masters):
                    m.grad.copy_(p.grad, non_blocking=True)
                torch.cuda.synchronize()
                opt.step()
                for p, m in zip(params, masters):
                    p.data.copy_(m, non_blocking=True)
            else:
                opt.step()
            return loss

        times, peak_a, peak_r, loss = [], 0, 0, 0.0
        for i in range(warmup + steps):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            loss = step()
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) * 1e3
            if i >= warmup:
                times.append(dt)
                peak_a = max(peak_a, torch.cuda.max_memory_allocated())
                peak_r = max(peak_r, torch.cuda.max_memory_reserved())
        ms = statistics.median(times)
        r = {"name": name, "step_ms": round(ms, 3),
             "tokens_per_s": round(batch * seq / (ms / 1e3), 1),
             "peak_allocated": int(peak_a), "peak_reserved": int(peak_r),
             "loss": round(float(loss.item()), 5)}
        del model, opt, params
        torch.cuda.empty_cache()
        return r

    variants = [("f32", False, False, False), ("bf16", True, False, False),
                ("bf16+ckpt", True, True, False), ("bf16+ckpt+offload", True, True, True)]
    name = torch.cuda.get_device_name(0)
    print(f"torch_gpu_step: torch {torch.__version__} gpt2 seq {seq} batch {batch} on {name}; "
          f"attention {'sdpa' if use_sdpa else 'eager math'}; median of {steps} steps")
    results = []
    for v in variants:
        try:
            r = run(*v)
            print(f"  {r['name']:<24} {r['step_ms']:9.1f} ms {r['tokens_per_s']:11.0f} tok/s  "
                  f"peak alloc {r['peak_allocated'] / 2**30:7.2f} GiB  reserved "
                  f"{r['peak_reserved'] / 2**30:7.2f} GiB  loss {r['loss']:.4f}")
        except RuntimeError as e:  # CUDA OOM among others
            r = {"name": v[0], "error": str(e).splitlines()[0][:300]}
            print(f"  {v[0]:<24} FAILED: {r['error']}")
            torch.cuda.empty_cache()
        results.append(r)
        sys.stdout.flush()
    by = {r["name"]: r for r in results if "step_ms" in r}
    ratio = (by["bf16+ckpt+offload"]["step_ms"] / by["bf16+ckpt"]["step_ms"]
             if "bf16+ckpt+offload" in by and "bf16+ckpt" in by else 0.0)
    out = {"bench": "gpu_step", "impl": "torch", "torch": torch.__version__, "device": name,
           "model": "gpt2", "seq": seq, "batch": batch, "steps": steps,
           "attention": "sdpa" if use_sdpa else "eager", "results": results,
           "offload_ratio": round(ratio, 4), "offload_target": 1.15}
    print("JSON " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
