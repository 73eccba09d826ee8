"""Rotary position embedding in transformers' ``rotate_half`` convention (docs/method.md section 1).

Band l pairs dims l and l + d/2 and turns them by ``m * inv_freq[l]`` at position m. Everything here works
in float32 on whatever device the inputs live on. Angles are formed exactly as transformers forms them
(float32 ``position * inv_freq``), so re-rotating captured pre-RoPE vectors reproduces the model's own
rotated vectors to rounding.
"""

from __future__ import annotations

import torch


def angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """(T, band) rotation angles, float32 like the model's rotary embedding."""
    return positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]


def rotate(
    x: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    attention_scaling: float = 1.0,
) -> torch.Tensor:
    """Rotate ``x[..., T, d]`` to the given positions (length T, or a scalar broadcast to all tokens)."""
    positions = torch.as_tensor(positions, device=x.device)
    if positions.ndim == 0:
        positions = positions.expand(x.shape[-2])
    theta = angles(positions, inv_freq.to(x.device))
    cos = (theta.cos() * attention_scaling).to(torch.float32)
    sin = (theta.sin() * attention_scaling).to(torch.float32)
    x = x.to(torch.float32)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def logits(
    q: torch.Tensor,
    k: torch.Tensor,
    inv_freq: torch.Tensor,
    scaling: float,
    attention_scaling: float = 1.0,
) -> torch.Tensor:
    """True attention logits ``W[..., i, j] = s * (R_i q_i) . (R_j k_j)`` for all (i, j), float32.

    ``q`` is ``[..., T, d]``; ``k`` is ``[..., T, d]`` and broadcasts against ``q`` (expand KV heads first).
    """
    positions = torch.arange(q.shape[-2], device=q.device)
    q_rot = rotate(q, positions, inv_freq, attention_scaling)
    k_rot = rotate(k, positions, inv_freq, attention_scaling)
    return (q_rot @ k_rot.transpose(-1, -2)) * scaling


def causal_mask(n_tokens: int, sliding_window: int = 0, device=None) -> torch.Tensor:
    """Boolean (T, T) mask of the entries that count: j <= i, and i - j < W for a sliding-window layer."""
    i = torch.arange(n_tokens, device=device)[:, None]
    j = torch.arange(n_tokens, device=device)[None, :]
    mask = j <= i
    if sliding_window:
        mask &= (i - j) < sliding_window
    return mask
