"""The second paper's figures (arXiv 2505.13027, PE classifiers on the synthetic tasks): accuracy, single-head
ablation, deposit index, Toeplitz share and position probes, from the gathered NetCDFs of ``rules/synthetic.smk``
(``training.nc`` (task, pe, seed, step), ``ablation.nc`` and ``toeplitz.nc`` (task, pe, seed, layer, head),
``probe.nc``); and the deposit study's (``results/synthetic/deposit_study/``): the deposit criterion per layer
and the position probes."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import xarray as xr
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from posgen.claims import t_interval
from posgen.figures.style import PAGE_WIDTH, integer_ticks, open_result, styled
from posgen.stats import CRITERION_SECOND, CRITERION_TOP


@styled
def fig_accuracy(training: xr.Dataset) -> Figure:
    """Final test accuracy per PE (x) and task (colour), mean over seeds with 95 % t intervals over seeds."""
    acc = training["final_test_accuracy"]
    tasks, pes = list(acc["task"].values), list(acc["pe"].values)
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 2.4))
    width = 0.8 / len(tasks)
    for t, task in enumerate(tasks):
        stats = np.array([t_interval(acc.sel(task=task, pe=pe).values) for pe in pes]) * 100
        x = np.arange(len(pes)) + (t - (len(tasks) - 1) / 2) * width
        err = np.abs(stats[:, 1:] - stats[:, :1]).T
        ax.bar(x, stats[:, 0], width, label=task, yerr=np.nan_to_num(err), capsize=2)
    ax.set_xticks(np.arange(len(pes)), pes, rotation=30, ha="right")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(title="task")
    return fig


@styled
def fig_ablation(ablation: xr.Dataset) -> Figure:
    """Accuracy drop (points) when one head is ablated, layer x head; rows = task, columns = PE (mean over seeds)."""
    drop = ablation["drop"].mean("seed") * 100
    tasks, pes = list(drop["task"].values), list(drop["pe"].values)
    fig, axes = plt.subplots(
        len(tasks),
        len(pes),
        figsize=(PAGE_WIDTH, 1.2 * len(tasks) + 0.6),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    limit = max(float(np.nanmax(np.abs(drop.values))), 1.0)
    for row, task in enumerate(tasks):
        for col, pe in enumerate(pes):
            ax = axes[row, col]
            image = ax.imshow(drop.sel(task=task, pe=pe).values, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
            ax.set_title(pe if row == 0 else "", fontsize=6)
            ax.grid(False)
            integer_ticks(ax.xaxis)
            integer_ticks(ax.yaxis)
        axes[row, 0].set_ylabel(f"{task}\nlayer")
    for ax in axes[-1]:
        ax.set_xlabel("head")
    fig.colorbar(image, ax=axes, label="accuracy drop (points)", shrink=0.8)
    return fig


@styled
def fig_deposit(ablation: xr.Dataset) -> Figure:
    """Deposit index (max drop / sum of positive drops) per layer, one line per PE, one panel per task."""
    tasks = list(ablation["task"].values)
    fig, axes = plt.subplots(1, len(tasks), figsize=(PAGE_WIDTH, 2.2), sharey=True, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        index = ablation["deposit_index"].sel(task=task).mean("seed")
        for pe in index["pe"].values:
            ax.plot(index["layer"], index.sel(pe=pe), marker="o", label=str(pe))
        ax.set_title(task)
        ax.set_xlabel("layer")
        integer_ticks(ax.xaxis)
    axes[0, 0].set_ylabel("deposit index")
    axes[0, 0].set_ylim(0, 1.05)
    axes[0, -1].legend(fontsize=6, ncols=2)
    return fig


@styled
def fig_toeplitz(toeplitz: xr.Dataset) -> Figure:
    """Variance shares of the a(i-j) and a(i-j)+b(i)+c(j) fits per PE (mean over layers, heads, seeds)."""
    tasks = list(toeplitz["task"].values)
    fig, axes = plt.subplots(1, len(tasks), figsize=(PAGE_WIDTH, 2.4), sharey=True, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        sel = toeplitz.sel(task=task)
        pes = list(sel["pe"].values)
        x = np.arange(len(pes))
        for offset, (name, label) in zip(
            [-0.2, 0.2], [("toeplitz_share", "a(i-j)"), ("additive_share", "a(i-j)+b(i)+c(j)")]
        ):
            values = sel[name].mean(("seed", "layer", "head")).values
            ax.bar(x + offset, values, 0.4, label=label)
        ax.set_xticks(x, pes, rotation=40, ha="right")
        ax.set_title(task)
        ax.set_ylim(0, 1)
    axes[0, 0].set_ylabel("variance share of the logits")
    axes[0, -1].legend()
    return fig


# ------------------------------------------------------------------------------------------ deposit study


def _panels(n: int, height: float = 2.3):
    cols = min(n, 2)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(PAGE_WIDTH, height * rows), squeeze=False)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    return fig, axes.ravel()


@styled
def fig_deposit_study(deposit: pd.DataFrame) -> Figure:
    """Top against second single-head drop (points) of every (task, pe, seed, layer), one panel per experiment;
    the paper's criterion (top >= 30, second <= 5) shaded. Layer 0 filled, deeper layers open; circles distance,
    squares count."""
    experiments = list(dict.fromkeys(deposit["experiment"]))
    pes = sorted(set(deposit["pe"]))
    colors = dict(zip(pes, sns.color_palette("colorblind", len(pes))))
    fig, axes = _panels(len(experiments), 2.6)
    limit = max(100 * float(deposit["top_drop"].max()), CRITERION_TOP * 100 + 10) + 2  # + 2: no marker on the edge
    second_limit = max(100 * float(deposit["second_drop"].max()) + 2, 10.0)  # every point shown
    for ax, experiment in zip(axes, experiments):
        part = deposit[deposit["experiment"] == experiment]
        ax.axvspan(CRITERION_TOP * 100, limit, ymax=1, color="0.92", zorder=0)
        ax.fill_between([CRITERION_TOP * 100, limit], -100, CRITERION_SECOND * 100, color="#f4c7c3", zorder=0)
        for (task, pe, first), rows in part.groupby(["task", "pe", part["layer"] == 0]):
            ax.scatter(
                100 * rows["top_drop"],
                100 * rows["second_drop"],
                s=14 if first else 9,
                marker="o" if task == "distance" else "s",
                facecolors=colors[pe] if first else "none",
                edgecolors=colors[pe],
                linewidths=0.7,
            )
        ax.plot([0, limit], [0, limit], color="0.6", lw=0.6, ls=":")
        ax.set_xlim(min(-2.0, 100 * float(part["top_drop"].min()) - 1), limit)
        ax.set_ylim(min(-2.0, 100 * float(part["second_drop"].min()) - 1), second_limit)
        ax.set_title(experiment)
        ax.set_xlabel("top single-head drop (points)")
        ax.set_ylabel("second drop (points)")
    marker = dict(ls="none", markersize=4)
    handles = [Line2D([], [], marker="o", color=colors[pe], label=pe, **marker) for pe in pes] + [
        Line2D([], [], marker="o", color="0.3", label="distance, layer 0", **marker),
        Line2D([], [], marker="s", color="0.3", label="count, layer 0", **marker),
        Line2D([], [], marker="o", color="0.3", mfc="none", label="deeper layers", **marker),
    ]
    fig.legend(handles=handles, loc="upper center", ncols=6, fontsize=6, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


@styled
def fig_position_probe(probe: pd.DataFrame) -> Figure:
    """Held-out R^2 of absolute position from the residual stream (0 = input, l = after layer l), mean over
    seeds, one line per PE, one panel per (experiment, task)."""
    panels = list(dict.fromkeys(zip(probe["experiment"], probe["task"])))
    pes = sorted(set(probe["pe"]))
    colors = dict(zip(pes, sns.color_palette("colorblind", len(pes))))
    fig, axes = _panels(len(panels))
    for ax, (experiment, task) in zip(axes, panels):
        part = probe[(probe["experiment"] == experiment) & (probe["task"] == task)]
        for pe, rows in part.groupby("pe"):
            mean = rows.groupby("stream")["position_r2"].mean()
            ax.plot(mean.index, mean.values, marker="o", ms=2.5, color=colors[pe], label=pe)
        ax.set_title(f"{experiment}: {task}")
        ax.set_xlabel("residual stream (0 = input)")
        ax.set_ylabel("position $R^2$ (held out)")
        ax.set_ylim(-0.05, 1.05)
    axes[0].legend(fontsize=5, ncols=2)
    return fig


# ------------------------------------------------------------------------------------------------ loaders


def by_pe(ds: xr.Dataset) -> xr.Dataset:
    """The ``experiment`` dim folded into ``pe`` for the per-PE figures: dropped when there is one experiment,
    else every PE label prefixed with its experiment (``faithful/rope``)."""
    if "experiment" not in ds.dims:
        return ds
    if ds.sizes["experiment"] == 1:
        return ds.isel(experiment=0, drop=True)
    parts = [
        ds.sel(experiment=e, drop=True).assign_coords(pe=[f"{e}/{pe}" for pe in ds["pe"].values])
        for e in ds["experiment"].values
    ]
    return xr.concat(parts, "pe")


def load_training(inputs, variants):
    """The gathered training.nc, PE by PE."""
    return by_pe(open_result(inputs["training"][0]))


def load_ablation(inputs, variants):
    """The gathered ablation.nc, PE by PE."""
    return by_pe(open_result(inputs["ablation"][0]))


def load_toeplitz(inputs, variants):
    """The gathered toeplitz.nc, PE by PE."""
    return by_pe(open_result(inputs["toeplitz"][0]))


def load_probe(inputs, variants) -> pd.DataFrame:
    probe = open_result(inputs["probe"][0])["position_r2"]
    return probe.to_dataframe().reset_index().dropna(subset=["position_r2"])


def load_deposit(inputs, variants) -> pd.DataFrame:
    return pd.read_csv(inputs["deposit"][0])


# ------------------------------------------------------------------------------------------- regime study


def _regime_panel(ax_acc, ax_drop, rows: pd.DataFrame, x: str, style: str, colors: dict) -> None:
    """Accuracy (top) and layer-0 top / second drop (bottom) of ``rows`` against ``x``: one line per (pe,
    ``style``) through the seed means, every seed a marker (open where it did not converge)."""
    styles = dict(zip(sorted(set(rows[style])), ["-", "--", ":", "-."]))
    for (pe, kind), part in rows.groupby(["pe", style]):
        color, line = colors[pe], styles[kind]
        mean = part.groupby(x)[["test_accuracy", "layer0_top_drop", "layer0_second_drop"]].mean() * 100
        ax_acc.plot(mean.index, mean["test_accuracy"], line, color=color, label=f"{pe}, {style} {kind}")
        ax_drop.plot(mean.index, mean["layer0_top_drop"], line, color=color)
        ax_drop.plot(mean.index, mean["layer0_second_drop"], line, color=color, alpha=0.4)
        for converged, fill in ((True, color), (False, "none")):
            seeds = part[part["converged"] == converged]
            ax_acc.scatter(seeds[x], 100 * seeds["test_accuracy"], s=10, facecolors=fill, edgecolors=color)
            ax_drop.scatter(seeds[x], 100 * seeds["layer0_top_drop"], s=10, facecolors=fill, edgecolors=color)
    ax_acc.set_ylim(0, 102)
    ax_drop.axhline(CRITERION_TOP * 100, color="0.6", lw=0.6)
    ax_drop.axhline(CRITERION_SECOND * 100, color="0.6", lw=0.6, ls=":")


@styled
def fig_regime_study(classifiers: pd.DataFrame) -> Figure:
    """The regime study's brackets (docs/method.md section 8.10). Left: test accuracy and layer-0 top / second
    single-head drop (points; second paler) against optimiser steps, for the experiments at the shortest
    distance in clean mode, one line style per learning rate. Right: the same against the longest distance, for
    the experiments at the budget of the longer-distance runs, one line style per mode. Markers: seeds (open:
    not converged); grey lines: the deposit criterion (top >= 30, second <= 5 points)."""
    rows = classifiers[classifiers["task"] == "distance"].assign(
        mode=np.where(classifiers["faithful"], "faithful", "clean")
    )
    shortest = rows["longest_distance"].min()
    budget = rows[(rows["longest_distance"] == shortest) & ~rows["faithful"]]
    longer = rows[rows["longest_distance"] > shortest]
    steps = longer["train_steps"].mode().iloc[0] if len(longer) else budget["train_steps"].min()
    size = rows[(rows["train_steps"] == steps) & np.isclose(rows["lr"], longer["lr"].max() if len(longer) else 0)]
    colors = dict(zip(sorted(set(rows["pe"])), sns.color_palette("colorblind", rows["pe"].nunique())))
    fig, axes = plt.subplots(2, 2, figsize=(PAGE_WIDTH, 4.6), sharey="row", squeeze=False)
    _regime_panel(axes[0, 0], axes[1, 0], budget, "train_steps", "lr", colors)
    _regime_panel(axes[0, 1], axes[1, 1], size, "longest_distance", "mode", colors)
    axes[1, 0].set_xscale("log")
    axes[1, 0].set_xlabel("optimiser steps")
    axes[1, 1].set_xlabel("longest trigger distance")
    axes[0, 0].set_ylabel("test accuracy (%)")
    axes[1, 0].set_ylabel("layer-0 drop (points)")
    for ax in axes[0]:
        ax.legend(fontsize=5)
    return fig


def load_classifiers(inputs, variants) -> pd.DataFrame:
    return pd.read_csv(inputs["classifiers"][0])
