"""The first paper's figures (Han & Ji 2025, on pretrained LLMs): logit maps and scatter of the example heads,
r over layer x head, per-layer r, feature bands, the dummy-distance sweep, perturbation and distance capping.

Every ``fig_*`` function takes xarray inputs laid out as in docs/data-model.md; every ``load_*`` function reads
a figure's input files (role -> paths, one per variant where the figure stacks variants).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import seaborn as sns
import xarray as xr
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

from posgen.figures.style import (
    COLUMN_WIDTH,
    PAGE_WIDTH,
    by_variant,
    figure_legend,
    integer_ticks,
    log_axis,
    open_result,
    styled,
    symmetric_limit,
    variant_colors,
)
from posgen.llm.verdicts import PAPER_R
from posgen.stats import bootstrap_mean, pearson
from posgen.store import require

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


# ---------------------------------------------------------------------------------------- figure 1, 2


@styled
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
        lim = symmetric_limit(panels["true logit $W$"])
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


@styled
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


@styled
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
            integer_ticks(ax.xaxis)
            integer_ticks(ax.yaxis)
            ax.label_outer()
    fig.colorbar(im, ax=axes.ravel().tolist(), label="Pearson $r$", shrink=0.9, pad=0.01)
    if axes[0, 0].get_legend_handles_labels()[0]:
        figure_legend(fig, axes[0, 0])
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


@styled
def fig_layer_r(summary: xr.Dataset) -> Figure:
    """Figure 4: per-layer mean r with 95 % bootstrap intervals; columns = method, rows = sink handling.

    With a ``layer_type`` coordinate, sliding-window and NoPE layers are shaded.
    """
    require(summary, ["layer_r", "layer_r_lo", "layer_r_hi", "variant", "method", "sink", "layer"], "summary.nc")
    colors = variant_colors(summary["variant"].values)
    sinks, methods = summary["sink"].values, summary["method"].values
    fig, axes = _sink_grid(len(sinks), len(methods))
    layer = summary["layer"].values
    for i, sink in enumerate(sinks):
        for j, method in enumerate(methods):
            ax = axes[i, j]
            for variant in summary["variant"].values:
                sel = summary.sel({"variant": variant, "method": method, "sink": sink})
                ax.plot(layer, sel["layer_r"], marker="o", color=colors[variant], label=variant)
                ax.fill_between(layer, sel["layer_r_lo"], sel["layer_r_hi"], color=colors[variant], alpha=0.25, lw=0)
            ax.axhline(PAPER_R, ls="--", lw=0.8, color="0.3", label=f"paper ({PAPER_R})")
            _layer_axis(ax, summary, f"method {method}, sink {sink}", "mean Pearson $r$")
    figure_legend(fig, axes[0, 0])
    return fig


@styled
def fig_position_share(summary: xr.Dataset) -> Figure:
    """Figure 4b: per-layer share of the pre-RoPE query's and key's variance over the window that a function of
    absolute position explains (docs/method.md section 3C); columns = query, key; rows = sink handling; solid:
    the smooth basis, dashed: linear. Mean over samples and heads."""
    require(summary, ["layer_position_share", "variant", "vector", "basis", "sink", "layer"], "summary.nc")
    colors = variant_colors(summary["variant"].values)
    sinks, vectors = summary["sink"].values, summary["vector"].values
    fig, axes = _sink_grid(len(sinks), len(vectors))
    layer = summary["layer"].values
    names = {"q": "query", "k": "key"}
    for i, sink in enumerate(sinks):
        for j, vector in enumerate(vectors):
            ax = axes[i, j]
            for variant in summary["variant"].values:
                for basis, ls in (("smooth", "-"), ("linear", "--")):
                    sel = summary["layer_position_share"].sel(variant=variant, vector=vector, basis=basis, sink=sink)
                    label = f"{variant} ({basis})"
                    ax.plot(layer, sel, ls=ls, marker="o" if ls == "-" else None, color=colors[variant], label=label)
            ax.set_ylim(0, 1)
            _layer_axis(ax, summary, f"{names.get(str(vector), vector)}, sink {sink}", "position share")
    figure_legend(fig, axes[0, 0])
    return fig


def _sink_grid(n_sinks: int, n_columns: int):
    """The per-layer figures' panels: one row per sink handling, shared axes, one column wide."""
    return plt.subplots(
        n_sinks,
        n_columns,
        figsize=(COLUMN_WIDTH, 1.5 * n_sinks + 0.5),
        squeeze=False,
        sharex=True,
        sharey=True,
    )


def _layer_axis(ax, summary: xr.Dataset, title: str, ylabel: str) -> None:
    """A per-layer panel's finish: its layer types shaded, title, labels, integer layer ticks."""
    layer = summary["layer"].values
    _shade_layers(ax, layer, _layer_types(summary))
    ax.set_title(title)
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    integer_ticks(ax.xaxis)
    ax.label_outer()


def _shade_layers(ax, layer: np.ndarray, types) -> None:
    """Shade the sliding-window and NoPE layers of a per-layer plot (one legend entry per type)."""
    if types is None:
        return
    for kind, (label, _, color) in LAYER_MARKS.items():
        for n, li in enumerate(np.flatnonzero(types == kind)):
            ax.axvspan(layer[li] - 0.5, layer[li] + 0.5, color=color, alpha=0.15, lw=0, label=label if n == 0 else None)


@styled
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
            log_axis(ax, "x")
            log_axis(ax, "y")
            ax.set_title(f"{side}: {label}")
            ax.set_ylabel(label)
            if i == 1:
                ax.set_xlabel("RoPE frequency $\\theta_l$")
    figure_legend(fig, axes[0, 0])
    return fig


@styled
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
    figure_legend(fig, axes[0, 0])
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
    figure_legend(fig, axes[0, 0])


@styled
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


@styled
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


@styled
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
    figure_legend(fig, axes[0])
    for ax in axes:
        log_axis(ax, "x", ticks=c)
        ax.set_xlabel("cap $C$ (tokens)")
    return fig


# ------------------------------------------------------------------------------------------------ loaders


def load_examples(inputs, variants):
    return open_result(inputs["examples"][0])


def load_r_heatmap(inputs, variants):
    r = by_variant(inputs["decomposition"], variants, ["r"])["r"]
    return r.sel(sink="without").mean("sample").transpose("variant", "method", "layer", "head")


def load_layer_r(inputs, variants):
    return open_result(inputs["summary"][0])


def load_bands(inputs, variants):
    names = ["theta"] + [f"{s}_{n}" for s in "qk" for n in ("mean_sq", "var", "ratio")]
    return by_variant(inputs["bands"], variants, names)


def load_dummy_sweep(inputs, variants):
    return by_variant(inputs["decomposition"], variants, ["r_sweep"])["r_sweep"]


def load_perturb(inputs, variants):
    return by_variant(inputs["perturb"], variants, ["ppl_ratio", "f_corr", "g_corr"])


def load_cap(inputs, variants):
    return by_variant(inputs["cap"], variants, ["ppl_ratio", "f_corr", "g_corr"])
