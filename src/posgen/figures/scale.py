"""The scale study's figure (``results/scale.csv``, posgen.llm.scale): the first paper's numbers per model against
its published parameter count."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from posgen.figures.style import PAGE_WIDTH, styled

PAPER_R = 0.959
METHOD_COLORS = {"a": "C0", "b": "C1"}


def load_scale(inputs, variants) -> pd.DataFrame:
    return pd.read_csv(inputs["scale"][0])


def _errorbar(ax, x, table: pd.DataFrame, stem: str, **kw) -> None:
    y = table[stem].to_numpy(dtype=float)
    lo, hi = (table[f"{stem}_{end}"].to_numpy(dtype=float) for end in ("lo", "hi"))
    err = np.vstack([np.where(np.isfinite(lo), y - lo, 0), np.where(np.isfinite(hi), hi - y, 0)])
    ax.errorbar(x, y, yerr=err, capsize=2, lw=1, ms=4, **kw)


@styled
def fig_scale(table: pd.DataFrame) -> Figure:
    """Left: trained Method A / B mean (filled) and pooled (open) r against parameters, random-init mean r (grey),
    0.959 dashed. Middle: the random-init gap under A and B. Right: low-frequency share of keys and queries,
    trained (filled) and random-init (open)."""
    x = table["parameters"].to_numpy(dtype=float)
    fig, (ax_r, ax_gap, ax_low) = plt.subplots(1, 3, figsize=(PAGE_WIDTH, 2.6), layout="constrained")
    for m, color in METHOD_COLORS.items():
        _errorbar(ax_r, x, table, f"{m}_mean_r", fmt="o-", color=color, label=f"{m.upper()} mean")
        _errorbar(ax_r, x, table, f"{m}_pooled_r", fmt="o--", color=color, mfc="white", label=f"{m.upper()} pooled")
        random_r = table[f"{m}_mean_r"] - table[f"{m}_gap"]
        ax_r.plot(x, random_r, "x:", color="0.5" if m == "a" else "0.75", label=f"{m.upper()} random-init")
        _errorbar(ax_gap, x, table, f"{m}_gap", fmt="o-", color=color, label=f"Method {m.upper()}")
    ax_r.axhline(PAPER_R, color="k", ls="--", lw=0.8)
    ax_gap.axhline(0, color="k", lw=0.6)
    for side, color in (("k", "C2"), ("q", "C3")):
        ax_low.plot(x, table[f"low_{side}"], "o-", color=color, label=f"{side} trained")
        ax_low.plot(x, table[f"low_{side}_random"], "o--", color=color, mfc="white", label=f"{side} random-init")
    ax_low.axhline(0.5, color="k", ls=":", lw=0.6)
    # each model's own tick, named: four points on a log axis would otherwise need a legend of their own
    labels = [f"{name}\n{n / 1e6:,.0f} M" for name, n in zip(table["model"], x)]
    for ax, ylabel in ((ax_r, "r (trained)"), (ax_gap, "trained - random-init r"), (ax_low, "low-frequency share")):
        ax.set_xscale("log")
        ax.set_xticks(x, labels, fontsize=4, rotation=30, ha="right")
        ax.minorticks_off()
        ax.set_xlim(x.min() / 1.6, x.max() * 1.6)
        ax.set_xlabel("parameters (log)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=5)
    return fig
