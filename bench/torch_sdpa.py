#!/usr/bin/env python3
"""PyTorch anchor for bench/attention_gpu_bench.cpp: causal attention forward and
forward+backward with torch.nn.functional.scaled_dot_product_attention(is_causal=True) on the
same GPU and shapes (GPT-2 124M's: B=4, H=12, hs=64, bf16, T = 128 ... 4096).

    /usr/bin/python3 bench/torch_sdpa.py                     # table, figure lines, JSON line
    /usr/bin/python3 bench/torch_sdpa.py --memfit memfit.json  # + memfit's flash beside it

q, k and v are (B, H, T, hs) bf16 tensors random in [-1, 1) that require gradients; the
backward takes a fixed random dout. PyTorch picks its fastest backend (on Hopper usually its
FlashAttention-2 kernels, tensor cores); the table says which one was enabled. Fixed work as
attention_gpu_bench: 2 warm-up calls, then 3 rounds of n calls, n = 2^31 / (B*H*T*(T+1)/2)
query-key pairs clamped to [3, 1000], each round ended by torch.cuda.synchronize(); the best
round counts. --memfit takes the JSON object of attention_gpu_bench's "JSON ..." line and
prints memfit flash's forward+backward time over PyTorch's (tests/gpu/run.sh does this).
Without torch or a CUDA device it prints "SKIP: ..." and exits 0.
"""
import argparse
import json
import math
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memfit", metavar="MEMFIT_JSON",
                    help="attention_gpu_bench's JSON object, to print the ratios")
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"SKIP: no torch: {e}")
        return 0
    if not torch.cuda.is_available():
        print(f"SKIP: torch {torch.__version__} sees no CUDA device "
              f"(built with CUDA {torch.version.cuda})")
        return 0
    if not hasattr(F, "scaled_dot_product_attention"):
        print(f"SKIP: torch {torch.__version__} has no scaled_dot_product_attention")
        return 0
    memfit = {}
    if args.memfit:
        with open(args.memfit) as f:
            memfit = {r["t"]: r for r in json.load(f).get("results", [])}

    b, h, hs, dt = args.batch, 12, 64, torch.bfloat16
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(0)
    backends = [n for n, on in (("flash", torch.backends.cuda.flash_sdp_enabled()),
                                ("mem_efficient", torch.backends.cuda.mem_efficient_sdp_enabled()),
                                ("math", torch.backends.cuda.math_sdp_enabled())) if on]
    print(f"torch_sdpa: torch {torch.__version__} on {name}; causal SDPA bf16 B={b} H={h} "
          f"hs={hs}; enabled backends: {', '.join(backends)}")
    print(f"{'T':>6} {'fwd':>12} {'fwd+bwd':>12} {'memfit f+b':>12} {'memfit/torch':>13}")

    def best_ms(calls, f):
        for _ in range(2):
            f()
        torch.cuda.synchronize()
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) * 1e3 / calls)
        return best

    results = []
    for t in (128, 512, 1024, 2048, 4096):
        pairs = b * h * t * (t + 1) / 2
        calls = int(min(max(math.ceil(2**31 / pairs), 3), 1000))
        gen = torch.Generator(device=dev).manual_seed(t)
        q, k, v = (torch.rand(b, h, t, hs, device=dev, generator=gen, dtype=torch.float32)
                   .mul_(2).sub_(1).to(dt).requires_grad_() for _ in range(3))
        dout = torch.rand(b, h, t, hs, device=dev, generator=gen).mul_(2).sub_(1).to(dt)
        try:
            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                q.grad = k.grad = v.grad = None
                y.backward(dout)

            r = {"t": t, "fwd_ms": round(best_ms(calls, fwd), 4),
                 "fwd_bwd_ms": round(best_ms(calls, fwd_bwd), 4)}
        except RuntimeError as e:  # CUDA OOM among others
            r = {"t": t, "error": str(e).splitlines()[0][:200]}
            print(f"{t:>6} FAILED: {r['error']}")
            results.append(r)
            torch.cuda.empty_cache()
            continue
        m = memfit.get(t, {}).get("flash", {})
        ratio = m["fwd_bwd_ms"] / r["fwd_bwd_ms"] if "fwd_bwd_ms" in m else None
        print(f"{t:>6} {r['fwd_ms']:>9.3f} ms {r['fwd_bwd_ms']:>9.3f} ms "
              f"{(str(round(m['fwd_bwd_ms'], 3)) + ' ms') if ratio else '-':>12} "
              f"{(f'{ratio:.2f}x') if ratio else '-':>13}")
        line = (f"figure: torch sdpa bf16 B={b} H={h} hs={hs} T={t}: fwd+bwd "
                f"{r['fwd_bwd_ms']:.3f} ms")
        if ratio:
            line += f"; memfit flash {m['fwd_bwd_ms']:.3f} ms = {ratio:.2f}x torch's"
        print(line)
        results.append(r)
        del q, k, v, dout
        torch.cuda.empty_cache()
        sys.stdout.flush()
    out = {"bench": "attention", "impl": "torch_sdpa", "torch": torch.__version__,
           "device": name, "dtype": "bf16", "b": b, "heads": h, "hs": hs,
           "backends": backends, "results": results}
    print("JSON " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
