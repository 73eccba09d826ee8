"""Small datasets laid out as docs/data-model.md, for the figure and trajectory tests: q/k of a qk.h5 with its
RoPE table (:func:`make_qk`) and a decomposition.nc's ``r`` and ``r_sweep`` (:func:`make_decomposition`)."""

from __future__ import annotations

import numpy as np
import xarray as xr

DUMMY_DISTANCES = [0, 250, 500, 1000, 2000]


def make_decomposition(n_samples=3, n_layers=2, n_heads=4, seed=0, r_layer_head=None) -> xr.Dataset:
    """``r`` equal to ``r_layer_head`` (or seeded uniform draws in [0.6, 0.99]) in every sample, method and sink;
    ``r_sweep`` just below it at each dummy distance."""
    rng = np.random.default_rng(seed)
    base = r_layer_head if r_layer_head is not None else rng.uniform(0.6, 0.99, size=(n_layers, n_heads))
    r = np.broadcast_to(base[None, :, :, None, None], (n_samples, n_layers, n_heads, 2, 2)).copy()
    drop = 0.01 * rng.random((n_samples, n_layers, n_heads, 2, len(DUMMY_DISTANCES)))
    r_sweep = np.clip(base[None, :, :, None, None] - drop, -1, 1)
    return xr.Dataset(
        {
            "r": (("sample", "layer", "head", "method", "sink"), r),
            "r_sweep": (("sample", "layer", "head", "sink", "D"), r_sweep),
        },
        coords={
            "sample": np.arange(n_samples),
            "layer": np.arange(n_layers),
            "head": np.arange(n_heads),
            "method": ["A", "B"],
            "sink": ["with", "without"],
            "D": DUMMY_DISTANCES,
        },
        attrs={"dummy_distance": 1000},
    )


def make_qk(n_samples=2, n_layers=2, n_heads=4, n_kv=2, n_tok=40, head_dim=8, seed=0, sliding=(0, 0)) -> xr.Dataset:
    """Seeded normal pre-RoPE q and k and a RoPE table of base 10000 (``sliding``: each layer's window)."""
    rng = np.random.default_rng(seed)
    bands = head_dim // 2
    inv_freq = np.stack([10000.0 ** (-np.arange(bands) * 2 / head_dim)] * n_layers).astype(np.float32)
    return xr.Dataset(
        {
            "q": (
                ("sample", "layer", "head", "token", "dim"),
                rng.normal(size=(n_samples, n_layers, n_heads, n_tok, head_dim)).astype(np.float32),
            ),
            "k": (
                ("sample", "layer", "kv_head", "token", "dim"),
                rng.normal(size=(n_samples, n_layers, n_kv, n_tok, head_dim)).astype(np.float32),
            ),
            "inv_freq": (("layer", "band"), inv_freq),
            "attention_scaling": ("layer", np.ones(n_layers)),
            "scaling": ("layer", np.full(n_layers, head_dim**-0.5)),
            "sliding_window": ("layer", np.asarray(sliding, dtype=np.int64)),
            "kv_group": ("head", np.arange(n_heads) // (n_heads // n_kv)),
        },
        coords={
            d: np.arange(n)
            for d, n in [
                ("sample", n_samples),
                ("layer", n_layers),
                ("head", n_heads),
                ("kv_head", n_kv),
                ("token", n_tok),
                ("dim", head_dim),
                ("band", bands),
            ]
        },
    )
