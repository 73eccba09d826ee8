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
from posgen.stats import is_torch
from posgen.store import carried_attrs, open_dataset, provenance, require, write_netcdf


def band_moments(x):
    """(||token mean||^2, token variance) per band of ``x[..., token, dim]``, float64, shape ``x[..., band]``:
    numpy on the host, a torch tensor on its own device (the fused path on a GPU, with nothing copied to the host;
    on a CPU numpy's single thread is 2.7x faster than torch's two here, so the CPU keeps numpy)."""
    x = x.double() if is_torch(x) else np.asarray(x, dtype=np.float64)
    half = x.shape[-1] // 2
    mean = x.mean(-2)
    mean_sq = mean[..., :half] ** 2 + mean[..., half:] ** 2
    power = (x[..., :half] ** 2 + x[..., half:] ** 2).mean(-2)  # E ||v_t||^2
    return mean_sq, (power - mean_sq).clip(min=0)


def _ratio(var: np.ndarray, mean_sq: np.ndarray) -> np.ndarray:
    """var / mean_sq; inf where a band has no mean component (e.g. never rotated), NaN for 0 / 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return var / mean_sq


class BandTable:
    """The per-band statistics of windows added one (window, layer) at a time, and the bands.nc they make.

    ``rope`` is qk.h5 (the store path) or :func:`posgen.llm.fused.rope_dataset` (the fused path). Means over windows
    are accumulated as sums over ``n_samples`` windows: ``n_samples`` is recorded, so that a gather of shards
    weights each by it. Windows given as torch tensors (the fused path off the CPU) are summed on their device and
    read to the host once, by :meth:`dataset`.
    """

    def __init__(self, rope: xr.Dataset, n_samples: int):
        L, H, Hkv = rope.sizes["layer"], rope.sizes["head"], rope.sizes["kv_head"]
        n_band = rope.sizes["band"]
        self.rope = rope
        self.n_samples = int(n_samples)
        shapes = {"q": (L, H, n_band), "k": (L, Hkv, n_band)}
        self.acc = {f"{side}_{name}": np.zeros(shape) for side, shape in shapes.items() for name in ("mean_sq", "var")}

    def add(self, layer: int, q, k) -> None:
        """One window's q (head, token, dim) and k (kv_head, token, dim) of ``layer``."""
        for side, x in (("q", q), ("k", k)):
            for name, value in zip(("mean_sq", "var"), band_moments(x)):
                key = f"{side}_{name}"
                if is_torch(value) and not is_torch(self.acc[key]):  # the first window on a device: sum there
                    self.acc[key] = value.new_tensor(self.acc[key])
                self.acc[key][layer] += value / self.n_samples

    def dataset(self, attrs: dict) -> xr.Dataset:
        """bands.nc (docs/data-model.md); ``attrs`` are added to the provenance."""
        rope = self.rope
        acc = {key: value.cpu().numpy() if is_torch(value) else value for key, value in self.acc.items()}
        inv_freq = np.asarray(rope["inv_freq"].transpose("layer", "band").values, dtype=np.float64)
        data = {
            "q_mean_sq": (("layer", "head", "band"), acc["q_mean_sq"]),
            "q_var": (("layer", "head", "band"), acc["q_var"]),
            "q_ratio": (("layer", "head", "band"), _ratio(acc["q_var"], acc["q_mean_sq"])),
            "k_mean_sq": (("layer", "kv_head", "band"), acc["k_mean_sq"]),
            "k_var": (("layer", "kv_head", "band"), acc["k_var"]),
            "k_ratio": (("layer", "kv_head", "band"), _ratio(acc["k_var"], acc["k_mean_sq"])),
            "theta": (("layer", "band"), inv_freq),
        }
        coords = {
            "layer": rope["layer"].values,
            "head": rope["head"].values,
            "kv_head": rope["kv_head"].values,
            "band": np.arange(rope.sizes["band"]),
            "layer_type": ("layer", layer_types(rope)),
            "rotated": (("layer", "band"), inv_freq > 0),  # False: frequency 0, no position
        }
        return xr.Dataset(data, coords=coords, attrs=provenance(n_samples=self.n_samples, **attrs))


def band_stats(qk_path, out_path, *, config_hash: str = "", progress: bool = True) -> xr.Dataset:
    """bands.nc from qk.h5, reading one (sample, layer) at a time (see docs/data-model.md); the store path."""
    ds = open_dataset(qk_path, lazy=False)
    require(ds, ("q", "k", "inv_freq", "sliding_window"), str(qk_path))
    N, L = ds.sizes["sample"], ds.sizes["layer"]
    table = BandTable(ds, N)
    label = f"bands {ds.attrs.get('model', '')}/{ds.attrs.get('variant', '')}"
    for s_, l_ in tqdm(
        [(s_, l_) for s_ in range(N) for l_ in range(L)], desc=label, unit="layer", disable=not progress
    ):
        table.add(l_, ds["q"].isel(sample=s_, layer=l_).values, ds["k"].isel(sample=s_, layer=l_).values)
    out = table.dataset({"config_hash": config_hash, "source": str(Path(qk_path)), **carried_attrs(ds)})
    ds.close()
    write_netcdf(out, out_path)
    return out


def low_frequency_share(var: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Share of the token variance in the lower-frequency half of the rotating bands.

    ``var`` is (..., band), ``theta`` (band,); bands that never rotate (theta = 0) are left out. Returns ``var``
    without its band axis.
    """
    rotating = np.flatnonzero(theta > 0)
    by_frequency = rotating[np.argsort(theta[rotating], kind="stable")]  # lowest frequency first
    low = by_frequency[: len(by_frequency) // 2]
    total = var[..., rotating].sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return var[..., low].sum(-1) / total


def band_shares(path) -> dict[str, float]:
    """``low_share_q`` and ``low_share_k`` of a bands.nc: :func:`low_frequency_share` averaged over layers and
    heads."""
    bands = open_dataset(path, lazy=False)
    require(bands, ["q_var", "k_var", "theta"], str(path))
    theta = bands["theta"].values
    theta = theta[0] if theta.ndim > 1 else theta  # (layer, band): every layer of these models has one base
    shares = {}
    for side, head in (("q", "head"), ("k", "kv_head")):
        var = bands[f"{side}_var"].transpose("layer", head, "band").values  # (layer, head, band)
        shares[f"low_share_{side}"] = float(np.nanmean(low_frequency_share(var, theta)))
    bands.close()
    return shares


def bands_step(job) -> None:
    """Rule bands' job (the store path; a :class:`posgen.workflow.job.StepJob`)."""
    band_stats(job.input["qk"], job.output["bands"], config_hash=job.params["config_hash"])
