#!/usr/bin/python3
"""PyTorch's AdamW, for memfit's CPU AdamW: golden data for the tests and a timing anchor.

  /usr/bin/python3 bench/torch_adamw.py --golden tests/core/data/adamw_golden.bin
  /usr/bin/python3 bench/torch_adamw.py --bench --n 10000000 --threads 1

--golden writes a small versioned binary file (little-endian) that
tests/core/adamw_test.cpp reads; the test never needs PyTorch:
  header  char[8] magic "MFADAMW1", u32 version (1), u32 case count, char[32] torch version
  case    u32 n, u32 steps, f64 lr, beta1, beta2, eps, weight_decay,
          f32 param[n] (initial), then per step: f32 grad[n], and after the step
          f32 param[n], exp_avg[n], exp_avg_sq[n]
Each case is torch.optim.AdamW(foreach=False) (the single-tensor path, PyTorch's CPU
default) on one FP32 tensor of n elements, steps steps, a new gradient every step.

--bench times torch.optim.AdamW(foreach=True) on FP32 params and FP32 grads with
torch.set_num_threads(--threads) and prints one JSON line: parameters per second (median
over the timed steps) with the n parameters as 1 tensor and as 100 equal tensors, and, when
this PyTorch has it, fused=True on the single tensor (informational).
"""
import argparse
import json
import struct
import sys
import time

MAGIC = b"MFADAMW1"
VERSION = 1


def golden_case(torch, gen, n, steps, lr, betas, eps, wd):
    # Magnitudes spread over decades (as real gradients of different layers are), plus exact
    # zeros, so second moments and denominators span a wide range.
    p = torch.randn(n, generator=gen, dtype=torch.float32)
    p0 = p.clone()
    p = torch.nn.Parameter(p)
    opt = torch.optim.AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False)
    scales = torch.pow(10.0, torch.empty(n).uniform_(-4, 1, generator=gen))
    out = [struct.pack("<II5d", n, steps, lr, betas[0], betas[1], eps, wd), p0.numpy().tobytes()]
    for _ in range(steps):
        g = (torch.randn(n, generator=gen) * scales).to(torch.float32)
        g[torch.rand(n, generator=gen) < 0.05] = 0.0
        p.grad = g.clone()
        opt.step()
        st = opt.state[p]
        out += [g.numpy().tobytes(), p.detach().numpy().tobytes(),
                st["exp_avg"].numpy().tobytes(), st["exp_avg_sq"].numpy().tobytes()]
    return b"".join(out)


def golden(path):
    import torch
    gen = torch.Generator().manual_seed(20240601)
    cases = [
        # torch.optim.AdamW's defaults, except lr (its default 1e-3 too).
        golden_case(torch, gen, 301, 5, 1e-3, (0.9, 0.999), 1e-8, 0.01),
        # Larger steps and decay, other betas, a visible eps: every term matters.
        golden_case(torch, gen, 257, 5, 3e-2, (0.8, 0.99), 1e-3, 0.1),
    ]
    ver = torch.__version__.encode()[:32].ljust(32, b"\0")
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<II", VERSION, len(cases)) + ver)
        for c in cases:
            f.write(c)
    print(f"wrote {path}: {len(cases)} cases, torch {torch.__version__}")


def time_steps(torch, params, iters, **kw):
    opt = torch.optim.AdamW(params, lr=1e-3, **kw)
    for _ in range(3):  # warm-up: allocates state, faults pages in
        opt.step()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def bench(n, threads, iters):
    import torch
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(1)

    def make(k):
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        ps = []
        for s in sizes:
            p = torch.nn.Parameter(torch.randn(s, generator=gen))
            p.grad = torch.randn(s, generator=gen) * 1e-2
            ps.append(p)
        return ps

    res = {"torch": torch.__version__, "threads": threads, "n": n}
    t1 = time_steps(torch, make(1), iters, foreach=True)
    res["foreach_1_tensor_params_per_s"] = n / t1
    t100 = time_steps(torch, make(100), iters, foreach=True)
    res["foreach_100_tensors_params_per_s"] = n / t100
    try:
        tf = time_steps(torch, make(1), iters, fused=True)
        res["fused_1_tensor_params_per_s"] = n / tf
    except (RuntimeError, TypeError, ValueError) as e:  # older PyTorch: no CPU fused AdamW
        res["fused_1_tensor_params_per_s"] = None
        res["fused_error"] = str(e)[:120]
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--golden", metavar="OUT", help="write the golden test file to OUT")
    ap.add_argument("--bench", action="store_true", help="time torch.optim.AdamW(foreach=True)")
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    if a.golden:
        golden(a.golden)
    elif a.bench:
        bench(a.n, a.threads, a.iters)
    else:
        ap.error("give --golden OUT or --bench")


if __name__ == "__main__":
    try:
        main()
    except ImportError as e:
        print(f"torch_adamw.py: PyTorch is not importable ({e}); "
              "install it with: apt-get install -y python3-torch", file=sys.stderr)
        sys.exit(3)
