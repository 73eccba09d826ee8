"""Model families: which ones can be captured, and the canonical RoPE layout their q/k are stored in.

Canonical layout (docs/data-model.md, "RoPE layout"): transformers' half-split (``rotate_half``) convention over
all d head dims, band l pairing canonical dims l and l + d/2 and turning by ``inv_freq[l]``. Every layout a
model uses is a fixed permutation of its head dims into that order, applied to q and k alike (a permutation of
the dims of both vectors leaves every dot product, hence every logit, unchanged):

* interleaved pairs (2i, 2i+1) of the rotated slice become canonical (i, i + r/2);
* the d - r unrotated dims of a partial-rotary head (rotated slice first, or last as in MLA) become bands with
  ``inv_freq = 0``, i.e. rotation by angle 0, the identity; canonical order: [rotated first halves, unrotated
  first halves, rotated second halves, unrotated second halves];
* a NoPE layer (no rotation at all) keeps its dims in order with every ``inv_freq = 0``.

Which layout a layer uses is not guessed from names: :func:`detect_layout` tries every candidate on the first
captured forward pass, where both the pre-RoPE vectors (hook) and the rotated ones (attention backend) are at
hand, and keeps the one that reproduces the rotated vectors to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from posgen import rope


class UnsupportedModelError(NotImplementedError):
    """A model family the capture cannot handle, phrased as one line naming the architecture and the feature."""


# model_type -> the missing feature. Checked before the model is built (a model whose attention bypasses
# transformers' AttentionInterface fails to build with a capturing backend, with an unhelpful KeyError).
# (MLA -- DeepSeek-V2/V3 -- is supported: posgen.llm.capture assembles its pre-RoPE key from two projections.)
REFUSED = {
    "gptj": "attention computed outside transformers' AttentionInterface (GPTJAttention), so no backend sees it",
    "falcon": "attention computed outside transformers' AttentionInterface (FalconAttention), so no backend sees it",
}

# model_type of families whose attention needs the model's own eager attention with the additive mask
# (attention sinks: SDPA has no place for them and would drop them silently).
EAGER_ATTENTION = {"gpt_oss"}


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def architecture(config) -> str:
    """The architecture name a message should use: ``architectures[0]`` or the model type."""
    names = getattr(config, "architectures", None) or []
    return names[0] if names else str(getattr(config, "model_type", "unknown"))


def check_supported(config) -> None:
    """Refuse, with one line, a model family the capture cannot handle; return silently otherwise."""
    for cfg in {id(c): c for c in (config, _text_config(config))}.values():
        feature = REFUSED.get(getattr(cfg, "model_type", ""))
        if feature:
            raise UnsupportedModelError(f"{architecture(config)} ({cfg.model_type}): not supported: {feature}")


def needs_eager_attention(config) -> bool:
    """True when the model's attention has something SDPA cannot do (soft-capping, sinks)."""
    text = _text_config(config)
    return bool(getattr(text, "attn_logit_softcapping", None)) or text.model_type in EAGER_ATTENTION


def plain_backend(config) -> str:
    """The attention backend of a plain (not capturing) forward pass: SDPA unless the model needs eager."""
    return "eager" if needs_eager_attention(config) else "sdpa"


# --------------------------------------------------------------------------------------------------------
# Canonical layout


@dataclass(frozen=True)
class Layout:
    """How one layer's head dims map to the canonical half-split layout."""

    rotary_dims: int  # r: dims the model rotates (0 for NoPE)
    rope_layout: str  # "half", "interleaved" (how the model pairs the rotated dims), "none" for NoPE
    rotary_position: str  # "first" or "last": where the rotated slice sits in the head
    dim_order: np.ndarray  # (dim,): original dim index of each canonical dim
    # (dim,) the same for the rotated vectors the attention backend receives, when the model's rotation also
    # reorders dims (DeepSeek-V3 takes interleaved pairs and returns them half-split); None: as dim_order
    backend_order: np.ndarray | None = None

    @property
    def identity(self) -> bool:
        return bool((self.dim_order == np.arange(self.dim_order.size)).all())

    @property
    def backend(self) -> "Layout":
        """The layout of the backend's rotated vectors (for code that reads them, e.g. the capped backend)."""
        if self.backend_order is None:
            return self
        return Layout(self.rotary_dims, "half", self.rotary_position, self.backend_order)

    def canonical_inv_freq(self, inv_freq: np.ndarray) -> np.ndarray:
        """(d/2,) frequencies in canonical band order: the model's r/2 rotated bands, then zeros."""
        head_dim = self.dim_order.size
        out = np.zeros(head_dim // 2, dtype=np.float32)
        out[: self.rotary_dims // 2] = inv_freq[: self.rotary_dims // 2]
        return out


def make_layout(head_dim: int, rotary_dims: int, rope_layout: str, rotary_position: str) -> Layout:
    """The permutation of one candidate layout (see the module docstring for the canonical order)."""
    if rotary_dims == 0:
        return Layout(0, "none", "first", np.arange(head_dim))
    half = rotary_dims // 2
    start = 0 if rotary_position == "first" else head_dim - rotary_dims
    pair = np.arange(half)
    if rope_layout == "half":
        first, second = start + pair, start + pair + half  # (half,), (half,)
    elif rope_layout == "interleaved":
        first, second = start + 2 * pair, start + 2 * pair + 1  # (half,), (half,)
    else:
        raise ValueError(f"rope_layout {rope_layout!r}: not half or interleaved")
    rotated = np.zeros(head_dim, dtype=bool)
    rotated[start : start + rotary_dims] = True
    unrotated = np.flatnonzero(~rotated)  # (d - r,)
    unrotated_half = unrotated.size // 2
    dim_order = np.concatenate([first, unrotated[:unrotated_half], second, unrotated[unrotated_half:]])
    return Layout(rotary_dims, rope_layout, rotary_position, dim_order)


def candidate_layouts(head_dim: int, rotary_dims: int) -> list[Layout]:
    """Every layout the capture recognises for a head of ``head_dim`` dims with an ``rotary_dims`` rotary table."""
    out = [make_layout(head_dim, 0, "none", "first")]
    positions = ["first"] if rotary_dims == head_dim else ["first", "last"]
    for layout in ["half", "interleaved"]:
        for position in positions:
            out.append(make_layout(head_dim, rotary_dims, layout, position))
    for position in positions:  # interleaved in, half-split out
        interleaved = make_layout(head_dim, rotary_dims, "interleaved", position)
        half = make_layout(head_dim, rotary_dims, "half", position)
        out.append(Layout(rotary_dims, "interleaved", position, interleaved.dim_order, half.dim_order))
    return out


def to_canonical(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Permute the last (head) dim of ``x`` into canonical order; the identity layout returns ``x`` itself."""
    if layout.identity:
        return x
    return x[..., torch.as_tensor(layout.dim_order, device=x.device)]


def rotation_error(
    pre: torch.Tensor, post: torch.Tensor, positions: torch.Tensor, inv_freq: np.ndarray, amplitude: float, layout
) -> float:
    """Relative error of ``post`` (the model's rotated vectors) against ``pre`` rotated under ``layout``.

    ``pre`` and ``post``: (..., T, d) in the model's own dim order; ``positions``: (T,).
    """
    pre_c = to_canonical(pre.float(), layout)  # (..., T, d)
    post_c = to_canonical(post.float(), layout.backend)  # (..., T, d)
    inv = torch.from_numpy(layout.canonical_inv_freq(inv_freq))  # (d/2,)
    amp = amplitude if layout.rotary_dims else 1.0
    rotated = rope.rotate(pre_c, positions, inv, amp)  # (..., T, d)
    scale = torch.linalg.vector_norm(post_c).clamp_min(1e-30)
    return float(torch.linalg.vector_norm(rotated - post_c) / scale)


def detect_layout(
    pre_q: torch.Tensor,
    post_q: torch.Tensor,
    pre_k: torch.Tensor,
    post_k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: np.ndarray,
    amplitude: float,
    tol: float,
    where: str,
) -> tuple[Layout, float]:
    """The candidate layout that turns the pre-RoPE q/k into the model's rotated q/k, and its error.

    All tensors (..., T, d) on the CPU; ``inv_freq`` the model's rotary table (r/2 bands). Refuses with one line
    naming ``where`` (architecture and layer) when no candidate reproduces them within ``tol``.
    """
    head_dim = pre_q.shape[-1]
    rotary_dims = 2 * len(inv_freq)
    if amplitude != 1.0 and rotary_dims != head_dim:
        raise UnsupportedModelError(
            f"{where}: not supported: partial rotary ({rotary_dims} of {head_dim} dims) with a RoPE amplitude "
            f"(attention_scaling {amplitude:g}) that scales only the rotated dims"
        )
    best, best_err = None, np.inf
    for layout in candidate_layouts(head_dim, rotary_dims):
        err = max(
            rotation_error(pre_q, post_q, positions, inv_freq, amplitude, layout),
            rotation_error(pre_k, post_k, positions, inv_freq, amplitude, layout),
        )
        if err < best_err:
            best, best_err = layout, err
    if not best_err <= tol:
        raise UnsupportedModelError(
            f"{where}: no known RoPE layout (half/interleaved, first/last {rotary_dims} of {head_dim} dims, NoPE) "
            f"reproduces the model's rotated q/k (best relative error {best_err:.1e}, tolerance {tol:.0e})"
        )
    return best, best_err
