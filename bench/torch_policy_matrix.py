#!/usr/bin/python3
"""PyTorch anchor for memfit's policy matrix (bench/policy_matrix_bench.cpp runs it).

The GPT of scripts/torch_gpt.py (memfit's definition; default {vocab 256, seq_len 128, layers 6,
hidden 256, heads 8, mlp_ratio 4, tied}), batch 16, on the CPU, for each
dtype (f32, bf16 = torch.autocast("cpu", torch.bfloat16); f16 is printed as n/a: CPU autocast
in torch 1.13 supports bfloat16 only) x checkpoint (none, all = torch.utils.checkpoint on each
block, the last included; every:K = on each segment of K blocks but the last, which runs
uncheckpointed as in torch.utils.checkpoint_sequential; use_reentrant=True as torch 1.13's
default).

One training step: AdamW.zero_grad(set_to_none=True), forward, mean cross-entropy, backward,
torch.optim.AdamW.step() (torch's default implementation for CPU tensors; lr 1e-3, wd 0.01).
With --micro-batch M the step runs the batch as micro-batches of M samples (forward and
backward each, the loss weighted by M / batch, the gradients accumulating in .grad): gradient
accumulation as users write it.
Step time: the median wall time of --steps timed steps after --warmup untimed ones.

Memory. CPU PyTorch keeps no allocator statistics (torch.cuda.memory_stats has no CPU twin, and
the 1.13 profiler's profile_memory records too few CPU events to reconstruct a peak), so each
category is measured from the tensors themselves:
  parameter        bytes of the parameters' storages (f32 masters; autocast keeps no other copy
                   outside the forward's cast cache, which is counted under activation);
  gradient         bytes of the .grad tensors after backward;
  optimizer_state  bytes of every tensor in AdamW's state (exp_avg, exp_avg_sq, step);
  activation       the peak over the whole step (forward, the recomputations of checkpointing
                   during backward, backward) of the bytes of tensors saved for backward: a
                   torch.autograd.graph.saved_tensors_hooks pack hook wraps every saved tensor
                   in a handle that counts its storage once (unique storages: views such as
                   q/k/v of the fused qkv share one), and the handle's release (the graph node
                   freed) uncounts it; storages that are parameters are not activations. The
                   autocast bf16 weight casts that matmuls save are activations here; their
                   part is also printed as activation_weight_copies.
The hooks run on the first step executed (a warm-up step when --warmup >= 1; their cost is a
few hundred Python calls per step). This counts what autograd holds for backward, not the
forward's short-lived temporaries or allocator caching, so it is a lower bound on PyTorch's
real footprint: a fair "memfit <= PyTorch" comparison for the activation category and for
peak_sum = parameter + gradient + optimizer_state + activation (sum of per-category peaks).

Output: one JSON object per configuration, one per line on stdout (logs go to stderr):
  {"impl": "pytorch", "torch": "1.13.0", "dtype": "f32", "checkpoint": "none", "status": "ok",
   "batch": 16, "threads": 2, "steps": 3, "warmup": 1, "step_seconds": [...],
   "step_seconds_median": 1.23, "loss": 5.6, "bytes": {"parameter": ..., "gradient": ...,
   "optimizer_state": ..., "activation": ...}, "activation_weight_copies": ..., "peak_sum": ...}
  {"impl": "pytorch", "dtype": "f16", "checkpoint": "none", "status": "n/a", "reason": "..."}

  /usr/bin/python3 bench/torch_policy_matrix.py --threads 2
  /usr/bin/python3 bench/torch_policy_matrix.py --dtypes f32 --checkpoints none,all --steps 5

bf16 on CPUs without AVX512-BF16 runs torch's scalar fallback GEMM (~50x slower than f32 on
an AVX2 machine), so bf16 has its own --bf16-steps/--bf16-warmup (default 1/0).
"""

import argparse
import json
import os
import statistics
import sys
import time
import weakref

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from torch_gpt import GptConfig, TorchGpt, init_parameters  # noqa: E402


def storage_key(t):
    s = t.storage()
    return s.data_ptr(), s.nbytes()


class SavedTensorMeter:
    """Live and peak bytes of the unique non-parameter storages saved for backward."""

    def __init__(self, params):
        self.param_ptrs = {p.storage().data_ptr() for p in params}
        self.param_shapes = {tuple(p.shape) for p in params}
        self.live = {}  # data_ptr -> [nbytes, handles, is_weight_copy]
        self.cur = self.peak = self.copies_cur = self.copies_peak = 0
        meter = self

        class Handle:
            __slots__ = ("t", "ptr")

            def __init__(self, t):
                self.t = t
                ptr, nbytes = storage_key(t)
                self.ptr = ptr
                e = meter.live.get(ptr)
                if e is not None:
                    e[1] += 1
                    return
                # A saved low-precision tensor with a parameter's shape is autocast's cast
                # of that parameter (activations never have those shapes in this model).
                copy = t.dtype != torch.float32 and tuple(t.shape) in meter.param_shapes
                meter.live[ptr] = [nbytes, 1, copy]
                meter.cur += nbytes
                meter.peak = max(meter.peak, meter.cur)
                if copy:
                    meter.copies_cur += nbytes
                    meter.copies_peak = max(meter.copies_peak, meter.copies_cur)

            def __del__(self):
                e = meter.live[self.ptr]
                e[1] -= 1
                if e[1] == 0:
                    meter.cur -= e[0]
                    if e[2]:
                        meter.copies_cur -= e[0]
                    del meter.live[self.ptr]

        self.Handle = Handle

    def track(self, t):
        """Counts t's storage while the tensor object lives (outputs autograd does not save,
        such as a checkpoint's recomputed block output)."""
        h = self.Handle(t)
        h.t = None  # hold the count, not the tensor
        weakref.finalize(t, lambda h=h: None)  # the handle dies (and uncounts) with t

    def pack(self, t):
        if t.storage().data_ptr() in self.param_ptrs:
            return t
        return self.Handle(t)

    @staticmethod
    def unpack(h):
        return h.t if hasattr(h, "ptr") else h

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def tensor_bytes(ts):
    return sum(t.numel() * t.element_size() for t in ts)


def run_config(args, cfg, dtype, ckpt, tokens, targets):
    torch.manual_seed(args.seed)
    params = init_parameters(cfg)
    model = TorchGpt(cfg, params=params, checkpoint=ckpt, autocast=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    meter = SavedTensorMeter(model.parameters())
    measuring = [False]
    model.output_hook = lambda x: meter.track(x) if measuring[0] else None
    slow = dtype == "bf16"
    warmup = args.bf16_warmup if slow else args.warmup
    steps = args.bf16_steps if slow else args.steps

    mb = args.micro_batch if args.micro_batch > 0 else args.batch

    def forward_backward():
        total = 0.0
        for r in range(0, args.batch, mb):
            part = min(mb, args.batch - r)
            loss, _ = model(tokens[r:r + part], targets[r:r + part])
            (loss * (part / args.batch)).backward()
            total += loss.item() * part / args.batch
        return total

    def step(measure):
        opt.zero_grad(set_to_none=True)
        if measure:
            measuring[0] = True
            with meter.hooks():
                loss = forward_backward()
            measuring[0] = False
        else:
            loss = forward_backward()
        opt.step()
        return loss

    secs, loss = [], None
    for k in range(warmup + steps):
        t0 = time.perf_counter()
        loss = step(measure=(k == 0))
        dt = time.perf_counter() - t0
        if k >= warmup:
            secs.append(dt)
        print(f"  {dtype} {ckpt} step {k}: {dt:.3f} s, loss {loss:.4f}", file=sys.stderr)
    if meter.cur != 0:
        raise RuntimeError(f"{meter.cur} saved bytes still live after the step")

    ps = model.parameters()
    by = {
        "parameter": tensor_bytes(ps),
        "gradient": tensor_bytes(p.grad for p in ps if p.grad is not None),
        "optimizer_state": tensor_bytes(v for st in opt.state.values() for v in st.values()
                                        if torch.is_tensor(v)),
        "activation": meter.peak,
    }
    return {
        "impl": "pytorch", "torch": torch.__version__, "dtype": dtype, "checkpoint": ckpt,
        "status": "ok", "batch": args.batch, "micro_batch": mb,
        "threads": torch.get_num_threads(),
        "steps": steps, "warmup": warmup, "step_seconds": secs,
        "step_seconds_median": statistics.median(secs), "step_seconds_min": min(secs),
        "loss": loss, "bytes": by,
        "activation_weight_copies": meter.copies_peak, "peak_sum": sum(by.values()),
    }


def main():
    ap = argparse.ArgumentParser(description="PyTorch CPU anchor for memfit's policy matrix")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: keep)")
    ap.add_argument("--dtypes", default="f32,bf16,f16")
    ap.add_argument("--checkpoints", default="none,all,every:2")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (f32)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (f32)")
    ap.add_argument("--bf16-steps", type=int, default=1)
    ap.add_argument("--bf16-warmup", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="samples per micro-batch, gradients accumulated (0: the whole batch)")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--mlp-ratio", type=int, default=4)
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if min(args.steps, args.bf16_steps) < 1 or min(args.warmup, args.bf16_warmup) < 0:
        ap.error("--steps/--bf16-steps must be >= 1, --warmup/--bf16-warmup >= 0")
    if not 0 <= args.micro_batch <= args.batch:
        ap.error(f"--micro-batch {args.micro_batch}: valid 0 (the whole batch) to {args.batch}")
    cfg = GptConfig(vocab=args.vocab, seq_len=args.seq_len, layers=args.layers,
                    hidden=args.hidden, heads=args.heads, mlp_ratio=args.mlp_ratio,
                    tied_head=not args.untied)
    g = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, cfg.vocab, (args.batch, cfg.seq_len), generator=g)
    targets = torch.randint(0, cfg.vocab, (args.batch, cfg.seq_len), generator=g)

    for dtype in args.dtypes.split(","):
        for ckpt in args.checkpoints.split(","):
            if dtype == "f16":
                rec = {"impl": "pytorch", "torch": torch.__version__, "dtype": dtype,
                       "checkpoint": ckpt, "status": "n/a",
                       "reason": "torch.autocast('cpu') supports only bfloat16 in torch "
                                 + torch.__version__}
            elif dtype in ("f32", "bf16"):
                rec = run_config(args, cfg, dtype, ckpt, tokens, targets)
            else:
                ap.error(f"dtype '{dtype}': valid are f32, bf16, f16")
            print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
