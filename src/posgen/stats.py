"""Correlation and bootstrap statistics shared by the decomposition, the experiments, the summary and the figures.

Only numpy and xarray at module level: the summary and figure jobs import this without torch. Functions that
accept torch tensors import torch lazily, only when handed one.
"""

from __future__ import annotations

import warnings

import numpy as np
import xarray as xr

from posgen.verdict_rules import value


def is_torch(x) -> bool:
    """Whether ``x`` is a torch tensor, without importing torch."""
    return type(x).__module__.startswith("torch")


def pearson(x, y):
    """Pearson r along the last axis of ``x`` and ``y``.

    torch tensors: computed in their dtype after centring, and centred IN PLACE (callers hand in fresh copies;
    the pair matrices of one pass are large). numpy arrays (or array-likes): float64 copies; NaN where a
    variance is zero; a plain float for 1-D inputs.
    """
    if is_torch(x):
        import torch

        x = x.sub_(x.mean(-1, keepdim=True))
        y = y.sub_(y.mean(-1, keepdim=True))
        dot = lambda a, b: torch.einsum("...n,...n->...", a, b)  # noqa: E731 - no product temporaries
        return dot(x, y) / torch.sqrt(dot(x, x) * dot(y, y))
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    x = x - x.mean(-1, keepdims=True)  # (..., n)
    y = y - y.mean(-1, keepdims=True)  # (..., n)
    cross = (x * y).sum(-1)  # (...)
    denom = np.sqrt((x * x).sum(-1) * (y * y).sum(-1))  # (...)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(denom > 0, cross / denom, np.nan)
    return float(r) if r.ndim == 0 else r


def pearson_from_sums(n, s_x, s_y, s_xx, s_yy, s_xy):
    """Pearson r from sums (raw, or of values shifted by constants); NaN where a variance is not positive.

    Works on torch tensors and numpy arrays alike.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        cxx = s_xx - s_x * s_x / n
        cyy = s_yy - s_y * s_y / n
        cxy = s_xy - s_x * s_y / n
        prod = cxx * cyy
        if is_torch(prod):
            import torch

            return torch.where(prod > 0, cxy / prod.sqrt(), float("nan"))  # sqrt's NaN where prod < 0 goes
        return np.where(prod > 0, cxy / np.sqrt(np.maximum(prod, 0)), np.nan)


def bootstrap_indices(n_samples: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n_samples) resampling indices, with replacement."""
    return np.random.default_rng(seed).integers(0, n_samples, size=(n_boot, n_samples))


def interval(point_fn, values: np.ndarray, idx: np.ndarray):
    """Point estimate and 95 % percentile interval of ``point_fn`` over the first axis of ``values``."""
    boot = np.stack([point_fn(values[i]) for i in idx])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanpercentile(boot, [2.5, 97.5], axis=0)
    return point_fn(values), lo, hi


def bootstrap_mean(x: xr.DataArray, dim: str, n_boot: int = 1000, seed: int = 0):
    """Mean over ``dim`` with its 95 % percentile bootstrap interval, as (mean, lo, hi) DataArrays.

    Resamples ``dim`` with :func:`bootstrap_indices`, exactly as the summary resamples samples.
    """
    x = x.transpose(dim, ...)
    values = np.asarray(x.values, dtype=np.float64)
    idx = bootstrap_indices(values.shape[0], n_boot, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a quantity that is NaN in every sample stays NaN
        mean, lo, hi = interval(lambda v: np.nanmean(v, axis=0), values, idx)
    coords = {k: v for k, v in x.coords.items() if dim not in v.dims}
    return tuple(xr.DataArray(a, dims=x.dims[1:], coords=coords) for a in (mean, lo, hi))


# ------------------------------------------------------------------ per-head ablation (method.md section 8.4)


def deposit_index(drop: np.ndarray) -> np.ndarray:
    """``max_h drop / sum_h max(drop, 0)`` over the last axis (head); NaN where no drop is positive."""
    drop = np.asarray(drop, dtype=np.float64)
    positive = np.clip(drop, 0, None).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(positive > 0, drop.max(-1) / positive, np.nan)


def top_gap(drop: np.ndarray) -> np.ndarray:
    """Largest minus second-largest value over the last axis (head)."""
    top = np.sort(np.asarray(drop, dtype=np.float64), -1)
    return top[..., -1] - top[..., -2]


MIN_TOP_DROP = 0.05  # the gated deposit index is NaN below this top drop (5 points)
CRITERION_TOP = value("CRITERION_TOP")  # the paper's deposit: one head's drop >= 30 points ...
CRITERION_SECOND = value("CRITERION_SECOND")  # ... while the second largest is <= 5 points


def deposit_statistics(drop: np.ndarray) -> dict[str, np.ndarray]:
    """Per row of ``drop (..., head)``: top drop, second drop, top head, the gated deposit index and the
    paper's boolean criterion."""
    drop = np.asarray(drop, dtype=np.float64)
    order = np.sort(drop, -1)
    top, second = order[..., -1], order[..., -2]
    positive = np.clip(drop, 0, None).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        index = np.where(top >= MIN_TOP_DROP, top / positive, np.nan)
    return {
        "top_drop": top,
        "second_drop": second,
        "top_head": drop.argmax(-1),
        "deposit_index": index,
        "deposit": (top >= CRITERION_TOP) & (second <= CRITERION_SECOND),
    }


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation over the entries finite in both (average ranks for ties); NaN under 3."""
    import pandas as pd

    x, y = np.ravel(x), np.ravel(y)
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3:
        return float("nan")
    rank_x = pd.Series(x[keep]).rank().to_numpy()
    rank_y = pd.Series(y[keep]).rank().to_numpy()
    return float(pearson(rank_x, rank_y))
