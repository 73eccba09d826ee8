"""The figure of the band interventions (``band_interventions.nc``, docs/method.md section 6.4): per variant, the
next-token loss change against the share of the rotating bands stopped, from below and from above, with its 95 %
bootstrap interval over windows."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from posgen.figures.style import PAGE_WIDTH, by_variant, styled, variant_colors
from posgen.stats import bootstrap_indices, interval
from posgen.store import require

BAND_VARIABLES = ["loss_change"]


def load_band_interventions(inputs, variants) -> xr.Dataset:
    """``inputs["band_interventions"]``: one band_interventions.nc per variant, stacked along ``variant``."""
    return by_variant(inputs["band_interventions"], variants, BAND_VARIABLES)


@styled
def fig_band_loss(bands: xr.Dataset, n_boot: int = 1000, seed: int = 0) -> Figure:
    """Loss change (nats per token) against the stopped share p, from below (p-RoPE) and from above, one line per
    variant with its 95 % bootstrap interval over windows; p = 0 is the unmodified model.

    ``bands`` has dims (variant, setting, sample) as :func:`load_band_interventions` returns it.
    """
    require(bands, BAND_VARIABLES + ["variant", "setting", "kind", "share"], "band interventions figure input")
    variants = list(bands["variant"].values)
    colors = variant_colors(variants)
    fig, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 2.6), sharey=True, squeeze=False)
    idx = bootstrap_indices(bands.sizes["sample"], n_boot, seed)
    for ax, kind, title in zip(axes[0], ("below", "above"), ("lowest bands stopped", "highest bands stopped")):
        picked = [s for s, k in zip(bands["setting"].values, bands["kind"].values) if k in (kind, "none")]
        shares = 100 * bands["share"].sel(setting=picked).values
        for variant in variants:
            change = bands["loss_change"].sel(variant=variant, setting=picked).transpose("sample", "setting").values
            mean, lo, hi = interval(lambda v: v.mean(0), change, idx)
            ax.fill_between(shares, lo, hi, color=colors[variant], alpha=0.2, linewidth=0)
            ax.plot(shares, mean, marker="o", color=colors[variant], label=variant)
        ax.axhline(0, color="0.5", linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("share of the rotating bands stopped (%)")
        ax.set_xticks(np.unique(shares))
    axes[0][0].set_ylabel("loss change (nats per token)")
    axes[0][1].legend(fontsize=7)
    return fig
