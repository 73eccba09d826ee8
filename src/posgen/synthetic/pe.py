"""Positional encodings of the classifier: a registry of small classes with one interface.

One instance serves the whole model (its per-layer parameters in ``ModuleList`` / tensors indexed by layer):

* ``embed(h)``: the input embeddings ``h (B, T, D)`` plus any absolute encoding;
* ``attend(layer, q, k, x_q, x_k) -> (q, k, bias)``: the query and key vectors whose dot products, times
  ``1 / sqrt(q.shape[-1])``, are the logits, and an additive logit bias ``(H, T, T)`` or None. ``q, k`` are
  ``(B, H, T, head_dim)``, ``x_q, x_k`` the layer inputs the queries and keys were projected from.

Names: ``nope``, ``sinusoidal``, ``learned``, ``t5``, ``alibi``, ``rope``, ``rope+sinusoidal`` (what the authors
call rope), ``partial-rope`` (RoPE on the first ``rope_heads`` heads), ``decoupled`` (MLA style: a NoPE path plus
a parallel RoPE path from its own projections).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Dims:
    n_layers: int
    n_heads: int
    d_model: int
    max_len: int
    faithful: bool = False
    rope_heads: int = 1
    rope_base: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """(token, dim): sin at even dims, cos at odd dims, wavelengths 2 pi .. 10000 * 2 pi."""
    position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (T, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)  # (D/2,)
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


class Rotary(nn.Module):
    """RoPE in the rotate_half pairing (dims l and l + d/2), angles precomputed for ``max_len`` tokens."""

    def __init__(self, dim: int, max_len: int, base: float):
        super().__init__()
        inv_freq = base ** (-torch.arange(dim // 2, dtype=torch.float32) / (dim // 2))  # (band,)
        angle = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq  # (T, band)
        self.register_buffer("cos", torch.cat([angle.cos(), angle.cos()], -1), persistent=False)  # (T, dim)
        self.register_buffer("sin", torch.cat([angle.sin(), angle.sin()], -1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T, half = x.shape[-2], x.shape[-1] // 2
        rotated_half = torch.cat([-x[..., half:], x[..., :half]], -1)  # (..., T, dim)
        return x * self.cos[:T] + rotated_half * self.sin[:T]


class NoPE(nn.Module):
    """No positional information: plain dot products."""

    def __init__(self, dims: Dims):
        super().__init__()
        self.dims = dims

    def embed(self, h: torch.Tensor) -> torch.Tensor:
        return h

    def attend(self, layer: int, q, k, x_q, x_k):
        return q, k, None


class Sinusoidal(NoPE):
    """Absolute sinusoidal encoding added to the input embeddings."""

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.register_buffer("table", sinusoidal_table(dims.max_len, dims.d_model), persistent=False)

    def embed(self, h):
        return h + self.table[: h.shape[1]]


class Learned(NoPE):
    """Learned absolute encoding added to the input embeddings."""

    def __init__(self, dims: Dims):
        super().__init__(dims)
        # faithful: the authors' positions are an nn.Embedding like their tokens, both N(0, 1) at init
        scale = 1.0 if dims.faithful else 0.02
        self.table = nn.Parameter(torch.randn(dims.max_len, dims.d_model) * scale)

    def embed(self, h):
        return h + self.table[: h.shape[1]]


def _distance_index(T: int, device) -> torch.Tensor:
    """(T, T) signed distance i - j."""
    pos = torch.arange(T, device=device)
    return pos[:, None] - pos[None, :]


class T5(NoPE):
    """Learned relative bias beta_{layer, head}(i - j), one per signed distance (no bucketing)."""

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.beta = nn.Parameter(torch.zeros(dims.n_layers, dims.n_heads, 2 * dims.max_len - 1))

    def bias(self, layer: int, T: int) -> torch.Tensor:
        delta = _distance_index(T, self.beta.device) + self.dims.max_len - 1  # (T, T) index of i - j
        return self.beta[layer][:, delta]  # (H, T, T)

    def attend(self, layer, q, k, x_q, x_k):
        return q, k, self.bias(layer, q.shape[-2])


class ALiBi(NoPE):
    """Symmetric linear bias ``-m_h |i - j|``; slopes 2^(-8h/H), h = 1..H (faithful: exp(-h/H), h = 0..H-1, the
    authors' formula, which is exp(-h/16) at their 16 heads)."""

    def __init__(self, dims: Dims):
        super().__init__(dims)
        h = torch.arange(dims.n_heads, dtype=torch.float32)
        slopes = torch.exp(-h / dims.n_heads) if dims.faithful else 2.0 ** (-8 * (h + 1) / dims.n_heads)
        self.register_buffer("slopes", slopes, persistent=False)

    def bias(self, layer: int, T: int) -> torch.Tensor:
        distance = _distance_index(T, self.slopes.device).abs()  # (T, T)
        return -self.slopes[:, None, None] * distance  # (H, T, T)

    def attend(self, layer, q, k, x_q, x_k):
        return q, k, self.bias(layer, q.shape[-2])


class RoPE(NoPE):
    """Rotary encoding of queries and keys on every head."""

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.rotary = Rotary(dims.head_dim, dims.max_len, dims.rope_base)

    def attend(self, layer, q, k, x_q, x_k):
        return self.rotary(q), self.rotary(k), None


class RoPESinusoidal(RoPE):
    """RoPE plus the absolute sinusoidal encoding at the input (the authors' "rope")."""

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.register_buffer("table", sinusoidal_table(dims.max_len, dims.d_model), persistent=False)

    def embed(self, h):
        return h + self.table[: h.shape[1]]


class PartialRoPE(RoPE):
    """RoPE on the first ``rope_heads`` heads, no positional encoding on the others."""

    def attend(self, layer, q, k, x_q, x_k):
        n = self.dims.rope_heads
        q = torch.cat([self.rotary(q[:, :n]), q[:, n:]], 1)  # (B, H, T, d)
        k = torch.cat([self.rotary(k[:, :n]), k[:, n:]], 1)
        return q, k, None


class Decoupled(NoPE):
    """MLA-style hybrid: ``q_C.k_C`` (no position) + ``R(q_R).R(k_R)`` from separate projections of the layer input.

    The RoPE path has head_dim / 2 dims per head (a pure rotation, so translation invariant); the logit scale
    is 1 / sqrt(head_dim + rope_dim), the concatenated dimension.
    """

    def __init__(self, dims: Dims):
        super().__init__(dims)
        self.rope_dim = max(2, dims.head_dim // 2 // 2 * 2)
        self.q_rope = nn.ModuleList(nn.Linear(dims.d_model, dims.n_heads * self.rope_dim) for _ in range(dims.n_layers))
        self.k_rope = nn.ModuleList(nn.Linear(dims.d_model, dims.n_heads * self.rope_dim) for _ in range(dims.n_layers))
        self.rotary = Rotary(self.rope_dim, dims.max_len, dims.rope_base)

    def attend(self, layer, q, k, x_q, x_k):
        B, H, T, _ = q.shape
        q_r = self.q_rope[layer](x_q).view(B, T, H, self.rope_dim).transpose(1, 2)  # (B, H, T, r)
        k_r = self.k_rope[layer](x_k).view(x_k.shape[0], T, H, self.rope_dim).transpose(1, 2)
        q = torch.cat([q, self.rotary(q_r)], -1)  # (B, H, T, d + r)
        k = torch.cat([k, self.rotary(k_r)], -1)
        return q, k, None


PES = {
    "nope": NoPE,
    "sinusoidal": Sinusoidal,
    "learned": Learned,
    "t5": T5,
    "alibi": ALiBi,
    "rope": RoPE,
    "rope+sinusoidal": RoPESinusoidal,
    "partial-rope": PartialRoPE,
    "decoupled": Decoupled,
}


def make_pe(name: str, dims: Dims) -> NoPE:
    if name not in PES:
        raise ValueError(f"synthetic.pes: unknown positional encoding {name!r} (known: {', '.join(PES)})")
    if name == "partial-rope" and not 0 <= dims.rope_heads <= dims.n_heads:
        raise ValueError(f"synthetic.rope_heads: {dims.rope_heads} not in 0..{dims.n_heads}")
    return PES[name](dims)


def logit_scale(q: torch.Tensor) -> float:
    return 1.0 / math.sqrt(q.shape[-1])
