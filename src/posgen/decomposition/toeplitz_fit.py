"""Variance shares of the best Toeplitz ``a(i-j)`` and additive ``a(i-j) + b(i) + c(j)`` fits of logit matrices
(docs/method.md section 8.5; used by posgen.synthetic.toeplitz)."""

from __future__ import annotations

import torch

from posgen.decomposition.design import AdditiveDesign
from posgen.rope import causal_mask


def toeplitz_shares(logits: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Variance shares of the best ``a(i-j)`` and of the best ``a(i-j) + b(i) + c(j)`` fit of logit matrices.

    ``logits (..., T, T)``; with ``causal`` only the entries j <= i count, else all (bidirectional). Shares are
    ``1 - SSE / SST`` over the counted entries, float64, shaped ``logits.shape[:-2]``; NaN for a constant
    matrix. The best Toeplitz fit is the mean of each diagonal; the additive fit is :class:`AdditiveDesign`.
    """
    T = logits.shape[-1]
    lead = logits.shape[:-2]
    design = AdditiveDesign(T, 0, "with", logits.device, causal=causal)
    mask = causal_mask(T, 0, logits.device) if causal else torch.ones(T, T, dtype=torch.bool, device=logits.device)
    n = mask.sum().double()
    w = logits.reshape(-1, T, T).double() * mask  # (m, T, T), zero outside the mask
    # shares are shift invariant; centring keeps the sums of squares below from cancelling
    w = (w - (w.sum((-1, -2)) / n)[:, None, None]) * mask
    sst = (w * w).sum((-1, -2))  # (m,)
    diag = torch.stack([torch.diagonal(w, -d, dim1=-2, dim2=-1).sum(-1) for d in design.deltas.tolist()], -1)
    rows, cols, col0 = w.sum(-1), w.sum(-2), w[..., :, 0]  # (m, T) each
    # diagonal means: explained sum of squares sum_delta (diagonal sum)^2 / count (the overall mean is 0)
    toeplitz_ss = (diag * diag / design.cnt_a.clamp(min=1)).sum(-1)  # (m,)
    _, _, sums = design.fit(*design.rhs((diag, rows, cols, col0)))
    additive_ss = sums["sum_yy"] - sums["sum_y"] ** 2 / n  # (m,)
    nan = torch.full_like(sst, float("nan"))
    positive = sst > 1e-300
    toeplitz = torch.where(positive, toeplitz_ss / sst.clamp(min=1e-300), nan)
    additive = torch.where(positive, additive_ss / sst.clamp(min=1e-300), nan)
    return toeplitz.reshape(lead), additive.reshape(lead)
