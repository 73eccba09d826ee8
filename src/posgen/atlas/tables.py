"""Tidy per-head tables (docs/data-model.md, "heads.parquet"):

* ``results/heads.parquet``: one row per (model, variant, layer, head, method, sink) with every per-head statistic
  of the first paper: the decomposition's per-window numbers as their mean over windows with a 95 % percentile
  bootstrap interval over windows (``<name>_lo``, ``<name>_hi``; the summary's resampling, posgen.stats), then the
  columns of every step that declares per-head columns (posgen.workflow.steps: ``heads``; the low-frequency
  shares of bands.nc, the block-swap score, the head-ablation loss increase where measured);
* ``results/synthetic/heads.parquet``: one row per (experiment, task, pe, seed, layer, head) of the second paper:
  each classifier's head-ablation drop beside its Toeplitz shares.

Both carry ``config_hash`` and ``posgen_version`` as constant columns (as the CSV tables do) and in the Parquet
file's key-value metadata. Read them with ``pandas.read_parquet(path)``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import xarray as xr

from posgen.parquet import write_table
from posgen.paths import owner
from posgen.stats import bootstrap_indices, interval
from posgen.store import open_dataset, provenance, require
from posgen.workflow.job import listed, resolve
from posgen.workflow.steps import STEPS

HEAD_KEYS = ["model", "variant", "layer", "head", "method", "sink"]
CLASSIFIER_KEYS = ["experiment", "task", "pe", "seed", "layer", "head"]
# decomposition.nc's per-window statistics over (layer, head, method, sink): mean over windows with its interval
PER_METHOD = ("r", "r_rc", "r_f", "r_g", "r2_f", "r2_g")  # r_rc: the row-centred r (docs/method.md section 4)
# ... over (layer, head, sink), the same on every method's row; (name, variable, basis or None)
PER_SINK = (
    ("q_position_share_linear", "q_position_share", "linear"),
    ("q_position_share_smooth", "q_position_share", "smooth"),
    ("k_position_share_linear", "k_position_share", "linear"),
    ("k_position_share_smooth", "k_position_share", "smooth"),
    ("k_shared_share", "k_shared_share", None),
    ("k_scaled_share", "k_scaled_share", None),
)
CLASSIFIER_VARIABLES = {
    "ablation": ("base_accuracy", "ablated_accuracy", "drop", "kept_accuracy"),
    "toeplitz": ("toeplitz_share", "additive_share", "distance_share", "content_share", "interaction_share"),
}


def _by_owner(paths) -> dict[tuple[str, str], str]:
    return {owner(path): str(path) for path in paths}


def _mean_interval(values: np.ndarray, idx: np.ndarray, point_fn=None):
    """Mean over the first axis (windows) and its 95 % bootstrap interval over ``idx``; ``point_fn`` another
    statistic of the windows."""
    point_fn = point_fn or (lambda v: np.nanmean(v, axis=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a head that is NaN in every window stays NaN
        return interval(point_fn, values, idx)


def _f_share(parts: np.ndarray) -> np.ndarray:
    """f share ``r2_f / (r2_f + r2_g)`` of the window means (posgen.llm.head_ablation.per_head_split's)."""
    r2_f, r2_g = np.nanmean(parts[:, 0], axis=0), np.nanmean(parts[:, 1], axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return r2_f / (r2_f + r2_g)


def _columns(stats: dict[str, tuple], shape: tuple) -> dict[str, np.ndarray]:
    """{name, name_lo, name_hi: values broadcast to ``shape``} of {name: (point, lo, hi)}."""
    out = {}
    for name, (point, lo, hi) in stats.items():
        for suffix, value in (("", point), ("_lo", lo), ("_hi", hi)):
            out[name + suffix] = np.broadcast_to(value, shape).ravel()
    return out


def variant_heads(decomposition: xr.Dataset, n_boot: int, seed: int, what: str = "decomposition.nc") -> pd.DataFrame:
    """The rows of one (model, variant)'s decomposition.nc (``what``: its path, for errors): (layer, head, method,
    sink) with every statistic."""
    needed = [name for name in PER_METHOD if name != "r_rc"]
    require(
        decomposition, [*needed, *(v for _, v, _ in PER_SINK), "r_sweep", "layer_type", "dummy_distance_used"], what
    )
    dec = decomposition.transpose("sample", "layer", "head", "method", "sink", "basis", "D")
    n_layers, n_heads = dec.sizes["layer"], dec.sizes["head"]
    methods, sinks = dec["method"].values.tolist(), dec["sink"].values.tolist()
    shape = (n_layers, n_heads, len(methods), len(sinks))
    idx = bootstrap_indices(dec.sizes["sample"], n_boot, seed)  # one set for every variant: same windows
    # r_rc is NaN in a file from before the row-centred r
    stats = {
        name: _mean_interval(dec[name].values.astype(np.float64), idx) if name in dec else (np.full(shape, np.nan),) * 3
        for name in PER_METHOD
    }
    parts = np.stack([dec["r2_f"].values, dec["r2_g"].values], axis=1).astype(np.float64)  # (sample, 2, ...)
    stats["f_share"] = _mean_interval(parts, idx, _f_share)
    for name, variable, basis in PER_SINK:
        one = dec[variable] if basis is None else dec[variable].sel(basis=basis)
        point, lo, hi = _mean_interval(one.transpose("sample", "layer", "head", "sink").values.astype(float), idx)
        stats[name] = tuple(a[:, :, None, :] for a in (point, lo, hi))  # the same on every method
    grid = np.meshgrid(dec["layer"].values, dec["head"].values, methods, sinks, indexing="ij")
    frame = pd.DataFrame(dict(zip(["layer", "head", "method", "sink"], (g.ravel() for g in grid))))
    frame = frame.assign(**_columns(stats, shape))
    # Method A's r at every dummy distance D (mean over windows), on Method A's rows only
    sweep = np.nanmean(dec["r_sweep"].transpose("sample", "layer", "head", "sink", "D").values, axis=0)
    is_a = (frame["method"] == "A").to_numpy()
    for d, values in zip(dec["D"].values.tolist(), np.moveaxis(sweep, -1, 0)):
        column = np.broadcast_to(values[:, :, None, :], shape).ravel().copy()
        frame[f"r_sweep_d{d}"] = np.where(is_a, column, np.nan)
    frame["layer_type"] = np.broadcast_to(dec["layer_type"].values[:, None, None, None], shape).ravel()
    frame["dummy_distance_used"] = np.broadcast_to(
        dec["dummy_distance_used"].values[:, None, None, None], shape
    ).ravel()
    return frame


def head_table(tables: dict[str, list], *, n_boot: int, seed: int, config_hash: str = "") -> pd.DataFrame:
    """The first paper's per-head table from rule heads' inputs by role (posgen.workflow.targets.head_tables): the
    rows of every (model, variant) whose decomposition.nc is in ``tables["decomposition"]``; each other role a step
    whose ``heads`` reader (posgen.workflow.steps) adds its columns to the rows of the variants it has a table of
    (NaN where a variant has none, e.g. no head ablation on a random-init model)."""
    readers = {role: resolve(STEPS[role].heads) for role in tables if role != "decomposition"}
    owned = {role: _by_owner(paths) for role, paths in tables.items() if role != "decomposition"}
    frames = []
    for path in tables.get("decomposition", ()):
        model, variant = owner(path)
        frame = variant_heads(open_dataset(path, lazy=False), n_boot, seed, str(path))
        at = (frame["layer"].to_numpy(), frame["head"].to_numpy())
        for role, by in owned.items():
            if (model, variant) in by:
                for name, values in readers[role](by[(model, variant)]).items():
                    frame[name] = values[at]
        frames.append(frame.assign(model=model, variant=variant))
    if not frames:
        raise ValueError("head_table: no decomposition.nc given")
    table = pd.concat(frames, ignore_index=True)
    table = table[HEAD_KEYS + [c for c in table.columns if c not in HEAD_KEYS]]
    return table.assign(config_hash=config_hash, posgen_version=provenance()["posgen_version"])


def classifier_table(ablation, toeplitz=None, *, config_hash: str = "") -> pd.DataFrame:
    """The second paper's per-classifier, per-head table: a collection's gathered ablation.nc (and toeplitz.nc),
    one row per (experiment, task, pe, seed, layer, head); ``is_top_head``: the head of its layer whose ablation
    drops accuracy most."""
    parts = {"ablation": ablation} if toeplitz is None else {"ablation": ablation, "toeplitz": toeplitz}
    columns = {}
    for part, path in parts.items():
        ds = open_dataset(path, lazy=False)
        require(ds, [*CLASSIFIER_VARIABLES[part], *CLASSIFIER_KEYS], str(path))
        for name in CLASSIFIER_VARIABLES[part]:
            columns[name] = ds[name].broadcast_like(ds["drop"] if "drop" in ds else ds[name])
        if part == "ablation":
            columns["is_top_head"] = ds["top_head"] == ds["head"]
    data = xr.Dataset(columns).transpose(*CLASSIFIER_KEYS)
    table = data.to_dataframe().reset_index()[CLASSIFIER_KEYS + list(columns)]
    return table.assign(config_hash=config_hash, posgen_version=provenance()["posgen_version"])


def heads_step(job) -> pd.DataFrame:
    """Rule heads' job: results/heads.parquet from every model variant's tables."""
    p = job.params
    tables = {role: listed(paths) for role, paths in job.input.items()}
    table = head_table(tables, n_boot=int(p["n_boot"]), seed=int(p["seed"]), config_hash=p["config_hash"])
    write_table(table, job.output["heads"], **_provenance(p))
    return table


def classifier_heads_step(job) -> pd.DataFrame:
    """Rule classifier_heads' job: a collection's per-classifier, per-head table."""
    table = classifier_table(job.input["ablation"], job.input.get("toeplitz"), config_hash=job.params["config_hash"])
    write_table(table, job.output["heads"], **_provenance(job.params))
    return table


def _provenance(params) -> dict[str, str]:
    prov = provenance(config_hash=params["config_hash"])
    return {key: prov[key] for key in ("config_hash", "posgen_version", "created")}
