"""A small PyTorch Llama that matches memfit's Llama definition exactly (the reference model).

memfit's definition (core/model.h, kind llama), HuggingFace's LlamaForCausalLM / Qwen2 written
out in plain torch (no transformers):
    x = wte[tokens]                                   (no position table)
    for each block: h = x + o_proj(attn(rms1(x)));  x = h + down(silu(gate(rms2(h))) * up(rms2(h)))
    logits = rms_f(x) @ W^T   (W = wte when tied, head.weight otherwise; no bias)
    loss = mean over the B*T rows of softmax cross-entropy
RMSNorm: y = x * rsqrt(mean(x^2, last dim) + eps) * weight (no bias, eps = rms_norm_eps).
attn: one fused qkv projection (q + 2k, C): rows [0, H hs) are q (H heads of hs contiguous
rows), then G kv heads of k, then G of v; optional bias (Qwen2's q/k/v bias). With qk_norm
(Qwen3), each q head and each k head RMS-normed over its hs values (weights q_norm, k_norm (hs),
eps rms_norm_eps) after the bias. Rotary embedding on q and k after that, HF's rotate-half layout: angle a[t, i] = f32(t) * inv_freq[i] for
i < hs/2, cos and sin duplicated to hs, x' = x cos + rotate_half(x) sin with
rotate_half(x) = cat(-x[hs/2:], x[:hs/2]). Grouped-query attention as HF's repeat_kv: query
head h reads kv head h // (H / G). Causal softmax, scale 1/sqrt(hs); merged heads (B, T, H hs)
-> o_proj (C, H hs), optional bias. MLP: one fused gate_up (2F, C) (rows [0, F) gate, [F, 2F)
up), down (C, F), optional biases.

inv_freq as transformers' `_compute_default_rope_parameters` and `_compute_llama3_parameters`
(modeling_rope_utils.py), in FP32: inv_freq[i] = 1 / theta^(2i / hs); for llama3 scaling, with
wavelen = 2 pi / inv_freq, wavelengths above orig / low_freq_factor are divided by factor,
those below orig / high_freq_factor kept, those between interpolated with
smooth = (orig / wavelen - low) / (high - low): (1 - smooth) inv / factor + smooth inv.

Parameters live in an ordered dict keyed by memfit's names, in Model::parameters() order, with
nn.Linear's (out, in) layout, so a golden file or a weight comparison needs no renaming:

    cfg = LlamaConfig(vocab=64, seq_len=16, layers=2, hidden=32, heads=4, kv_heads=2,
                      intermediate=48, qkv_bias=True, rope_scaling=Llama3Scaling(...))
    model = TorchLlama(cfg)               # init from the current torch RNG state
    loss, logits = model(tokens, targets) # tokens, targets: int64 (B, T)
    model.params["layers.0.self_attn.qkv.weight"]   # a leaf tensor with requires_grad

F32 only, no checkpointing (memfit's checkpointed schedules must reproduce the plain forward's
numbers, so the golden test needs none here).

Run with Debian's python3-torch (apt-get install python3-torch): /usr/bin/python3.
"""

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F


@dataclass
class Llama3Scaling:
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class LlamaConfig:
    vocab: int = 256
    seq_len: int = 128
    layers: int = 4
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 0  # 0: heads
    head_dim: int = 0  # 0: hidden // heads
    intermediate: int = 512
    tied_head: bool = False
    qkv_bias: bool = False
    proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[Llama3Scaling] = None

    @property
    def kv(self):
        return self.kv_heads if self.kv_heads > 0 else self.heads

    @property
    def hs(self):
        return self.head_dim if self.head_dim > 0 else self.hidden // self.heads


def parameter_shapes(cfg):
    """(name, shape, init) in memfit's Model::parameters() order.

    init is "normal:<std>" (weights), "norm" (RMSNorm gains: 1 + 0.1 N(0, 1), so that a
    gain that is dropped or misapplied shows) or "bias" (0.02 N(0, 1), likewise).
    """
    C, V, Fi, H, G, hs = cfg.hidden, cfg.vocab, cfg.intermediate, cfg.heads, cfg.kv, cfg.hs
    w = "normal:0.02"
    out = [("wte", (V, C), w)]
    for i in range(cfg.layers):
        p = f"layers.{i}."
        out.append((p + "input_layernorm.weight", (C,), "norm"))
        out.append((p + "self_attn.qkv.weight", ((H + 2 * G) * hs, C), w))
        if cfg.qkv_bias:
            out.append((p + "self_attn.qkv.bias", ((H + 2 * G) * hs,), "bias"))
        if cfg.qk_norm:
            out.append((p + "self_attn.q_norm.weight", (hs,), "norm"))
            out.append((p + "self_attn.k_norm.weight", (hs,), "norm"))
        out.append((p + "self_attn.proj.weight", (C, H * hs), w))
        if cfg.proj_bias:
            out.append((p + "self_attn.proj.bias", (C,), "bias"))
        out.append((p + "post_attention_layernorm.weight", (C,), "norm"))
        out.append((p + "mlp.gate_up.weight", (2 * Fi, C), w))
        if cfg.mlp_bias:
            out.append((p + "mlp.gate_up.bias", (2 * Fi,), "bias"))
        out.append((p + "mlp.down.weight", (C, Fi), w))
        if cfg.mlp_bias:
            out.append((p + "mlp.down.bias", (C,), "bias"))
    out.append(("norm.weight", (C,), "norm"))
    if not cfg.tied_head:
        out.append(("head.weight", (V, C), w))
    return out


def init_parameters(cfg, generator=None):
    """An OrderedDict name -> f32 leaf tensor (requires_grad), drawn in parameter order."""
    params = OrderedDict()
    for name, shape, init in parameter_shapes(cfg):
        t = torch.empty(shape, dtype=torch.float32)
        if init == "norm":
            t.normal_(0.0, 1.0, generator=generator).mul_(0.1).add_(1.0)
        elif init == "bias":
            t.normal_(0.0, 1.0, generator=generator).mul_(0.02)
        else:
            t.normal_(0.0, float(init.split(":")[1]), generator=generator)
        params[name] = t.requires_grad_(True)
    return params


def rope_inv_freq(hs, theta, scaling=None):
    """f32 (hs/2,): transformers' default inv_freq, then the llama3 rule when scaling is set."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    if scaling is None:
        return inv_freq
    factor = scaling.factor
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / low
    high_freq_wavelen = old_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope_cos_sin(T, inv_freq):
    """cos, sin (T, hs) for positions 0..T-1, each half a copy of the other (HF's layout)."""
    t = torch.arange(T, dtype=torch.int64).float()
    angle = torch.outer(t, inv_freq)  # one f32 product per entry, as HF's K=1 matmul
    emb = torch.cat((angle, angle), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x, cos, sin):
    """x (B, heads, T, hs); cos, sin (T, hs)."""
    return x * cos + rotate_half(x) * sin


class TorchLlama:
    """The reference Llama. Not an nn.Module on purpose: the parameters are a name-keyed dict."""

    def __init__(self, cfg, params=None):
        if cfg.heads % cfg.kv != 0:
            raise ValueError(f"kv_heads {cfg.kv} must divide heads {cfg.heads}")
        if cfg.hs % 2 != 0:
            raise ValueError(f"head_dim {cfg.hs} must be even (rotary pairs)")
        self.cfg = cfg
        self.params = params if params is not None else init_parameters(cfg)
        self.inv_freq = rope_inv_freq(cfg.hs, cfg.rope_theta, cfg.rope_scaling)

    def parameters(self):
        return list(self.params.values())

    def _rms(self, x, name):
        w = self.params[name]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps) * w

    def _attn(self, x, i):
        p, cfg = self.params, self.cfg
        B, T, _ = x.shape
        H, G, hs = cfg.heads, cfg.kv, cfg.hs
        pre = f"layers.{i}.self_attn."
        qkv = F.linear(x, p[pre + "qkv.weight"], p.get(pre + "qkv.bias"))
        q, k, v = qkv.split([H * hs, G * hs, G * hs], dim=2)
        q = q.view(B, T, H, hs).transpose(1, 2)  # (B, H, T, hs)
        k = k.view(B, T, G, hs).transpose(1, 2)  # (B, G, T, hs)
        v = v.view(B, T, G, hs).transpose(1, 2)
        if cfg.qk_norm:  # Qwen3Attention: per head over hs, before the rotary embedding
            q = self._rms(q, pre + "q_norm.weight")
            k = self._rms(k, pre + "k_norm.weight")
        cos, sin = rope_cos_sin(T, self.inv_freq)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        # repeat_kv: query head h reads kv head h // (H / G).
        k = k.repeat_interleave(H // G, dim=1)
        v = v.repeat_interleave(H // G, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool).tril_()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * hs)
        return F.linear(y, p[pre + "proj.weight"], p.get(pre + "proj.bias"))

    def _mlp(self, x, i):
        p, Fi = self.params, self.cfg.intermediate
        pre = f"layers.{i}.mlp."
        gu = F.linear(x, p[pre + "gate_up.weight"], p.get(pre + "gate_up.bias"))
        h = F.silu(gu[..., :Fi]) * gu[..., Fi:]
        return F.linear(h, p[pre + "down.weight"], p.get(pre + "down.bias"))

    def block(self, x, i):
        h = x + self._attn(self._rms(x, f"layers.{i}.input_layernorm.weight"), i)
        return h + self._mlp(self._rms(h, f"layers.{i}.post_attention_layernorm.weight"), i)

    def __call__(self, tokens, targets=None):
        """(loss or None, logits (B, T, V))."""
        p, cfg = self.params, self.cfg
        if tokens.shape[1] > cfg.seq_len:
            raise ValueError(f"sequence length {tokens.shape[1]} > seq_len {cfg.seq_len}")
        x = F.embedding(tokens, p["wte"])
        for i in range(cfg.layers):
            x = self.block(x, i)
        x = self._rms(x, "norm.weight")
        logits = F.linear(x, p["wte"] if cfg.tied_head else p["head.weight"])
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return loss, logits
