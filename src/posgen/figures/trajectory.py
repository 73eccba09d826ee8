"""Figures of a training trajectory: the statistics of trajectory.nc against training step (log axis); the r
heatmap (layer x head) at a few steps is the first paper's :func:`posgen.figures.llm.fig_r_heatmap`."""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import seaborn as sns
import xarray as xr
from matplotlib.figure import Figure

from posgen.figures.style import PAGE_WIDTH, open_result, styled
from posgen.llm.verdicts import PAPER_R
from posgen.store import require


def _step_axis(ax, steps) -> None:
    # symlog: step 0 (the initialisation) sits on the axis while 1 ... N stay log-spaced
    ax.set_xscale("symlog", linthresh=1.0, linscale=0.4)
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(steps))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%d"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlim(-0.3, max(steps) * 1.4)  # no empty negative half of the symlog axis
    ax.tick_params(axis="x", labelrotation=45)
    ax.set_xlabel("training step")


def _control(ds: xr.Dataset):
    """The random-init control's variant (step < 0), or None."""
    controls = [v for v, s in zip(ds["variant"].values, ds["step"].values) if s < 0]
    return controls[0] if controls else None


def _panel_r(ax, ds: xr.Dataset, curve: xr.Dataset, sink: str, control, palette) -> None:
    """r of every method against step (mean over heads: solid, pooled: dashed, 95 % bands), the control dotted."""
    steps = curve["step"].values
    for i, method in enumerate(ds["method"].values):
        for stat, ls in (("mean_r", "-"), ("pooled_r", "--")):
            sel = curve.sel({"method": method, "sink": sink})
            label = f"{method}, {'mean over heads' if stat == 'mean_r' else 'pooled'}"
            ax.plot(steps, sel[stat], ls=ls, marker="o", ms=3, color=palette[i], label=label)
            ax.fill_between(steps, sel[f"{stat}_lo"], sel[f"{stat}_hi"], color=palette[i], alpha=0.2, lw=0)
            if control is not None:
                ax.axhline(
                    float(ds[stat].sel({"variant": control, "method": method, "sink": sink})), ls=":", color=palette[i]
                )
    ax.axhline(PAPER_R, ls="--", lw=0.8, color="0.3", label=f"paper ({PAPER_R})")
    ax.set_ylabel("Pearson $r$")
    ax.set_title(f"$r$ (sink {sink}; dotted: random init)")
    ax.legend(fontsize=4, loc="best")


def _panel_fg(ax, curve: xr.Dataset, sink: str, palette) -> None:
    """Method A's variance explained by f alone and by g alone against step."""
    steps = curve["step"].values
    for i, (name, label) in enumerate((("r2_f", "$f$ alone"), ("r2_g", "$g$ alone"))):
        ax.plot(steps, curve[name].sel(sink=sink), marker="o", ms=3, color=palette[i + 2], label=label)
    ax.set_ylabel("variance explained")
    ax.set_title("Method A: $f$ / $g$ split")
    ax.legend(fontsize=6)


def _panel_low_share(ax, curve: xr.Dataset, palette) -> None:
    """The feature pattern: the token variance of q and k in the low-frequency half of the bands, against step."""
    steps = curve["step"].values
    for i, side in enumerate("qk"):
        ax.plot(steps, curve[f"low_share_{side}"], marker="o", ms=3, color=palette[i + 4], label=side)
    ax.axhline(0.5, ls=":", lw=0.8, color="0.3", label="even spread")
    ax.set_ylabel("token variance in low-freq. half")
    ax.set_title("feature pattern")
    ax.legend(fontsize=6)


def _panel_sensitivity(ax, ds: xr.Dataset, curve: xr.Dataset, palette) -> None:
    """The perplexity ratio of every perturbation kind (colour) at every rate (line style), with 95 % bands."""
    steps = curve["step"].values
    styles = ["-", "--", ":", "-."]
    for k, kind in enumerate(ds["kind"].values):
        for j, rate in enumerate(ds["rate"].values):
            sel = curve.sel(kind=kind, rate=rate)
            label = f"{kind} {rate * 100:g} %"
            ax.plot(steps, sel["ppl_ratio"], ls=styles[j % 4], marker="o", ms=2, color=palette[k % 10], label=label)
            ax.fill_between(steps, sel["ppl_ratio_lo"], sel["ppl_ratio_hi"], color=palette[k % 10], alpha=0.15, lw=0)
    ax.axhline(1.0, ls=":", lw=0.8, color="0.3")
    ax.set_ylabel("perplexity / unperturbed")
    ax.set_title("perturbation sensitivity")
    ax.legend(fontsize=4, ncols=2)


def _panel_perplexity(ax, curve: xr.Dataset, palette) -> None:
    """The held-out perplexity against step (log axis), or a note where the series has none (a hub series)."""
    if np.isfinite(curve["heldout_ppl"].values).any():
        ax.plot(curve["step"].values, curve["heldout_ppl"], marker="o", ms=3, color=palette[7])
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    else:
        ax.text(0.5, 0.5, "no held-out perplexity\n(hub series)", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("held-out perplexity")
    ax.set_title("held-out perplexity")


def _panel_position(ax, ds: xr.Dataset, curve: xr.Dataset, sink: str, control, palette) -> None:
    """The position share of q and k on each basis against step (docs/method.md section 3C), the control dotted."""
    steps = curve["step"].values
    for i, side in enumerate("qk"):
        for basis, ls in (("smooth", "-"), ("linear", "--")):
            name = f"{side}_position_share_{basis}"
            shares = curve[name].sel(sink=sink)
            ax.plot(steps, shares, ls=ls, marker="o", ms=3, color=palette[i + 4], label=f"{side}, {basis}")
            if control is not None:
                ax.axhline(
                    float(ds[name].sel({"variant": control, "sink": sink})), ls=":", lw=0.8, color=palette[i + 4]
                )
    ax.set_ylim(0, 1)
    ax.set_ylabel("variance explained by position")
    ax.set_title("absolute position in q and k")
    ax.legend(fontsize=6)


@styled
def fig_trajectory(ds: xr.Dataset) -> Figure:
    """Six panels against training step: r of every method (mean over heads: solid, pooled: dashed, 95 % bands),
    variance explained by f and g, low-frequency variance share, perturbation sensitivity, held-out perplexity,
    and the position share of q and k (docs/method.md section 3C: when does the drift leave the keys?).

    The random-init control (step < 0 in ``ds``) is drawn as a horizontal dotted line; it equals step 0 for a
    model trained by the workflow. Sink handling: without the first key column.
    """
    require(
        ds,
        ["mean_r", "pooled_r", "r2_f", "low_share_k", "ppl_ratio", "heldout_ppl", "step", "k_position_share_smooth"],
        "trajectory.nc",
    )
    sink = "without" if "without" in ds["sink"].values else ds["sink"].values[0]
    control = _control(ds)
    curve = ds.isel(variant=np.flatnonzero(ds["step"].values >= 0))
    palette = sns.color_palette("colorblind")
    fig, axes = plt.subplots(2, 3, figsize=(PAGE_WIDTH, 4.4))
    _panel_r(axes[0, 0], ds, curve, sink, control, palette)
    _panel_fg(axes[0, 1], curve, sink, palette)
    _panel_low_share(axes[0, 2], curve, palette)
    _panel_sensitivity(axes[1, 0], ds, curve, palette)
    _panel_perplexity(axes[1, 1], curve, palette)
    _panel_position(axes[1, 2], ds, curve, sink, control, palette)
    for ax in axes.ravel():
        _step_axis(ax, curve["step"].values)
    return fig


def load_trajectory(inputs, variants) -> xr.Dataset:
    return open_result(inputs["trajectory"][0])
