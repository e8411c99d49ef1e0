"""A small PyTorch GPT that matches memfit's GPT definition exactly (the reference model).

memfit's definition (see core/model.h and the golden-file spec): pre-LN GPT-2,
    x = wte[tokens] + wpe[0:T]
    for each block: x = x + attn(ln1(x));  x = x + mlp(ln2(x))
    logits = lnf(x) @ W^T   (W = wte when tied, head.weight otherwise; no bias)
    loss = mean over the B*T rows of softmax cross-entropy
with attn a causal multi-head self-attention whose fused qkv projection is laid out as GPT-2's
c_attn (rows [0,C) = q, [C,2C) = k, [2C,3C) = v; heads are contiguous blocks of hs rows inside
each), scale 1/sqrt(hs); mlp = proj(gelu_tanh(fc(.))); LayerNorm eps 1e-5, biased variance.

Parameters live in an ordered dict keyed by memfit's names, in Model::parameters() order, with
nn.Linear's (out, in) layout, so a golden file or a weight comparison needs no renaming:

    cfg = GptConfig(vocab=64, seq_len=16, layers=2, hidden=32, heads=4)
    model = TorchGpt(cfg)                 # GPT-2 init from the current torch RNG state
    loss, logits = model(tokens, targets) # tokens, targets: int64 (B, T)
    model.params["h.0.attn.qkv.weight"]   # a leaf tensor with requires_grad

Checkpointing: `checkpoint="none" | "all" | "sqrt" | "every:K"` (memfit's Schedule names). "all"
wraps each block in torch.utils.checkpoint, the last included (Hugging Face's gradient
checkpointing; memfit's Schedule::all). "every:K" splits the blocks into segments of K from block
0 (the last holds the remainder) and wraps each segment but the last, which runs
uncheckpointed: torch.utils.checkpoint_sequential's behaviour, and memfit's Schedule::every.
(checkpoint_sequential itself takes a segment count and gives the remainder to the last
segment, so we do not call it: for 7 blocks, every:3 is segments {0-2}, {3-5}, {6}.) "sqrt" is
every:round(sqrt(layers)). `use_reentrant` is passed through.

Precision: `autocast="bf16"` runs the forward under torch.autocast("cpu", torch.bfloat16); the
parameters stay f32 (they are the master weights) and the loss is computed in f32.

Run with Debian's /usr/bin/python3 (python3-torch 1.13).
"""

import math
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tcp


@dataclass
class GptConfig:
    vocab: int = 256
    seq_len: int = 128
    layers: int = 6
    hidden: int = 256
    heads: int = 8
    mlp_ratio: int = 4
    tied_head: bool = True
    ln_eps: float = 1e-5


def parameter_shapes(cfg):
    """(name, shape, init) in memfit's Model::parameters() order.

    init is "normal:<std>", "ones" or "zeros"; GPT-2's init: weights N(0, 0.02), the two
    residual projections N(0, 0.02/sqrt(2*layers)), biases zeros, LayerNorm gains ones.
    """
    C, V, T, F_ = cfg.hidden, cfg.vocab, cfg.seq_len, cfg.mlp_ratio * cfg.hidden
    std = 0.02
    res_std = 0.02 / math.sqrt(2 * cfg.layers)
    out = [("wte", (V, C), f"normal:{std}"), ("wpe", (T, C), f"normal:{std}")]
    for i in range(cfg.layers):
        p = f"h.{i}."
        out += [
            (p + "ln1.weight", (C,), "ones"),
            (p + "ln1.bias", (C,), "zeros"),
            (p + "attn.qkv.weight", (3 * C, C), f"normal:{std}"),
            (p + "attn.qkv.bias", (3 * C,), "zeros"),
            (p + "attn.proj.weight", (C, C), f"normal:{res_std}"),
            (p + "attn.proj.bias", (C,), "zeros"),
            (p + "ln2.weight", (C,), "ones"),
            (p + "ln2.bias", (C,), "zeros"),
            (p + "mlp.fc.weight", (F_, C), f"normal:{std}"),
            (p + "mlp.fc.bias", (F_,), "zeros"),
            (p + "mlp.proj.weight", (C, F_), f"normal:{res_std}"),
            (p + "mlp.proj.bias", (C,), "zeros"),
        ]
    out += [("lnf.weight", (C,), "ones"), ("lnf.bias", (C,), "zeros")]
    if not cfg.tied_head:
        out.append(("head.weight", (V, C), f"normal:{std}"))
    return out


def init_parameters(cfg, generator=None):
    """An OrderedDict name -> f32 leaf tensor (requires_grad), drawn in parameter order."""
    params = OrderedDict()
    for name, shape, init in parameter_shapes(cfg):
        t = torch.empty(shape, dtype=torch.float32)
        if init == "ones":
            t.fill_(1.0)
        elif init == "zeros":
            t.zero_()
        else:
            t.normal_(0.0, float(init.split(":")[1]), generator=generator)
        params[name] = t.requires_grad_(True)
    return params


def parse_checkpoint(spec, layers):
    """memfit's Schedule names -> list of (blocks, checkpointed) segments, or None for none.

    blocks: a list of consecutive block indices; checkpointed: whether the segment runs under
    torch.utils.checkpoint (every segment under "all"; all but the last under every:K and sqrt).
    """
    if spec in (None, "none"):
        return None
    if spec == "all":
        return [([i], True) for i in range(layers)]
    if spec == "sqrt":
        k = max(1, round(math.sqrt(layers)))
    elif spec.startswith("every:"):
        k = int(spec.split(":", 1)[1])
        if k < 1:
            raise ValueError(f"checkpoint '{spec}': K must be >= 1")
    else:
        raise ValueError(f"checkpoint '{spec}': valid are none, all, sqrt, every:K (K >= 1)")
    segments = [list(range(s, min(s + k, layers))) for s in range(0, layers, k)]
    return [(seg, j + 1 < len(segments)) for j, seg in enumerate(segments)]


class TorchGpt:
    """The reference GPT. Not an nn.Module on purpose: the parameters are a name-keyed dict."""

    def __init__(self, cfg, params=None, checkpoint="none", autocast=None, use_reentrant=True):
        self.cfg = cfg
        self.params = params if params is not None else init_parameters(cfg)
        self.segments = parse_checkpoint(checkpoint, cfg.layers)
        if autocast not in (None, "f32", "bf16"):
            raise ValueError(f"autocast '{autocast}': valid are None, 'f32', 'bf16' (CPU)")
        self.autocast = autocast == "bf16"
        self.use_reentrant = use_reentrant
        # Called with each block's output as it is made (a forward, or a checkpoint's
        # recomputation): lets a memory meter see outputs autograd does not save.
        self.output_hook = None

    def parameters(self):
        return list(self.params.values())

    def _ln(self, x, prefix):
        p = self.params
        return F.layer_norm(x, (self.cfg.hidden,), p[prefix + ".weight"], p[prefix + ".bias"],
                            self.cfg.ln_eps)

    def _attn(self, x, i):
        p, cfg = self.params, self.cfg
        B, T, C = x.shape
        H = cfg.heads
        hs = C // H
        qkv = F.linear(x, p[f"h.{i}.attn.qkv.weight"], p[f"h.{i}.attn.qkv.bias"])
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, H, hs).transpose(1, 2)  # (B, H, T, hs)
        k = k.view(B, T, H, hs).transpose(1, 2)
        v = v.view(B, T, H, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool).tril_()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return F.linear(y, p[f"h.{i}.attn.proj.weight"], p[f"h.{i}.attn.proj.bias"])

    def _mlp(self, x, i):
        p = self.params
        h = F.linear(x, p[f"h.{i}.mlp.fc.weight"], p[f"h.{i}.mlp.fc.bias"])
        h = F.gelu(h, approximate="tanh")
        return F.linear(h, p[f"h.{i}.mlp.proj.weight"], p[f"h.{i}.mlp.proj.bias"])

    def block(self, x, i):
        x = x + self._attn(self._ln(x, f"h.{i}.ln1"), i)
        return x + self._mlp(self._ln(x, f"h.{i}.ln2"), i)

    def _run_blocks(self, x, blocks):
        for i in blocks:
            x = self.block(x, i)
            if self.output_hook is not None:
                self.output_hook(x)
        return x

    def _segment_fn(self, blocks):
        return lambda x: self._run_blocks(x, blocks)

    def _body(self, tokens):
        p, cfg = self.params, self.cfg
        T = tokens.shape[1]
        if T > cfg.seq_len:
            raise ValueError(f"sequence length {T} > seq_len {cfg.seq_len}")
        x = F.embedding(tokens, p["wte"]) + p["wpe"][:T]
        if self.segments is None:
            x = self._run_blocks(x, range(cfg.layers))
        else:
            for seg, checkpointed in self.segments:
                if checkpointed:
                    x = tcp.checkpoint(self._segment_fn(seg), x, use_reentrant=self.use_reentrant)
                else:
                    x = self._run_blocks(x, seg)
        x = self._ln(x, "lnf")
        w = p["wte"] if cfg.tied_head else p["head.weight"]
        return F.linear(x, w)

    def __call__(self, tokens, targets=None):
        """(loss or None, logits (B, T, V)); the loss is f32 even under autocast."""
        if self.autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = self._body(tokens)
        else:
            logits = self._body(tokens)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                   targets.reshape(-1))
        return loss, logits
