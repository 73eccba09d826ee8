"""The gather of shards: the outputs of the jobs of one (model, variant), each over a contiguous range of its
windows, merged along ``sample`` (docs/data-model.md, "Shards").

A shard is named ``<start>-<stop>`` (global window indices, stop exclusive), e.g. ``0-16``
(:func:`posgen.workflow.shard_ranges`, light for the Snakefile); every output of a shard carries the global indices
as its ``sample`` coordinate, so the gathered file is the unsharded one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from posgen.store import open_dataset, provenance, write_netcdf

# attrs that differ between shards and how the gather combines them; any other attr is the first shard's
SUMMED_ATTRS = ("n_samples", "bound_samples", "runtime_s")
MAXIMUM_ATTRS = ("self_check_max_rel_error", "lstsq_residual_max", "transparency_rel_error")
# bands.nc: means over windows, combined weighted by each shard's n_samples
BAND_MEANS = ("q_mean_sq", "q_var", "k_mean_sq", "k_var")


def _gathered_attrs(parts: list[xr.Dataset], paths) -> dict:
    attrs = dict(parts[0].attrs)
    for key in SUMMED_ATTRS:
        if key in attrs:
            attrs[key] = type(attrs[key])(sum(p.attrs[key] for p in parts))
    for key in MAXIMUM_ATTRS:
        if key in attrs:
            attrs[key] = float(max(float(p.attrs[key]) for p in parts))
    attrs["source"] = ",".join(str(p) for p in paths)
    attrs["shards"] = ",".join(Path(p).parent.name for p in paths)
    return attrs


def _concat_samples(parts: list[xr.Dataset], paths) -> xr.Dataset:
    """Concatenation along ``sample``; every variable without it must be the same in every shard."""
    out = xr.concat(parts, dim="sample", data_vars="minimal", coords="minimal", compat="equals", join="exact")
    samples = out["sample"].values
    if len(np.unique(samples)) != len(samples):
        raise ValueError(f"gather: shards {', '.join(map(str, paths))} overlap in their windows")
    return out


def _mean_bands(parts: list[xr.Dataset]) -> xr.Dataset:
    """bands.nc of all the shards' windows: their means weighted by each shard's window count."""
    weights = np.array([int(p.attrs["n_samples"]) for p in parts], dtype=np.float64)
    out = parts[0].copy()
    for name in BAND_MEANS:
        stacked = np.stack([p[name].values for p in parts])  # (shard, ...)
        out[name] = (parts[0][name].dims, np.tensordot(weights / weights.sum(), stacked, axes=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        for side in "qk":
            out[f"{side}_ratio"] = out[f"{side}_var"] / out[f"{side}_mean_sq"]
    for name in set(out.data_vars) - set(BAND_MEANS) - {"q_ratio", "k_ratio"}:
        for p in parts[1:]:
            if not p[name].equals(parts[0][name]):
                raise ValueError(f"gather: bands.nc variable {name} differs between shards")
    return out


def gather(paths, out_path: str | Path) -> xr.Dataset:
    """Merge the per-shard NetCDFs ``paths`` (in window order) into ``out_path``; bands.nc is averaged, every
    other output concatenated along ``sample``."""
    paths = [Path(p) for p in paths]
    parts = [open_dataset(p, lazy=False).load() for p in paths]
    if Path(out_path).name == "bands.nc":
        out = _mean_bands(parts)
    else:
        out = _concat_samples(parts, paths)
    out.attrs = provenance(**{k: v for k, v in _gathered_attrs(parts, paths).items() if k != "created"})
    for p in parts:
        p.close()
    write_netcdf(out, out_path)
    return out


def gather_step(job) -> None:
    """Rule gather's job (a :class:`posgen.workflow.job.StepJob`): the shards' table merged into one."""
    gather(job.input["shards"], job.output["table"])
