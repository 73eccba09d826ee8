"""Paper figures and the reproduction table.

Every ``fig_*`` function takes xarray inputs laid out as in docs/data-model.md and returns a matplotlib
Figure drawn in the one house style (:func:`style`); :func:`save_figure` writes it as PNG and PDF with
fixed metadata, so the same inputs give the same bytes. :func:`example_heads` computes the data behind
figures 1 and 2 from ``qk.h5``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
import xarray as xr  # noqa: E402
from matplotlib.colors import LogNorm, Normalize  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from posgen.config import VARIANT_TRAINED, init_seed  # noqa: E402
from posgen.figure_table import FIGURES as FIGURE_TABLE  # noqa: E402
from posgen.figure_table import STUDY_FIGURES, TRAJECTORY_FIGURES  # noqa: E402
from posgen.stats import bootstrap_mean, pearson  # noqa: E402
from posgen.store import atomic_path, require  # noqa: E402

PAPER_R = 0.959  # Han & Ji 2025: Pearson r between true logits and f + g
COLUMN_WIDTH = 3.4  # inches: one column of a two-column paper
PAGE_WIDTH = 7.0  # inches: both columns
DPI = 200

# --------------------------------------------------------------------------------------------- style

_RC = {
    "font.family": "DejaVu Sans",  # bundled with matplotlib: the same glyphs on every machine
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7,
    "legend.frameon": False,
    "lines.linewidth": 1.2,
    "lines.markersize": 3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.5,
    "image.cmap": "viridis",
    "figure.dpi": 100,
    "figure.constrained_layout.use": True,
    "pdf.fonttype": 42,  # embed TrueType so text stays editable
    "svg.hashsalt": "posgen",
}


@contextlib.contextmanager
def style():
    """The house style: seaborn 'paper' context, 'ticks' axes, colour-blind palette, 8 pt text."""
    rc = {**sns.axes_style("ticks"), **sns.plotting_context("paper"), **_RC}
    with plt.rc_context(rc), sns.color_palette("colorblind"):
        yield


def _styled(func):
    """Draw ``func``'s figure inside :func:`style`."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with style():
            return func(*args, **kwargs)

    return wrapper


def variant_colors(variants) -> dict[str, tuple]:
    """Trained in blue; random-init seeds in shades of orange, in seed order."""
    variants = list(variants)
    randoms = [v for v in variants if v != VARIANT_TRAINED]
    shades = sns.color_palette("Oranges_r", max(len(randoms), 1) + 1)
    colors = {v: shades[i] for i, v in enumerate(randoms)}
    colors[VARIANT_TRAINED] = sns.color_palette("colorblind")[0]
    return {v: colors[v] for v in variants}


def save_figure(fig: Figure, png: str | Path, pdf: str | Path | None = None, provenance: dict | None = None):
    """Write ``fig`` atomically as PNG (and PDF) with reproducible bytes, then close it.

    matplotlib stamps its version and the creation time into both formats; both are blanked. The caller's
    provenance (without a timestamp, to stay byte-identical) goes into the PNG Description / PDF Subject.
    """
    text = json.dumps(provenance, sort_keys=True, default=str) if provenance else None
    targets = [(png, "png", {"Software": None, "Description": text})]
    if pdf is not None:
        targets.append((pdf, "pdf", {"Creator": None, "Producer": None, "CreationDate": None, "Subject": text}))
    try:
        for path, fmt, metadata in targets:
            with atomic_path(path) as tmp:
                fig.savefig(tmp, format=fmt, dpi=DPI, metadata=metadata)
    finally:
        plt.close(fig)


def _figure_legend(fig: Figure, ax) -> None:
    """One legend for the whole figure, below the panels, from the entries of ``ax``."""
    handles, labels = ax.get_legend_handles_labels()
    per_row = max(1, int(fig.get_figwidth() / 1.6))  # entries that fit side by side
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), per_row))


def _integer_ticks(axis) -> None:
    axis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def _log_axis(ax, which: str, ticks=None) -> None:
    """Log scale; with ``ticks``, exactly those ticks, written as plain numbers."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    # label minor ticks (2, 3, ...) only when the axis spans less than about a decade
    axis.set_minor_formatter(matplotlib.ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.5)))
    if ticks is not None:
        axis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_locator(matplotlib.ticker.NullLocator())


# layer types other than global, as the figures mark them: label, marker, shading colour
LAYER_MARKS = {"sliding": ("sliding-window layer", ">", "0.55"), "nope": ("NoPE layer", "x", "tab:red")}


def _layer_types(x) -> np.ndarray | None:
    """``layer_type`` per layer (a coordinate carried over from decomposition.nc), or None where absent."""
    if "layer_type" not in x.coords:
        return None
    types = x["layer_type"]
    if types.ndim > 1:  # stacked over variants: the architecture, hence the types, are the same for all
        types = types.isel({d: 0 for d in types.dims if d != "layer"})
    return np.asarray(types.values, dtype=str)


def _type_groups(x) -> dict[str, np.ndarray | None]:
    """Layer type -> mask over layers when ``x`` has more than one type; else {"all": None} (every layer)."""
    types = _layer_types(x)
    if types is None or len(set(types)) < 2:
        return {"all": None}
    return {t: types == t for t in ("global", "sliding", "nope") if (types == t).any()}


# ------------------------------------------------------------------------- data behind figures 1 and 2

SELECTION_RULE = (
    "Method A r (at the dummy distance, sink column dropped) averaged over samples; 'median' is the head at the "
    "lower median of that list, 'worst' the head with the lowest r; ties go to the lowest (layer, head)."
)


def select_heads(decomposition: xr.Dataset) -> dict[str, tuple[int, int, float]]:
    """The example heads of figures 1 and 2: {"median": (layer, head, r), "worst": ...} (see SELECTION_RULE)."""
    require(decomposition, ["r"], "decomposition.nc")
    # a dict, because method= is a keyword of sel()
    r = decomposition["r"].sel({"method": "A", "sink": "without"}).mean("sample").transpose("layer", "head")
    flat = r.values.ravel()
    if not np.isfinite(flat).any():
        raise ValueError("decomposition.nc: r has no finite values for method A, sink 'without'")
    flat = np.where(np.isfinite(flat), flat, np.inf)  # a dead head (NaN r) is never picked
    order = np.argsort(flat, kind="stable")
    n_finite = int(np.isfinite(flat).sum())
    picks = {"median": order[(n_finite - 1) // 2], "worst": order[0]}
    layer, head = np.unravel_index(list(picks.values()), r.shape)
    return {
        name: (int(r["layer"].values[li]), int(r["head"].values[hi]), float(flat[i]))
        for (name, i), li, hi in zip(picks.items(), layer, head)
    }


def example_heads(
    qk: xr.Dataset,
    decomposition: xr.Dataset,
    *,
    sample: int = 0,
    map_tokens: int = 256,
    pool_pairs: int = 1000,
    seed: int = 0,
) -> xr.Dataset:
    """W, f, g maps of the example heads and a seeded sample of (W, f + g) entries of every head.

    All on one ``sample`` of qk.h5 with the sink column j = 0 dropped (from kbar and from the entries), at
    each layer's dummy distance of the decomposition (``dummy_distance_used``: inside the window of a
    sliding-window layer). Maps are cropped to the first ``map_tokens`` tokens; NaN
    marks entries that are not scored (j > i, j = 0, outside a sliding window).
    """
    import torch  # here, not at module level: the figure rules need no torch and start faster

    from posgen.method_a import method_a_pairs, method_a_terms  # the sink-free reading, as in perturb.nc
    from posgen.rope import causal_mask, logits

    require(qk, ["q", "k", "inv_freq", "scaling", "attention_scaling", "sliding_window", "kv_group"], "qk.h5")
    if sample not in qk["sample"].values:
        kept = qk["sample"].values.tolist()
        raise IndexError(f"config.figures.sample: {sample} is not a window kept in qk.h5 (it keeps {kept})")
    dummy_distance = int(decomposition.attrs["dummy_distance"])
    if "dummy_distance_used" in decomposition.coords:
        used = np.asarray(decomposition["dummy_distance_used"].values, dtype=np.int64)  # (layer,)
    else:  # written before per-layer distances: one D for every layer
        used = np.full(qk.sizes["layer"], dummy_distance, dtype=np.int64)
    heads = select_heads(decomposition)
    qs = qk["q"].sel(sample=sample).astype(np.float32)  # float32 whatever the storage dtype
    ks = qk["k"].sel(sample=sample).astype(np.float32)
    n_tok = qs.sizes["token"]
    positions = torch.arange(n_tok)
    kv_group = torch.as_tensor(qk["kv_group"].values)
    crop = min(map_tokens, n_tok)
    rng = np.random.default_rng(seed)
    layer_ids, head_ids = qk["layer"].values, qk["head"].values

    n_layers, n_heads = len(layer_ids), len(head_ids)
    n_pool = min(pool_pairs, n_tok * (n_tok - 1) // 2)  # a sliding-window layer may offer fewer: NaN-padded
    pool_w = np.full((n_layers, n_heads, n_pool), np.nan, np.float32)
    pool_a = np.full_like(pool_w, np.nan)
    pool_ij = np.full((2, n_layers, n_pool), -1, np.int64)
    maps = {}
    for li in tqdm(range(n_layers), desc="example heads", unit="layer"):
        mask = causal_mask(n_tok, int(qk["sliding_window"].values[li])).numpy()
        mask[:, 0] = False  # the attention sink is analysed apart
        valid = np.flatnonzero(mask)
        chosen = np.sort(rng.choice(valid, size=min(n_pool, valid.size), replace=False))
        ii, jj = np.unravel_index(chosen, mask.shape)
        pool_ij[:, li, : len(chosen)] = ii, jj

        q = torch.from_numpy(np.asarray(qs.isel(layer=li).values, dtype=np.float32))
        k = torch.from_numpy(np.asarray(ks.isel(layer=li).values, dtype=np.float32))[kv_group]
        inv_freq = torch.from_numpy(np.asarray(qk["inv_freq"].values[li], dtype=np.float32))
        s = float(qk["scaling"].values[li])
        a = float(qk["attention_scaling"].values[li])
        w_pairs, f_pairs, g_pairs = method_a_pairs(
            q, k, positions, inv_freq, s, a, int(used[li]), torch.from_numpy(ii), torch.from_numpy(jj)
        )
        pool_w[li, :, : len(chosen)] = w_pairs.numpy()
        pool_a[li, :, : len(chosen)] = (f_pairs + g_pairs).numpy()
        for name, (layer, head, _) in heads.items():
            if layer != layer_ids[li]:
                continue
            h = int(np.flatnonzero(head_ids == head)[0])
            w = logits(q[h], k[h], inv_freq, s, a).numpy()
            f, g = (
                t[0].numpy()
                for t in method_a_terms(
                    q[h : h + 1], k[h : h + 1], positions, inv_freq, s, a, dummy_distance=int(used[li])
                )
            )
            keep = mask[:crop, :crop]
            maps[name] = {
                "W": np.where(keep, w[:crop, :crop], np.nan),
                "f": np.where(keep, f[:crop, :crop], np.nan),
                "g": np.where(keep, g[:crop, :crop], np.nan),
                "r_sample": pearson(w[mask], (f + g)[mask]),
            }

    names = list(heads)
    ds = xr.Dataset(
        {
            var: (("example", "query", "key"), np.stack([maps[n][var] for n in names]).astype(np.float32))
            for var in ("W", "f", "g")
        }
        | {
            "pool_W": (("layer", "head", "pair"), pool_w),
            "pool_A": (("layer", "head", "pair"), pool_a),
            "pool_query": (("layer", "pair"), pool_ij[0]),
            "pool_key": (("layer", "pair"), pool_ij[1]),
        },
        coords={
            "example": names,
            "example_layer": ("example", [heads[n][0] for n in names]),
            "example_head": ("example", [heads[n][1] for n in names]),
            "example_r": ("example", [heads[n][2] for n in names]),
            "example_r_sample": ("example", [maps[n]["r_sample"] for n in names]),
            "query": np.arange(crop),
            "key": np.arange(crop),
            "layer": qk["layer"].values,
            "head": qk["head"].values,
            "pair": np.arange(n_pool),
            "dummy_distance_used": ("layer", used),
        },
        attrs={
            "sample": sample,
            "dummy_distance": dummy_distance,
            "sink": "without",
            "map_tokens": crop,
            "pool_pairs": n_pool,
            "pool_seed": seed,
            "selection_rule": SELECTION_RULE,
        },
    )
    return ds


EXAMPLE_OPTIONS = ("sample", "map_tokens", "pool_pairs", "seed")


def write_examples(qk_path, decomposition_path, out_path, options: dict | None = None, **attrs) -> xr.Dataset:
    """examples.nc: :func:`example_heads` of one model variant, with provenance attrs."""
    from posgen.store import open_dataset, provenance, write_netcdf

    options = dict(options or {})
    unknown = sorted(set(options) - set(EXAMPLE_OPTIONS))
    if unknown:
        raise KeyError(f"config.figures: unknown key(s) {', '.join(unknown)} (known: {', '.join(EXAMPLE_OPTIONS)})")
    qk = open_dataset(qk_path, lazy=True)
    ds = example_heads(qk, open_dataset(decomposition_path, lazy=False), **options)
    ds.attrs.update(provenance(**attrs))
    write_netcdf(ds, out_path)
    return ds


# ---------------------------------------------------------------------------------------- figure 1, 2


def _symmetric_limit(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(np.quantile(finite, 0.99)) if finite.size else 1.0


@_styled
def fig_logit_maps(examples: xr.Dataset) -> Figure:
    """Figure 1: W, f, g and f + g for each example head (rows), one symmetric colour scale per row."""
    require(examples, ["W", "f", "g", "example"], "examples.nc")
    n = examples.sizes["example"]
    fig, axes = plt.subplots(n, 4, figsize=(PAGE_WIDTH, 1.85 * n + 0.3), squeeze=False, sharex=True, sharey=True)
    for row, name in enumerate(examples["example"].values):
        ex = examples.sel(example=name)
        panels = {
            "true logit $W$": ex["W"].values,
            "positional $f$": ex["f"].values,
            "semantic $g$": ex["g"].values,
            "$f + g$": (ex["f"] + ex["g"]).values,
        }
        lim = _symmetric_limit(panels["true logit $W$"])
        norm = Normalize(-lim, lim)
        for col, (title, values) in enumerate(panels.items()):
            ax = axes[row, col]
            im = ax.imshow(values, cmap="RdBu_r", norm=norm, interpolation="nearest", origin="upper")
            ax.set_title(title if row == 0 else "")
            ax.grid(False)
            if col == 0:
                ax.set_ylabel(f"{name}: L{int(ex.example_layer)} H{int(ex.example_head)}\nquery position $i$")
            if row == n - 1:
                ax.set_xlabel("key position $j$")
        fig.colorbar(im, ax=axes[row, :].tolist(), shrink=0.9, label="logit", pad=0.01)
    return fig


@_styled
def fig_scatter(examples: xr.Dataset) -> Figure:
    """Figure 2: W against f + g for the median example head (with its r) and a hexbin over all heads."""
    require(examples, ["pool_W", "pool_A", "example"], "examples.nc")
    ex = examples.sel(example="median" if "median" in examples["example"] else examples["example"].values[0])
    layer, head = int(ex.example_layer), int(ex.example_head)
    w = ex["pool_W"].sel(layer=layer, head=head).values
    a = ex["pool_A"].sel(layer=layer, head=head).values
    keep = np.isfinite(w) & np.isfinite(a)
    w, a = w[keep], a[keep]
    all_w = examples["pool_W"].values.ravel()
    all_a = examples["pool_A"].values.ravel()
    keep = np.isfinite(all_w) & np.isfinite(all_a)
    all_w, all_a = all_w[keep], all_a[keep]

    fig, axes = plt.subplots(1, 2, figsize=(COLUMN_WIDTH, 1.95))
    ax = axes[0]
    ax.scatter(a, w, s=2, alpha=0.4, linewidth=0, rasterized=True)
    ax.set_title(f"median head L{layer} H{head}\n$r$ = {float(ex.example_r_sample):.3f}")
    ax = axes[1]
    hb = ax.hexbin(all_a, all_w, gridsize=60, norm=LogNorm(), mincnt=1, cmap="mako_r", linewidths=0)
    fig.colorbar(hb, ax=ax, label="entries", pad=0.01)
    ax.set_title(f"all heads pooled\n$r$ = {pearson(all_w, all_a):.3f}")
    for ax, (x, y) in zip(axes, [(a, w), (all_a, all_w)]):
        lo, hi = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
        ax.plot([lo, hi], [lo, hi], ls="--", lw=0.8, color="0.3", label="$W = f + g$")
        ax.set_xlabel("approximation $f + g$")
        ax.set_ylabel("true logit $W$")
    axes[0].legend(loc="upper left")
    return fig


# ---------------------------------------------------------------------------------------- figure 3-6


@_styled
def fig_r_heatmap(r: xr.DataArray) -> Figure:
    """Figure 3: mean r over layer x head; rows = method, columns = variant, one shared colour scale.

    ``r`` has dims (variant, method, layer, head), already averaged over samples. With a ``layer_type``
    coordinate, sliding-window and NoPE layers are marked in a strip left of head 0.
    """
    require(r, ["variant", "method", "layer", "head"], "r heatmap input")
    n_rows, n_cols = r.sizes["method"], r.sizes["variant"]
    finite = r.values[np.isfinite(r.values)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    vmin = min(vmin, vmax - 1e-6)
    width = min(PAGE_WIDTH, 0.9 + 1.3 * n_cols)  # one column for trained + one seed
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(width, 1.6 * n_rows), squeeze=False, sharex=True, sharey=True)
    for i, method in enumerate(r["method"].values):
        for j, variant in enumerate(r["variant"].values):
            ax = axes[i, j]
            values = r.sel({"method": method, "variant": variant}).transpose("layer", "head")
            im = ax.imshow(
                values.values,
                aspect="auto",
                origin="lower",
                vmin=vmin,
                vmax=vmax,
                cmap="viridis",
                interpolation="nearest",
            )
            ax.grid(False)
            _mark_layer_rows(ax, _layer_types(r), r.sizes["head"])
            ax.set_title(str(variant) if i == 0 else "")
            ax.set_xlabel("head")
            ax.set_ylabel(f"method {method}\nlayer")
            _integer_ticks(ax.xaxis)
            _integer_ticks(ax.yaxis)
            ax.label_outer()
    fig.colorbar(im, ax=axes.ravel().tolist(), label="Pearson $r$", shrink=0.9, pad=0.01)
    if axes[0, 0].get_legend_handles_labels()[0]:
        _figure_legend(fig, axes[0, 0])
    return fig


def _mark_layer_rows(ax, types, n_heads: int) -> None:
    """Markers for sliding-window / NoPE layers in a blank strip left of head 0 (image rows = layers)."""
    if types is None or not any(t in LAYER_MARKS for t in types):
        return
    ax.set_xlim(-1.7, n_heads - 0.5)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}" if x >= 0 else ""))
    for kind, (label, marker, color) in LAYER_MARKS.items():
        rows = np.flatnonzero(types == kind)
        if rows.size:
            ax.plot(np.full(rows.size, -1.1), rows, ls="none", marker=marker, color=color, label=label)


@_styled
def fig_layer_r(summary: xr.Dataset) -> Figure:
    """Figure 4: per-layer mean r with 95 % bootstrap intervals; columns = method, rows = sink handling.

    With a ``layer_type`` coordinate, sliding-window and NoPE layers are shaded.
    """
    require(summary, ["layer_r", "layer_r_lo", "layer_r_hi", "variant", "method", "sink", "layer"], "summary.nc")
    colors = variant_colors(summary["variant"].values)
    sinks, methods = summary["sink"].values, summary["method"].values
    fig, axes = plt.subplots(
        len(sinks),
        len(methods),
        figsize=(COLUMN_WIDTH, 1.5 * len(sinks) + 0.5),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    layer = summary["layer"].values
    for i, sink in enumerate(sinks):
        for j, method in enumerate(methods):
            ax = axes[i, j]
            for variant in summary["variant"].values:
                sel = summary.sel({"variant": variant, "method": method, "sink": sink})
                ax.plot(layer, sel["layer_r"], marker="o", color=colors[variant], label=variant)
                ax.fill_between(layer, sel["layer_r_lo"], sel["layer_r_hi"], color=colors[variant], alpha=0.25, lw=0)
            ax.axhline(PAPER_R, ls="--", lw=0.8, color="0.3", label=f"paper ({PAPER_R})")
            _shade_layers(ax, layer, _layer_types(summary))
            ax.set_title(f"method {method}, sink {sink}")
            ax.set_xlabel("layer")
            ax.set_ylabel("mean Pearson $r$")
            _integer_ticks(ax.xaxis)
            ax.label_outer()
    _figure_legend(fig, axes[0, 0])
    return fig


def _shade_layers(ax, layer: np.ndarray, types) -> None:
    """Shade the sliding-window and NoPE layers of a per-layer plot (one legend entry per type)."""
    if types is None:
        return
    for kind, (label, _, color) in LAYER_MARKS.items():
        for n, li in enumerate(np.flatnonzero(types == kind)):
            ax.axvspan(layer[li] - 0.5, layer[li] + 0.5, color=color, alpha=0.15, lw=0, label=label if n == 0 else None)


@_styled
def fig_bands(bands: xr.Dataset) -> Figure:
    """Figure 5: per-band ||token mean||^2, token variance and their ratio against theta, for q and k.

    ``bands`` is bands.nc with an extra ``variant`` dim. Lines: median over (layer, head) per band, bands:
    interquartile range; x: theta (median over the layers where the band rotates). Only rotated bands enter:
    a (layer, band) with frequency 0 (a NoPE layer, the unrotated dims of a partial-rotary head) is left out of
    the medians and of the log axis.
    """
    stats = [("mean_sq", "$\\|$token mean$\\|^2$"), ("var", "token variance"), ("ratio", "variance / mean$^2$")]
    require(bands, ["theta", "variant"] + [f"{s}_{n}" for s in "qk" for n, _ in stats], "bands.nc")
    colors = variant_colors(bands["variant"].values)
    fig, axes = plt.subplots(2, 3, figsize=(PAGE_WIDTH, 4.2), sharex=True)
    layer_theta = bands["theta"]
    if "variant" in layer_theta.dims:  # frequencies are the same for every variant
        layer_theta = layer_theta.isel(variant=0, drop=True)
    rotated = layer_theta > 0  # (layer, band) or (band,)
    theta = layer_theta.where(rotated)
    theta = (theta.median("layer") if "layer" in theta.dims else theta).values  # NaN: a band that never rotates
    rotating = np.isfinite(theta) & (theta > 0)
    for i, side in enumerate(("q", "k")):
        head_dim = "head" if side == "q" else "kv_head"
        for j, (stat, label) in enumerate(stats):
            ax = axes[i, j]
            for variant in bands["variant"].values:
                v = bands[f"{side}_{stat}"].sel(variant=variant).where(rotated)  # unrotated entries: NaN
                pooled = v.stack(unit=("layer", head_dim)).transpose("band", "unit").values
                pooled = pooled[rotating]  # bands that rotate in some layer: never an all-NaN row
                med = np.nanmedian(pooled, axis=1)
                q25, q75 = np.nanquantile(pooled, [0.25, 0.75], axis=1)
                ax.plot(theta[rotating], med, color=colors[variant], label=variant)
                ax.fill_between(theta[rotating], q25, q75, color=colors[variant], alpha=0.25, lw=0)
            _log_axis(ax, "x")
            _log_axis(ax, "y")
            ax.set_title(f"{side}: {label}")
            ax.set_ylabel(label)
            if i == 1:
                ax.set_xlabel("RoPE frequency $\\theta_l$")
    _figure_legend(fig, axes[0, 0])
    return fig


@_styled
def fig_dummy_sweep(r_sweep: xr.DataArray, n_boot: int = 1000, seed: int = 0) -> Figure:
    """Figure 6: Method A r against the dummy distance D (mean over heads, 95 % bootstrap over samples).

    ``r_sweep`` has dims (variant, sample, layer, head, sink, D); columns = sink handling. With a
    ``layer_type`` coordinate of more than one type, one row per layer type (global, sliding-window, NoPE),
    each averaging only its layers; a dotted line marks the D a row's layers are scored at elsewhere
    (``dummy_distance_used``).
    """
    require(r_sweep, ["variant", "sample", "layer", "head", "sink", "D"], "r_sweep")
    colors = variant_colors(r_sweep["variant"].values)
    groups = _type_groups(r_sweep)
    used = r_sweep["dummy_distance_used"] if "dummy_distance_used" in r_sweep.coords else None
    if used is not None and used.ndim > 1:
        used = used.isel({dim: 0 for dim in used.dims if dim != "layer"})
    sinks = r_sweep["sink"].values
    fig, axes = plt.subplots(
        len(groups), len(sinks), figsize=(COLUMN_WIDTH, 0.4 + 1.7 * len(groups)), squeeze=False, sharey=True
    )
    d = r_sweep["D"].values
    for i, (group, keep) in enumerate(groups.items()):
        part = r_sweep if keep is None else r_sweep.isel(layer=np.flatnonzero(keep))
        per_sample = part.mean(["layer", "head"])
        mean, lo, hi = bootstrap_mean(per_sample, "sample", n_boot=n_boot, seed=seed)
        distances = [] if used is None else sorted(set(used.values[keep if keep is not None else slice(None)]))
        for j, sink in enumerate(sinks):
            ax = axes[i, j]
            for variant in r_sweep["variant"].values:
                sel = {"variant": variant, "sink": sink}
                ax.plot(d, mean.sel(sel).transpose("D"), marker="o", color=colors[variant], label=variant)
                ax.fill_between(
                    d, lo.sel(sel).transpose("D"), hi.sel(sel).transpose("D"), color=colors[variant], alpha=0.25, lw=0
                )
            ax.axhline(PAPER_R, ls="--", lw=0.8, color="0.3", label=f"paper ({PAPER_R})")
            if group != "nope":  # a NoPE layer has no dummy distance: every D gives the same
                for n, D in enumerate(distances):
                    ax.axvline(D, ls=":", lw=0.8, color="0.3", label="$D$ used" if n == 0 else None)
            ax.set_title(f"sink {sink}" if keep is None else f"{group} layers, sink {sink}")
            ax.set_xlabel("dummy distance $D$")
            ax.set_ylabel("mean $r$, method A")
            ax.label_outer()
    _figure_legend(fig, axes[0, 0])
    return fig


# ----------------------------------------------------------------------------- perturbation and capping


def _rate_axis(ax, rates_percent):
    # symlog: p = 0 sits on the axis while 1 % ... 50 % stay apart
    ax.set_xscale("symlog", linthresh=1.0, linscale=0.5)
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(rates_percent))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("perturbed fraction $p$ (%)")


def _kind_grid(perturb: xr.Dataset):
    """A page-wide grid with one panel per perturbation kind: (fig, axes, kinds, rates in %)."""
    kinds = perturb["kind"].values
    n_cols = 3
    n_rows = -(-len(kinds) // n_cols)
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(PAGE_WIDTH, 2.0 * n_rows + 0.3), squeeze=False, sharex=True, sharey=True
    )
    return fig, axes, kinds, perturb["rate"].values * 100


def _finish_kind_grid(fig: Figure, axes, kinds, x, ylabel: str) -> None:
    """Titles, rate axes and labels of a :func:`_kind_grid`; unused panels removed; one legend."""
    for ax, kind in zip(axes.ravel(), kinds):
        ax.set_title(str(kind))
        _rate_axis(ax, x)
        ax.set_ylabel(ylabel)
        ax.label_outer()
    for ax in axes.ravel()[len(kinds) :]:
        ax.remove()
    _figure_legend(fig, axes[0, 0])


@_styled
def fig_perturb_ppl(perturb: xr.Dataset, n_boot: int = 1000, seed: int = 0) -> Figure:
    """Perplexity relative to the unperturbed text against p, one panel per perturbation kind.

    ``perturb`` is perturb.nc with an extra ``variant`` dim; mean over samples with 95 % bootstrap band.
    """
    require(perturb, ["ppl_ratio", "variant", "kind", "rate", "sample"], "perturb.nc")
    colors = variant_colors(perturb["variant"].values)
    mean, lo, hi = bootstrap_mean(perturb["ppl_ratio"], "sample", n_boot=n_boot, seed=seed)
    fig, axes, kinds, x = _kind_grid(perturb)
    for ax, kind in zip(axes.ravel(), kinds):
        for variant in perturb["variant"].values:
            sel = {"variant": variant, "kind": kind}
            ax.plot(x, mean.sel(sel).transpose("rate"), marker="o", color=colors[variant], label=variant)
            ax.fill_between(
                x, lo.sel(sel).transpose("rate"), hi.sel(sel).transpose("rate"), color=colors[variant], alpha=0.25, lw=0
            )
        ax.axhline(1.0, ls=":", lw=0.8, color="0.3")
    _finish_kind_grid(fig, axes, kinds, x, "perplexity / unperturbed")
    return fig


@_styled
def fig_perturb_fg(perturb: xr.Dataset, n_boot: int = 1000, seed: int = 0) -> Figure:
    """Change of f and of g (1 - correlation with the unperturbed term) against p, per perturbation kind.

    Mean over layers, then mean over samples with a 95 % bootstrap band. Colour: term; line style: variant.
    """
    require(perturb, ["f_corr", "g_corr", "variant", "kind", "rate", "sample", "layer"], "perturb.nc")
    term_colors = dict(zip(("f", "g"), sns.color_palette("colorblind")[1:3]))
    styles = dict(zip(perturb["variant"].values, ["-", "--", ":", "-."] * 8))
    fig, axes, kinds, x = _kind_grid(perturb)
    for term in ("f", "g"):
        change = 1 - perturb[f"{term}_corr"].mean("layer")
        mean, lo, hi = bootstrap_mean(change, "sample", n_boot=n_boot, seed=seed)
        for ax, kind in zip(axes.ravel(), kinds):
            for variant in perturb["variant"].values:
                sel = {"variant": variant, "kind": kind}
                ax.plot(
                    x,
                    mean.sel(sel).transpose("rate"),
                    marker="o",
                    color=term_colors[term],
                    ls=styles[variant],
                    label=f"{term}, {variant}",
                )
                ax.fill_between(
                    x,
                    lo.sel(sel).transpose("rate"),
                    hi.sel(sel).transpose("rate"),
                    color=term_colors[term],
                    alpha=0.2,
                    lw=0,
                )
    _finish_kind_grid(fig, axes, kinds, x, "1 - corr(perturbed, clean)")
    return fig


@_styled
def fig_cap(cap: xr.Dataset, n_boot: int = 1000, seed: int = 0) -> Figure:
    """Distance capping at C: perplexity ratio (left) and change of f and g (right) against C.

    ``cap`` is cap.nc with an extra ``variant`` dim.
    """
    require(cap, ["ppl_ratio", "f_corr", "g_corr", "variant", "cap", "sample", "layer"], "cap.nc")
    colors = variant_colors(cap["variant"].values)
    c = cap["cap"].values
    fig, axes = plt.subplots(1, 2, figsize=(COLUMN_WIDTH, 2.3))
    mean, lo, hi = bootstrap_mean(cap["ppl_ratio"], "sample", n_boot=n_boot, seed=seed)
    for variant in cap["variant"].values:
        axes[0].plot(c, mean.sel(variant=variant), marker="o", color=colors[variant], label=variant)
        axes[0].fill_between(
            c, lo.sel(variant=variant), hi.sel(variant=variant), color=colors[variant], alpha=0.25, lw=0
        )
    axes[0].axhline(1.0, ls=":", lw=0.8, color="0.3")
    axes[0].set_title("perplexity")
    axes[0].set_ylabel("perplexity / uncapped")
    styles = {"f": "-", "g": "--"}
    for term in ("f", "g"):
        m, lo_, hi_ = bootstrap_mean(1 - cap[f"{term}_corr"].mean("layer"), "sample", n_boot=n_boot, seed=seed)
        for variant in cap["variant"].values:
            axes[1].plot(c, m.sel(variant=variant), marker="o", ls=styles[term], color=colors[variant])
            axes[1].fill_between(
                c, lo_.sel(variant=variant), hi_.sel(variant=variant), color=colors[variant], alpha=0.2, lw=0
            )
    axes[1].set_title("$f$ (solid), $g$ (dashed)")
    axes[1].set_ylabel("1 - corr(capped, uncapped)")
    _figure_legend(fig, axes[0])
    for ax in axes:
        _log_axis(ax, "x", ticks=c)
        ax.set_xlabel("cap $C$ (tokens)")
    return fig


# --------------------------------------------------------------------------------- reproduction table

TABLE_KEYS = ["model", "variant", "method", "sink"]
TYPE_ORDER = {"rope": 0, "global": 1, "sliding": 2, "nope": 3}  # summary.csv's layer_type values


def _distance_cell(value) -> str:
    """A dummy-distance cell of summary.csv as text: '1000', '511/1000' (several), '' (Method B, or none)."""
    if isinstance(value, str):
        return value
    if value is None or not np.isfinite(value):
        return ""
    return str(int(value))


def reproduction_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The paper's 0.959 beside our mean-over-heads and pooled r (95 % intervals) per model/variant/method/sink.

    With summary.csv's ``layer_type`` column: a model with several layer types gets one row per layer type
    (global, sliding, nope) instead of the row over every RoPE layer, and ``dummy_distance`` says which D
    Method A used on those layers.
    """
    cols = TABLE_KEYS + ["mean_r", "mean_r_lo", "mean_r_hi", "pooled_r", "pooled_r_lo", "pooled_r_hi"]
    missing = [c for c in cols if c not in summary.columns]
    if missing:
        raise KeyError(f"summary.csv: missing column(s) {', '.join(missing)}")
    typed = "layer_type" in summary.columns
    extra = [c for c in ("n_samples", "layer_type", "dummy_distance") if c in summary.columns]
    table = summary[cols + extra].copy()
    table.insert(len(TABLE_KEYS), "paper_r", PAPER_R)
    table["mean_r_minus_paper"] = table["mean_r"] - PAPER_R
    table["pooled_r_minus_paper"] = table["pooled_r"] - PAPER_R
    sort = ["model", "_order", "method", "sink"]
    if typed:
        # several layer types: their own rows replace the one over every RoPE layer
        split = table.groupby(["model", "variant"])["layer_type"].transform(lambda t: (t != "rope").any())
        table = table[~(split & (table["layer_type"] == "rope"))].copy()
        table["_type"] = table["layer_type"].map(TYPE_ORDER)
        sort = ["model", "_order", "_type", "method", "sink"]
    if "dummy_distance" in table.columns:
        table["dummy_distance"] = [_distance_cell(v) for v in table["dummy_distance"]]
    # trained first, then seeds in numeric order; layer types as in TYPE_ORDER; methods and sinks alphabetically
    order = table["variant"].map(init_seed)  # trained is -1
    table = table.assign(_order=order).sort_values(sort, kind="stable")
    return table.drop(columns=[c for c in ("_order", "_type") if c in table.columns]).reset_index(drop=True)


def reproduction_markdown(table: pd.DataFrame, provenance: dict | None = None) -> str:
    """A Markdown rendering of :func:`reproduction_table` with 'value [lo, hi]' cells."""

    def cell(row, stat):
        return f"{row[stat]:.3f} [{row[stat + '_lo']:.3f}, {row[stat + '_hi']:.3f}]"

    typed = "layer_type" in table.columns
    lines = [
        "# Reproduction of the 0.959 correlation (Han & Ji 2025)",
        "",
        "Pearson r between the true attention logits W and the approximation; 95 % bootstrap intervals "
        "over samples in brackets. 'mean r' averages per-(sample, layer, head) r over heads; 'pooled r' "
        "correlates all scored entries of all heads at once. Method A: mean-key f + g at the default "
        "dummy distance; Method B: least-squares a(i-j) + b(i) + c(j). Sink 'without' drops key column 0.",
    ]
    if typed:
        lines[-1] += (
            " 'layers': the layers a row covers: 'rope' every RoPE layer (global and sliding-window), or one "
            "layer type of a model with several: 'global', 'sliding' (sliding-window), 'nope' (no rotation; "
            "never part of the 'rope' rows). 'D': the dummy distance Method A used on those layers, min(D, "
            "window - 1) on a sliding-window layer, which never sees a longer distance."
        )
    header = (
        "| model | variant | method | sink | paper r | mean r [95 % CI] | pooled r [95 % CI] | mean r - paper "
        "| pooled r - paper |"
    )
    rule = "|---|---|---|---|---:|---:|---:|---:|---:|"
    if typed:
        header += " layers | D |"
        rule += "---|---:|"
    lines += ["", header, rule]
    for _, row in table.iterrows():
        line = (
            f"| {row['model']} | {row['variant']} | {row['method']} | {row['sink']} | {row['paper_r']:.3f} | "
            f"{cell(row, 'mean_r')} | {cell(row, 'pooled_r')} | {row['mean_r_minus_paper']:+.3f} | "
            f"{row['pooled_r_minus_paper']:+.3f} |"
        )
        if typed:
            line += f" {row['layer_type']} | {row.get('dummy_distance', '')} |"
        lines.append(line)
    if provenance:
        lines += ["", "Provenance: " + ", ".join(f"{k}={v}" for k, v in sorted(provenance.items()))]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ loading and rendering


def _stable_provenance(**extra) -> dict:
    """Provenance attrs without the creation time, which would make every rendering differ."""
    from posgen.store import provenance

    attrs = provenance(**extra)
    attrs.pop("created", None)
    return attrs


def _open(path) -> xr.Dataset:
    from posgen.store import open_dataset

    return open_dataset(path, lazy=False)


def _by_variant(paths, variants, names) -> xr.Dataset:
    """Variables ``names`` of one file per variant, stacked along a new ``variant`` dim."""
    paths, variants = list(paths), list(variants)
    if len(paths) != len(variants):
        raise ValueError(f"{len(paths)} input files for {len(variants)} variants {variants}")
    parts = []
    for path in paths:
        ds = _open(path)
        require(ds, names, str(path))
        parts.append(ds[names])
    return xr.concat(parts, dim=pd.Index(variants, name="variant"), coords="minimal", compat="override")


def _load_examples(inputs, variants):
    return _open(inputs["examples"][0])


def _load_r_heatmap(inputs, variants):
    r = _by_variant(inputs["decomposition"], variants, ["r"])["r"]
    return r.sel(sink="without").mean("sample").transpose("variant", "method", "layer", "head")


def _load_layer_r(inputs, variants):
    return _open(inputs["summary"][0])


def _load_bands(inputs, variants):
    names = ["theta"] + [f"{s}_{n}" for s in "qk" for n in ("mean_sq", "var", "ratio")]
    return _by_variant(inputs["bands"], variants, names)


def _load_dummy_sweep(inputs, variants):
    return _by_variant(inputs["decomposition"], variants, ["r_sweep"])["r_sweep"]


def _load_perturb(inputs, variants):
    return _by_variant(inputs["perturb"], variants, ["ppl_ratio", "f_corr", "g_corr"])


def _load_cap(inputs, variants):
    return _by_variant(inputs["cap"], variants, ["ppl_ratio", "f_corr", "g_corr"])


@dataclasses.dataclass(frozen=True)
class Spec:
    """How one paper figure is made: its drawing function and the loader of its input files."""

    func: object
    loader: object


# Figure name -> Spec, one entry per row of posgen.figure_table (which also says whether the figure
# bootstraps); rules/figures.smk makes one rule per row (fig_<name>); the tests cover every entry.
FIGURES = {
    "logit_maps": Spec(fig_logit_maps, _load_examples),
    "scatter": Spec(fig_scatter, _load_examples),
    "r_heatmap": Spec(fig_r_heatmap, _load_r_heatmap),
    "layer_r": Spec(fig_layer_r, _load_layer_r),
    "bands": Spec(fig_bands, _load_bands),
    "dummy_sweep": Spec(fig_dummy_sweep, _load_dummy_sweep),
    "perturb_ppl": Spec(fig_perturb_ppl, _load_perturb),
    "perturb_fg": Spec(fig_perturb_fg, _load_perturb),
    "cap": Spec(fig_cap, _load_cap),
}


def registry() -> dict[str, Spec]:
    """Every figure of the table with its Spec: this family's (FIGURES), the second family's and the trajectories'.

    Raises if the specs and posgen.figure_table disagree, so a table row without a drawing function (or the
    reverse) fails the first figure job, and the tests.
    """
    from posgen.synthetic.figures import FIGURES as SYNTHETIC_FIGURES
    from posgen.synthetic.study_figures import FIGURES as STUDY_SPECS
    from posgen.trajectory.figures import FIGURES as TRAJECTORY_SPECS

    specs = {**FIGURES, **SYNTHETIC_FIGURES, **TRAJECTORY_SPECS, **STUDY_SPECS}
    table = {**FIGURE_TABLE, **TRAJECTORY_FIGURES, **STUDY_FIGURES}
    if set(specs) != set(table):
        differ = sorted(set(specs) ^ set(table))
        raise KeyError(f"figure specs and posgen.figure_table differ in {', '.join(differ)}")
    return specs


def render(
    name: str,
    inputs: dict,
    png: str | Path,
    pdf: str | Path,
    *,
    variants=(),
    n_boot: int | None = 1000,
    seed: int | None = 0,
    **attrs,
) -> None:
    """Load figure ``name``'s input files (``inputs``: role -> path or paths), draw it, save PNG + PDF.

    ``n_boot`` and ``seed`` (the `intervals` settings) are used only by figures whose table row bootstraps.
    """
    specs = registry()
    if name not in specs:
        raise KeyError(f"figure {name!r}: unknown (known: {', '.join(specs)})")
    spec = specs[name]
    inputs = {k: [v] if isinstance(v, (str, Path)) else list(v) for k, v in inputs.items()}
    data = spec.loader(inputs, list(variants or []))
    row = {**FIGURE_TABLE, **TRAJECTORY_FIGURES, **STUDY_FIGURES}[name]
    fig = spec.func(data, n_boot=n_boot, seed=seed) if row.bootstrap else spec.func(data)
    save_figure(fig, png, pdf, provenance=_stable_provenance(figure=name, **attrs))


def write_reproduction(
    summary_csv: str | Path,
    csv: str | Path,
    md: str | Path,
    synthetic_summary_csv: str | Path | None = None,
    synthetic_csv: str | Path | None = None,
    study_summary_csv: str | Path | None = None,
    **attrs,
) -> pd.DataFrame:
    """results/reproduction.csv and .md from results/summary.csv; with the second family's summary, its rows
    (the second paper's numbers beside ours) go to ``synthetic_csv`` and a second section of the Markdown, with
    a verdict per claim (posgen.synthetic.verdicts) from the deposit study's summary when given, else from the
    run's."""
    from posgen.synthetic.figures import reproduction_markdown as synthetic_markdown
    from posgen.synthetic.figures import reproduction_rows
    from posgen.synthetic.verdicts import verdict_markdown, verdicts

    paths = [Path(p) for p in (summary_csv, synthetic_summary_csv, study_summary_csv) if p is not None]
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file")
    table = reproduction_table(pd.read_csv(summary_csv))
    prov = _stable_provenance(**attrs)
    keep = {k: prov[k] for k in ("config_hash", "posgen_version") if k in prov}
    with atomic_path(csv) as tmp:
        table.assign(**keep).to_csv(tmp, index=False, float_format="%.6g")
    text = reproduction_markdown(table, provenance=keep)
    if synthetic_summary_csv is not None:
        summaries = [pd.read_csv(p) for p in (synthetic_summary_csv, study_summary_csv) if p is not None]
        rows = reproduction_rows(pd.concat(summaries, ignore_index=True))
        with atomic_path(synthetic_csv) as tmp:
            rows.assign(**keep).to_csv(tmp, index=False, float_format="%.6g")
        source = study_summary_csv or synthetic_summary_csv
        text += "\n" + synthetic_markdown(rows) + "\n" + verdict_markdown(verdicts(summaries[-1]), str(source))
    with atomic_path(md) as tmp:
        Path(tmp).write_text(text)
    return table
