"""The counted entries of one (sample, layer): j <= i, inside a sliding window, with or without the sink column
(docs/method.md section 1), and window sums along tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posgen.rope import causal_mask

SINKS = ("with", "without")  # 'without' drops key column 0 (the attention sink)


def window_prefix(x: torch.Tensor, window: int, dim: int = 0) -> torch.Tensor:
    """``out_i = sum of x_j over lo_i <= j <= i`` along ``dim``, lo_i = max(0, i - window + 1) (0: all j <= i)."""
    c = torch.cumsum(x, dim)
    n = x.shape[dim]
    if window and window < n:
        lagged = torch.zeros_like(c)
        lagged.narrow(dim, window, n - window).copy_(c.narrow(dim, 0, n - window))
        c = c - lagged
    return c


@dataclass(frozen=True)
class MaskInfo:
    """The entries that count: j <= i, within the window, and for ``without`` not in key column 0."""

    n_tokens: int
    window: int

    def count(self, sink: str) -> float:
        """Number of counted entries (computed on the host: no device round trip)."""
        T, W = self.n_tokens, min(self.window or self.n_tokens, self.n_tokens)
        n = W * (W + 1) // 2 + (T - W) * W  # row i counts min(i + 1, W) keys
        return float(n - W if sink == "without" else n)

    def bool(self, sink: str = "with", device=None) -> torch.Tensor:
        mask = causal_mask(self.n_tokens, self.window, device)
        if sink == "without":
            mask[:, 0] = False
        return mask
