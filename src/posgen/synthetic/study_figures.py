"""Figures of the deposit study (``results/synthetic/deposit_study/``): the deposit criterion per layer, the
position probes, and the training dynamics of the layer-0 top head."""

from __future__ import annotations

import functools

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from posgen.figures import PAGE_WIDTH, Spec, style
from posgen.stats import CRITERION_SECOND, CRITERION_TOP


def _styled(func):
    """Draw ``func``'s figure in the house style (posgen.figures.style)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with style():
            return func(*args, **kwargs)

    return wrapper


def _panels(n: int, height: float = 2.3):
    cols = min(n, 2)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(PAGE_WIDTH, height * rows), squeeze=False)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    return fig, axes.ravel()


@_styled
def fig_deposit_study(deposit: pd.DataFrame) -> Figure:
    """Top against second single-head drop (points) of every (task, pe, seed, layer), one panel per experiment;
    the paper's criterion (top >= 30, second <= 5) shaded. Layer 0 filled, deeper layers open; circles distance,
    squares count."""
    experiments = list(dict.fromkeys(deposit["experiment"]))
    pes = sorted(set(deposit["pe"]))
    colors = dict(zip(pes, sns.color_palette("colorblind", len(pes))))
    fig, axes = _panels(len(experiments), 2.6)
    limit = max(100 * float(deposit["top_drop"].max()), CRITERION_TOP * 100 + 10)
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
        ax.set_ylim(min(-2.0, 100 * float(part["second_drop"].min()) - 1), max(limit / 2, 10))
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


@_styled
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


def _load_deposit(inputs, variants) -> pd.DataFrame:
    return pd.read_csv(inputs["deposit"][0])


def _load_probe(inputs, variants) -> pd.DataFrame:
    from posgen.store import open_dataset

    probe = open_dataset(inputs["probe"][0], lazy=False)["position_r2"]
    return probe.to_dataframe().reset_index().dropna(subset=["position_r2"])


FIGURES = {
    "deposit_study": Spec(fig_deposit_study, _load_deposit),
    "deposit_study_probe": Spec(fig_position_probe, _load_probe),
}
