"""A ``decomposition.nc``-shaped dataset (``r`` and ``r_sweep``) with known per-(layer, head) values, for the
figure and trajectory tests."""

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
