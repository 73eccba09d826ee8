"""Per-band feature statistics of the pre-RoPE queries and keys (docs/method.md section 5).

For RoPE band l (dims l and l + d/2, rotated by theta_l) and each (layer, head): the squared norm of the
token mean (the shared, position-carrying component), the token variance ``E ||v_t - mean||^2`` (the
token-specific component) and their ratio. Statistics are taken over all tokens of a sample, then averaged
over samples.

Only rotated bands carry position: a band of frequency 0 (every band of a NoPE layer, the unrotated dims of a
partial-rotary head) is kept in the file but flagged ``rotated = False``; the figure and anything read against
theta leave it out. ``layer_type`` per layer is posgen.layer_types.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr
from tqdm import tqdm

from posgen.layer_types import layer_types
from posgen.store import carried_attrs, open_dataset, provenance, require, write_netcdf


def band_moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(||token mean||^2, token variance) per band of ``x[..., token, dim]``, float64, shape ``x[..., band]``."""
    x = np.asarray(x, dtype=np.float64)
    half = x.shape[-1] // 2
    mean = x.mean(-2)
    mean_sq = mean[..., :half] ** 2 + mean[..., half:] ** 2
    power = (x[..., :half] ** 2 + x[..., half:] ** 2).mean(-2)  # E ||v_t||^2
    return mean_sq, np.maximum(power - mean_sq, 0.0)


def _ratio(var: np.ndarray, mean_sq: np.ndarray) -> np.ndarray:
    """var / mean_sq; inf where a band has no mean component (e.g. never rotated), NaN for 0 / 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return var / mean_sq


def band_stats(qk_path, out_path, *, config_hash: str = "", progress: bool = True) -> xr.Dataset:
    """bands.nc from qk.h5, reading one (sample, layer) at a time (see docs/data-model.md)."""
    ds = open_dataset(qk_path, lazy=False)
    require(ds, ("q", "k", "inv_freq", "sliding_window"), str(qk_path))
    N, L, H, Hkv = ds.sizes["sample"], ds.sizes["layer"], ds.sizes["head"], ds.sizes["kv_head"]
    n_band = ds.sizes["dim"] // 2
    acc = {
        name: np.zeros(shape)
        for name, shape in {
            "q_mean_sq": (L, H, n_band),
            "q_var": (L, H, n_band),
            "k_mean_sq": (L, Hkv, n_band),
            "k_var": (L, Hkv, n_band),
        }.items()
    }
    label = f"bands {ds.attrs.get('model', '')}/{ds.attrs.get('variant', '')}"
    for s_, l_ in tqdm(
        [(s_, l_) for s_ in range(N) for l_ in range(L)], desc=label, unit="layer", disable=not progress
    ):
        for side in ("q", "k"):
            mean_sq, var = band_moments(ds[side].isel(sample=s_, layer=l_).values)
            acc[f"{side}_mean_sq"][l_] += mean_sq / N
            acc[f"{side}_var"][l_] += var / N
    data = {
        "q_mean_sq": (("layer", "head", "band"), acc["q_mean_sq"]),
        "q_var": (("layer", "head", "band"), acc["q_var"]),
        "q_ratio": (("layer", "head", "band"), _ratio(acc["q_var"], acc["q_mean_sq"])),
        "k_mean_sq": (("layer", "kv_head", "band"), acc["k_mean_sq"]),
        "k_var": (("layer", "kv_head", "band"), acc["k_var"]),
        "k_ratio": (("layer", "kv_head", "band"), _ratio(acc["k_var"], acc["k_mean_sq"])),
        "theta": (("layer", "band"), np.asarray(ds["inv_freq"].values, dtype=np.float64)),
    }
    coords = {
        "layer": ds["layer"].values,
        "head": ds["head"].values,
        "kv_head": ds["kv_head"].values,
        "band": np.arange(n_band),
        "layer_type": ("layer", layer_types(ds)),
        "rotated": (("layer", "band"), np.asarray(ds["inv_freq"].values) > 0),  # False: frequency 0, no position
    }
    out = xr.Dataset(
        data,
        coords=coords,
        attrs=provenance(config_hash=config_hash, source=str(Path(qk_path)), n_samples=int(N), **carried_attrs(ds)),
    )
    ds.close()
    write_netcdf(out, out_path)
    return out
