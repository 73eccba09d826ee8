"""Aggregates of decomposition.nc with 95 % bootstrap intervals over samples (docs/method.md sections 4 and 6).

Per (model, variant, layer type, method, sink): the mean of per-head r (over samples, layers, heads), the
pooled r of all scored entries, per-layer means, and for every random-init variant the paired difference to the
trained model. Samples are the resampling unit: every variant of a model saw the same token windows, so one set
of bootstrap indices serves all variants (paired).

Layer types (``layer_type`` of decomposition.nc, posgen.layer_types): the rows with layer type
``rope`` cover every RoPE layer (global and sliding-window; NoPE layers never enter them); a model with more
than one layer type also gets rows per type (``global``, ``sliding``, ``nope``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import xarray as xr

from posgen.config import VARIANT_TRAINED, variant_order
from posgen.integrity import check_rows, shown
from posgen.layer_types import LAYER_TYPES
from posgen.stats import bootstrap_indices, interval, pearson_from_sums
from posgen.store import atomic_path, open_dataset, provenance, require, write_netcdf
from posgen.verdict_rules import value

SUFF = ("n", "sum_x", "sum_y", "sum_xx", "sum_yy", "sum_xy")
RC_SUFF = ("rc_sum_xx", "rc_sum_yy", "rc_sum_xy")  # the row-centred r's: every row's mean is 0
VECTORS = ("q", "k")  # position shares of the pre-RoPE query and key (docs/method.md section 3C)
BASES = ("linear", "smooth")
# the key's share that Method A-shared's s(j) explains (docs/method.md section 3C), beside the position shares
SHARE_COLUMNS = [f"{v}_position_share_{basis}" for v in VECTORS for basis in BASES] + ["k_shared_share"]
SHARE_COLUMNS += ["k_scaled_share"]  # the same with one fitted amplitude per window and KV head (a diagnostic)
COLUMNS = [
    "model",
    "variant",
    "method",
    "sink",
    "layer_type",
    "mean_r",
    "mean_r_lo",
    "mean_r_hi",
    "pooled_r",
    "pooled_r_lo",
    "pooled_r_hi",
    "r2_f",
    "r2_g",
    "diff_vs_trained",
    "diff_lo",
    "diff_hi",
    "diff_vs_a",
    "diff_vs_a_lo",
    "diff_vs_a_hi",
    "n_samples",
    "n_tokens",
    "heldout_windows",
    "share_floor",
    "min_layer_r",
    "min_layer_r_lo",
    "min_layer_r_hi",
    "heads_below",
    "heads_below_lo",
    "heads_below_hi",
    "r_sweep",
    "sweep_spread",
    "sweep_spread_lo",
    "sweep_spread_hi",
    "err_over_bound",
    "n_layers",
    "n_heads",
    "dummy_distance",
    *SHARE_COLUMNS,
    # the same on the row-centred r (docs/method.md section 4): each query row less its mean over its scored keys
    *(f"{name}{end}" for name in ("mean_rc", "pooled_rc", "diff_rc") for end in ("", "_lo", "_hi")),
    *(f"{name}{end}" for name in ("min_layer_rc", "heads_below_rc") for end in ("", "_lo", "_hi")),
    "r_sweep_rc",
    *(f"sweep_spread_rc{end}" for end in ("", "_lo", "_hi")),
]
ALL_ROPE = "rope"  # the layer_type of the rows over every RoPE layer (global and sliding-window, never NoPE)
HEAD_R = value("HEAD_R")  # heads_below: the share of (layer, head) whose mean r over samples is below this


def _nanmean(v: np.ndarray, axis) -> np.ndarray:
    """nanmean without the warning for all-NaN slices (heads whose r is undefined stay NaN)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(v, axis=axis)


def _mean(v: np.ndarray) -> np.ndarray:
    return _nanmean(v, 0)


def _lowest_layer(per_layer: np.ndarray) -> np.ndarray:
    """The lowest per-layer mean r, (method, sink), of per-(sample, layer) r ``(sample, layer, method, sink)``."""
    with warnings.catch_warnings():  # a method without any r (A-shared without held-out windows): NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmin(_mean(per_layer), 0)


def _below(r: np.ndarray) -> np.ndarray:
    """The share of (layer, head) whose mean r over samples is below HEAD_R, (method, sink), of ``r (sample,
    layer, head, method, sink)``."""
    head_r = _mean(r)  # (layer, head, method, sink)
    return (head_r < HEAD_R).sum((0, 1)) / np.isfinite(head_r).sum((0, 1)).clip(min=1)


def _spread(sweep: np.ndarray) -> np.ndarray:
    """max_D - min_D of the mean over samples of ``sweep (sample, sink, D)``: (sink,)."""
    mean = _mean(sweep)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(mean, -1) - np.nanmin(mean, -1)


def _pooled(suff: np.ndarray) -> np.ndarray:
    """Pearson r of summed sufficient statistics; ``suff`` is (sample, ..., 6)."""
    total = suff.sum(0)
    return pearson_from_sums(*(total[..., i] for i in range(len(SUFF))))


def read_decompositions(paths) -> dict[str, dict[str, xr.Dataset]]:
    """{model: {variant: dataset}} from decomposition.nc files, keyed by their ``model`` / ``variant`` attrs."""
    out: dict[str, dict[str, xr.Dataset]] = {}
    for path in paths:
        ds = open_dataset(path, lazy=False)
        require(ds, ("r", "r2_f", "r2_g", "q_position_share", "k_position_share", *SUFF), str(path))
        model, variant = ds.attrs.get("model"), ds.attrs.get("variant")
        if not model or not variant:
            raise KeyError(f"{shown(path)}: attrs 'model' and 'variant' are required")
        if variant in out.setdefault(model, {}):
            raise ValueError(f"{shown(path)}: a second decomposition for {model}/{variant}")
        out[model][variant] = ds.load()
        ds.close()
    return out


def layer_groups(types) -> dict[str, np.ndarray]:
    """Layer type -> boolean mask over layers: ``rope`` (every RoPE layer, if any) and, when a model has more
    than one layer type (or only NoPE layers), each type present, in the order of ``LAYER_TYPES``."""
    types = np.asarray(types, dtype=str)
    present = [t for t in LAYER_TYPES if (types == t).any()]
    groups = {}
    if (types != "nope").any():
        groups[ALL_ROPE] = types != "nope"
    if len(present) > 1 or present == ["nope"]:
        groups.update({t: types == t for t in present})
    return groups


def decomposition_layer_types(ds: xr.Dataset) -> np.ndarray:
    """``layer_type`` per layer of a decomposition; files written before layer types existed are all global."""
    if "layer_type" in ds.coords or "layer_type" in ds:
        return np.asarray(ds["layer_type"].values, dtype=str)
    return np.full(ds.sizes["layer"], "global")


def _distance_text(ds: xr.Dataset) -> str:
    """The dummy distance(s) Method A used on the layers of ``ds``: one number, or several joined by '/'."""
    if "dummy_distance_used" in ds.coords or "dummy_distance_used" in ds:
        used = np.asarray(ds["dummy_distance_used"].values)
    elif "dummy_distance" in ds.attrs:  # written before per-layer distances: one D for every layer
        used = np.full(ds.sizes["layer"], int(ds.attrs["dummy_distance"]))
    else:
        return ""
    return "/".join(str(int(D)) for D in sorted(set(used.tolist())))


def _sweep_text(ds: xr.Dataset, r: np.ndarray) -> str:
    """Method A's mean r at every dummy distance of the sweep, as ``D:r`` pairs: "0:0.883 250:0.947"."""
    return " ".join(f"{int(D)}:{value:.4f}" for D, value in zip(ds["D"].values, r))


def _err_over_bound(ds: xr.Dataset) -> np.ndarray:
    """(sink,) Method A's mean absolute error over the mean of its section 5 bound, on the windows where both were
    evaluated (``bound_samples``); NaN where neither was."""
    if "err_abs_mean" not in ds or "bound_mean" not in ds:
        return np.full(ds.sizes["sink"], np.nan)
    err = ds["err_abs_mean"].transpose(..., "sink").values
    bound = ds["bound_mean"].transpose(..., "sink").values
    axes = tuple(range(err.ndim - 1))
    bound = _nanmean(bound, axes)
    with np.errstate(divide="ignore", invalid="ignore"):  # NoPE layers: no rotation, a bound of 0
        return np.where(bound > 0, _nanmean(err, axes) / bound, np.nan)


def share_floor(ds: xr.Dataset) -> float:
    """The smooth position share of pure noise, (M - 1) / (T - 1) for the M = degree + 1 functions of the smooth
    basis over T tokens (docs/method.md section 3C); NaN for a file that does not record T."""
    if "n_tokens" not in ds.attrs or "smooth_degree" not in ds.attrs:
        return float("nan")
    return int(ds.attrs["smooth_degree"]) / (int(ds.attrs["n_tokens"]) - 1)


def _suff(ds: xr.Dataset, statistic: str) -> np.ndarray | None:
    """``(sample, method, sink, 6)`` sufficient statistics of the raw (``"r"``) or row-centred (``"r_rc"``) r,
    summed over layers and heads (the row-centred entries have mean 0: n, 0, 0, then their sums); None where a
    file written before the row-centred r lacks them."""
    if statistic == "r":
        return np.stack([ds[name].values.sum(axis=(1, 2)) for name in SUFF], -1)
    if any(name not in ds for name in RC_SUFF):
        return None
    sums = [ds[name].values.sum(axis=(1, 2)) for name in ("n", *RC_SUFF)]
    zero = np.zeros_like(sums[0])
    return np.stack([sums[0], zero, zero, *sums[1:]], -1)


# the columns of :func:`_intervals`' five (estimate, low, high) triples, of the raw and of the row-centred r: a name
# for a name, name_lo, name_hi
INTERVAL_COLUMNS = {
    "r": ("mean_r", "pooled_r", ("diff_vs_trained", "diff_lo", "diff_hi"), "min_layer_r", "heads_below"),
    "r_rc": ("mean_rc", "pooled_rc", "diff_rc", "min_layer_rc", "heads_below_rc"),
}


def _columns(names, triples) -> dict[str, np.ndarray]:
    """{column: values} of (estimate, low, high) ``triples``, named by ``names`` (as in :data:`INTERVAL_COLUMNS`)."""
    out = {}
    for name, triple in zip(names, triples):
        out.update(zip(name if isinstance(name, tuple) else (name, f"{name}_lo", f"{name}_hi"), triple))
    return out


def _intervals(ds: xr.Dataset, statistic: str, per_sample, trained, min_layer, idx, suff) -> list[tuple]:
    """The (estimate, low, high) over windows of one r of one (variant, layer group), raw (``"r"``) or row-centred
    (``"r_rc"``), each ``(method, sink)``: the mean r, the pooled r of ``suff``, the paired difference to the
    ``trained`` model's (NaN for the trained model itself), the lowest layer's mean r (``min_layer``) and the share
    of heads below HEAD_R (the first paper's verdicts decide on the intervals)."""
    r = ds[statistic].values  # (sample, layer, head, method, sink)
    nan = np.full(per_sample.shape[1:], np.nan)
    diff = interval(_mean, per_sample - trained, idx) if trained is not None else (nan, nan, nan)
    _, min_lo, min_hi = interval(_lowest_layer, _nanmean(r, 2), idx)
    return [
        interval(_mean, per_sample, idx),
        interval(_pooled, suff, idx),
        diff,
        (min_layer, min_lo, min_hi),
        interval(_below, r, idx),
    ]


def row_centred(ds: xr.Dataset, per_sample, trained, min_layer, idx) -> dict[str, np.ndarray]:
    """The row-centred r's columns of one (variant, layer group) (``_rc`` in :data:`COLUMNS`), each ``(method,
    sink)``: as the raw r's in :func:`_rows`; NaN for a file written before the row-centred r."""
    nan = np.full(per_sample.shape[1:], np.nan)
    suff = _suff(ds, "r_rc")
    if suff is None:
        return _columns((*INTERVAL_COLUMNS["r_rc"], "sweep_spread_rc"), [(nan, nan, nan)] * 5 + [(nan[0],) * 3])
    out = _columns(INTERVAL_COLUMNS["r_rc"], _intervals(ds, "r_rc", per_sample, trained, min_layer, idx, suff))
    sweep = _nanmean(ds["r_sweep_rc"].values, (1, 2))  # (sample, sink, D)
    out |= _columns(["sweep_spread_rc"], [interval(_spread, sweep, idx)])
    out["r_sweep_rc"] = _mean(sweep)  # (sink, D)
    return out


def _shares(ds: xr.Dataset) -> dict[str, np.ndarray]:
    """The share columns (:data:`SHARE_COLUMNS`) of one (variant, layer group), each (sink,): the position shares
    of q and k on each basis, and the key's shares that Method A-shared explains (NaN in a file written before
    A-shared / the amplitude)."""
    shares = {
        f"{vector}_position_share_{basis}": _nanmean(
            ds[f"{vector}_position_share"].sel(basis=basis).transpose("sample", "layer", "head", "sink").values,
            (0, 1, 2),
        )  # (sink,)
        for vector in VECTORS
        for basis in BASES
    }
    for name in ("k_shared_share", "k_scaled_share"):
        values = ds[name].transpose("sample", "layer", "head", "sink").values if name in ds else None
        shares[name] = np.full(ds.sizes["sink"], np.nan) if values is None else _nanmean(values, (0, 1, 2))
    return shares


def _method_a_columns(ds: xr.Dataset, rc: dict, idx) -> dict[str, tuple]:
    """The columns only Method A's rows fill, {column: ((sink,) values, what the other methods' rows hold)}: its
    mean r at every dummy distance of the sweep and the sweep's spread with its interval over windows, raw and
    row-centred (``rc``: :func:`row_centred`), and its mean error over the section 5 bound."""
    n_sinks = ds.sizes["sink"]
    if "r_sweep" in ds:
        sweep_text = [_sweep_text(ds, r) for r in _nanmean(ds["r_sweep"].values, (0, 1, 2))]  # a (D,) r per sink
        spread = interval(_spread, _nanmean(ds["r_sweep"].values, (1, 2)), idx)
    else:
        sweep_text, spread = [""] * n_sinks, [np.full(n_sinks, np.nan)] * 3
    out = {"r_sweep": (sweep_text, "")}
    out |= {name: (values, np.nan) for name, values in _columns(["sweep_spread"], [spread]).items()}
    out["err_over_bound"] = (_err_over_bound(ds), np.nan)
    rc_text = [_sweep_text(ds, r) for r in rc["r_sweep_rc"]] if "r_rc" in ds else [""] * n_sinks
    out["r_sweep_rc"] = (rc_text, "")
    out |= {name: (values, np.nan) for name, values in rc.items() if name.startswith("sweep_spread_rc")}
    return out


def _rows(model, variant, group, ds, per_sample, trained, min_layer, idx) -> list[dict]:
    """The summary.csv rows of one (variant, layer group): ``ds`` its layers, ``per_sample`` its mean r per
    (sample, method, sink), raw and row-centred (``{"r": .., "r_rc": ..}``), ``trained`` the trained model's (None
    for the trained model itself), ``min_layer`` its lowest per-layer mean r per (method, sink) (the same two),
    ``idx`` the bootstrap draws."""
    rc = row_centred(ds, per_sample["r_rc"], trained and trained["r_rc"], min_layer["r_rc"], idx)
    methods = list(ds["method"].values)
    raw = _intervals(ds, "r", per_sample["r"], trained and trained["r"], min_layer["r"], idx, _suff(ds, "r"))
    cells = _columns(INTERVAL_COLUMNS["r"], raw)  # (method, sink) each
    # each construction's mean r less Method A's, paired over samples (what a diagnostic closes)
    vs_a = per_sample["r"] - per_sample["r"][:, methods.index("A")][:, None]  # (sample, method, sink)
    cells |= _columns(["diff_vs_a"], [interval(_mean, vs_a, idx)])
    # variance explained by f / g alone: NaN for a method without f and g (Method B)
    cells |= {name: _nanmean(ds[name].values, (0, 1, 2)) for name in ("r2_f", "r2_g")}
    cells |= {name: values for name, values in rc.items() if "sweep" not in name}
    shares, method_a = _shares(ds), _method_a_columns(ds, rc, idx)  # (sink,) each
    same = {
        "model": model,
        "variant": variant,
        "layer_type": group,
        "n_samples": ds.sizes["sample"],
        "n_tokens": int(ds.attrs.get("n_tokens", 0)),  # 0: a file from before the attr
        "heldout_windows": int(ds.attrs.get("heldout_windows", 0)),
        "share_floor": share_floor(ds),
        "n_layers": ds.sizes["layer"],
        "n_heads": ds.sizes["head"],
    }
    distance = _distance_text(ds)
    rows = []
    for mi, method in enumerate(methods):
        has_fg = np.isfinite(cells["r2_f"][mi]).any()  # the dummy distance is that of the f + g constructions
        for si, sink in enumerate(list(ds["sink"].values)):
            row = {**same, "method": method, "sink": sink, "dummy_distance": distance if has_fg else ""}
            row |= {name: values[mi, si] for name, values in cells.items()}
            row |= {name: values[si] for name, values in shares.items()}
            row |= {name: values[si] if method == "A" else other for name, (values, other) in method_a.items()}
            rows.append({column: row[column] for column in COLUMNS})  # in the table's order
    return rows


def summarize_model(model: str, by_variant: dict[str, xr.Dataset], n_boot: int, seed: int):
    """(rows of summary.csv, summary.nc dataset) for one model."""
    variants = sorted(by_variant, key=variant_order)  # trained, random-init seeds, then step<N>
    first = by_variant[variants[0]]
    types = decomposition_layer_types(first)
    for v in variants[1:]:
        if not np.array_equal(by_variant[v]["sample"].values, first["sample"].values):
            raise ValueError(
                f"{model}/{v}: samples differ from {variants[0]}; the paired comparison needs the same windows"
            )
        if not np.array_equal(decomposition_layer_types(by_variant[v]), types):
            raise ValueError(f"{model}/{v}: layer types differ from {variants[0]}")
    methods, sinks, layers = list(first["method"].values), list(first["sink"].values), first["layer"].values
    n_samples = first.sizes["sample"]
    idx = bootstrap_indices(n_samples, n_boot, seed)
    groups = layer_groups(types)
    statistics = ("r", "r_rc")  # raw and row-centred (a file from before the row-centred r: NaN)
    layer_r = np.full((len(statistics), len(variants), len(methods), len(sinks), len(layers)), np.nan)
    layer_lo, layer_hi = layer_r.copy(), layer_r.copy()
    # per layer, the mean over samples and heads of each position share: (variant, vector, basis, sink, layer)
    layer_share = np.full((len(variants), len(VECTORS), len(BASES), len(sinks), len(layers)), np.nan)
    rows = []
    data = {v: by_variant[v].transpose("sample", "layer", "head", "method", "sink", ...) for v in variants}
    for vi, v in enumerate(variants):
        for ri, name in enumerate(statistics):
            if name not in data[v]:
                continue
            per_layer = _nanmean(data[v][name].values, 2)  # (sample, layer, method, sink)
            lr, llo, lhi = interval(_mean, per_layer, idx)
            layer_r[ri, vi], layer_lo[ri, vi], layer_hi[ri, vi] = (np.moveaxis(a, 0, -1) for a in (lr, llo, lhi))
        for ci, vector in enumerate(VECTORS):
            share = data[v][f"{vector}_position_share"].sel(basis=list(BASES))  # (sample, layer, head, basis, sink)
            share = share.transpose("sample", "layer", "head", "basis", "sink").values
            layer_share[vi, ci] = np.moveaxis(_nanmean(share, (0, 2)), 0, -1)  # (basis, sink, layer)
    for group, keep in groups.items():
        per_sample = {}
        for vi, v in enumerate(variants):
            ds = data[v].isel(layer=np.flatnonzero(keep))
            per_sample[v] = {  # (sample, method, sink) each
                name: _nanmean(ds[name].values, (1, 2))
                if name in ds
                else np.full(ds["r"].shape[:1] + ds["r"].shape[3:], np.nan)
                for name in statistics
            }
            trained = per_sample.get(VARIANT_TRAINED) if v != VARIANT_TRAINED else None
            with warnings.catch_warnings():  # a method without any r (A-shared without held-out windows): NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                min_layer = {name: np.nanmin(layer_r[ri, vi][..., keep], -1) for ri, name in enumerate(statistics)}
            rows += _rows(model, v, group, ds, per_sample[v], trained, min_layer, idx)
    # rows: variant, then layer type, method, sink
    order = {v: i for i, v in enumerate(variants)}
    group_order = {g: i for i, g in enumerate(groups)}
    rows.sort(key=lambda row: (order[row["variant"]], group_order[row["layer_type"]]))
    dims = ("variant", "method", "sink", "layer")
    coords = {
        "variant": variants,
        "method": methods,
        "sink": sinks,
        "layer": layers,
        "layer_type": ("layer", types),
        "vector": list(VECTORS),
        "basis": list(BASES),
    }
    if "dummy_distance_used" in first.coords or "dummy_distance_used" in first:
        coords["dummy_distance_used"] = ("layer", np.asarray(first["dummy_distance_used"].values))
    nc = xr.Dataset(
        {
            "layer_r": (dims, layer_r[0]),
            "layer_r_lo": (dims, layer_lo[0]),
            "layer_r_hi": (dims, layer_hi[0]),
            "layer_rc": (dims, layer_r[1]),  # the row-centred r's
            "layer_rc_lo": (dims, layer_lo[1]),
            "layer_rc_hi": (dims, layer_hi[1]),
            "layer_position_share": (("variant", "vector", "basis", "sink", "layer"), layer_share),
        },
        coords=coords,
    )
    return rows, nc


def summarize(
    decomposition_paths,
    csv_path,
    nc_paths: dict,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    config_hash: str = "",
    window_seed: int | None = None,
) -> pd.DataFrame:
    """results/summary.csv over all models and variants, and results/<model>/summary.nc per model; ``window_seed``
    (the windows' seed, a column: which data set the verdicts judge, posgen.verdict_rules.data_status)."""
    data = read_decompositions(decomposition_paths)
    missing = sorted(set(nc_paths) - set(data))
    if missing:
        raise KeyError(f"summary: no decomposition.nc for model(s) {', '.join(missing)}")
    prov = provenance(config_hash=config_hash, n_boot=int(n_boot), bootstrap_seed=int(seed), interval="95% percentile")
    all_rows = []
    for model in sorted(data):
        rows, nc = summarize_model(model, data[model], n_boot, seed)
        all_rows += rows
        if model in nc_paths:
            nc.attrs = {**prov, "model": model}
            write_netcdf(nc, nc_paths[model])
    table = pd.DataFrame(all_rows, columns=COLUMNS)
    table["window_seed"] = -1 if window_seed is None else int(window_seed)  # -1: not recorded
    # provenance as constant columns, so that plain CSV readers keep working
    table["config_hash"] = config_hash
    table["posgen_version"] = prov["posgen_version"]
    with atomic_path(csv_path) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    return table


def concat_tables(csv_paths, csv_path) -> pd.DataFrame:
    """results/summary.csv: the per-model summary.csv files one after another, their text kept verbatim."""
    # read as text: the cells (digits, config_hash) are copied, never re-parsed and re-printed
    tables = [pd.read_csv(path, dtype=str, keep_default_na=False) for path in csv_paths]
    for path, one in zip(csv_paths, tables):
        check_rows(path, {"model": one.get("model", [])})  # another model's table in its place
    table = pd.concat(tables, ignore_index=True)
    with atomic_path(csv_path) as tmp:
        table.to_csv(tmp, index=False)
    return table


def summarize_step(job) -> pd.DataFrame:
    """Rule summarize's job (a :class:`posgen.workflow.job.StepJob`): one model's summary over its variants."""
    p = job.params
    return summarize(
        job.input["decomposition"],
        job.output["csv"],
        {job.wildcards["model"]: job.output["nc"]},
        n_boot=p["n_boot"],
        seed=p["seed"],
        config_hash=p["config_hash"],
        window_seed=(p.get("fresh_windows") or {}).get("window_seed", p["window_seed"]),
    )


def summary_table_step(job) -> pd.DataFrame:
    """Rule summary_table's job: the per-model tables in one."""
    return concat_tables(job.input["csv"], job.output["csv"])
