"""The bottom of the figures: the one house style, saving with reproducible bytes, colours, axis helpers and
the loaders the figure families share.

Every drawing function is wrapped in :func:`styled` and returns a matplotlib Figure; :func:`save_figure`
writes it as PNG and PDF with fixed metadata, so the same inputs give the same bytes.
"""

from __future__ import annotations

import contextlib
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
from matplotlib.figure import Figure  # noqa: E402

from posgen.config import VARIANT_TRAINED  # noqa: E402
from posgen.paths import identity  # noqa: E402
from posgen.store import atomic_path, open_dataset, require  # noqa: E402

COLUMN_WIDTH = 3.4  # inches: one column of a two-column paper
PAGE_WIDTH = 7.0  # inches: both columns
DPI = 200

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


def styled(func):
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


# ------------------------------------------------------------------------------------------ axis helpers


def figure_legend(fig: Figure, ax) -> None:
    """One legend for the whole figure, below the panels, from the entries of ``ax``."""
    handles, labels = ax.get_legend_handles_labels()
    per_row = max(1, int(fig.get_figwidth() / 1.6))  # entries that fit side by side
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), per_row))


def integer_ticks(axis) -> None:
    axis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def log_axis(ax, which: str, ticks=None) -> None:
    """Log scale; with ``ticks``, exactly those ticks, written as plain numbers."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    # label minor ticks (2, 3, ...) only when the axis spans less than about a decade
    axis.set_minor_formatter(matplotlib.ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.5)))
    if ticks is not None:
        axis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_locator(matplotlib.ticker.NullLocator())


def symmetric_limit(values: np.ndarray) -> float:
    """The 99th percentile of ``|values|`` (finite ones): the half-range of a symmetric colour scale."""
    finite = np.abs(values[np.isfinite(values)])
    return float(np.quantile(finite, 0.99)) if finite.size else 1.0


# ------------------------------------------------------------------------------------------------ loaders


def open_result(path) -> xr.Dataset:
    """One result file, read into memory; a dataset already in memory (posgen.api.draw) as it is."""
    if isinstance(path, xr.Dataset):
        return path
    return open_dataset(path, lazy=False)


def by_variant(paths, variants, names) -> xr.Dataset:
    """Variables ``names`` of one file per variant, stacked along a new ``variant`` dim."""
    paths, variants = list(paths), list(variants)
    if len(paths) != len(variants):
        raise ValueError(f"{len(paths)} input files for {len(variants)} variants {variants}")
    parts = []
    for path, variant in zip(paths, variants):
        found = {} if isinstance(path, xr.Dataset) else identity(path) or {}
        if found.get("variant", variant) != variant:  # the figure rules' inputs come in the variants' order
            raise ValueError(f"{path}: a file of variant {found['variant']} given as variant {variant}")
        ds = open_result(path)
        require(ds, names, "dataset" if isinstance(path, xr.Dataset) else str(path))
        parts.append(ds[names])
    return xr.concat(parts, dim=pd.Index(variants, name="variant"), coords="minimal", compat="override")
