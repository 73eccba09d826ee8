"""The block-swap figure (``block_swap.nc``, docs/method.md section 3D): per variant, each head's block-swap
positional score against its f share in the decomposition (the two readings of "positional or semantic"), and the
score of every RoPE band against its frequency."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from posgen.figures.style import PAGE_WIDTH, by_variant, log_axis, styled, variant_colors
from posgen.stats import spearman
from posgen.store import require

BLOCK_SWAP_VARIABLES = ["positional_score", "band_score", "f_share", "inv_freq"]


def load_block_swap(inputs, variants) -> xr.Dataset:
    """``inputs["block_swap"]``: one block_swap.nc per variant, stacked along ``variant``."""
    return by_variant(inputs["block_swap"], variants, BLOCK_SWAP_VARIABLES)


@styled
def fig_block_swap(swap: xr.Dataset) -> Figure:
    """Left: per head, the block-swap positional score (1 positional, 0 symbolic) against the decomposition's f
    share, one colour per variant, Spearman rho in the legend. Right: per band, the median score over (layer,
    head) against the band's frequency (median over the layers where it rotates), interquartile range shaded."""
    require(swap, BLOCK_SWAP_VARIABLES + ["variant", "layer", "head", "band"], "block-swap figure input")
    colors = variant_colors(swap["variant"].values)
    fig, (ax_heads, ax_bands) = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 2.8), layout="constrained")
    inv_freq = swap["inv_freq"].isel(variant=0, drop=True)  # (layer, band): the same in every variant
    theta = inv_freq.where(inv_freq > 0).median("layer").values  # NaN: a band that never rotates
    rotating = np.isfinite(theta)
    for variant in swap["variant"].values:
        score = swap["positional_score"].sel(variant=variant).values.ravel()
        share = swap["f_share"].sel(variant=variant).values.ravel()
        rho = spearman(score, share)
        ax_heads.scatter(
            share, score, s=6, alpha=0.7, linewidths=0, color=colors[variant], label=f"{variant}: {rho:+.2f}"
        )
        bands = swap["band_score"].sel(variant=variant).stack(unit=("layer", "head")).transpose("band", "unit").values
        with np.errstate(all="ignore"):
            lo, mid, hi = np.nanquantile(bands[rotating], [0.25, 0.5, 0.75], axis=1)
        ax_bands.plot(theta[rotating], mid, color=colors[variant], label=variant)
        ax_bands.fill_between(theta[rotating], lo, hi, color=colors[variant], alpha=0.2, linewidth=0)
    ax_heads.set_xlabel("f share $r_f^2 / (r_f^2 + r_g^2)$ (decomposition)")
    ax_heads.set_ylabel("block-swap positional score")
    ax_heads.set_title("per head (Spearman $\\rho$ in the legend)")
    ax_heads.legend(frameon=False, fontsize="small")
    ax_bands.set_xlabel("band frequency $\\theta$ (rad / token)")
    ax_bands.set_ylabel("block-swap positional score")
    ax_bands.set_title("per RoPE band")
    log_axis(ax_bands, "x")
    for ax in (ax_heads, ax_bands):
        ax.set_ylim(-0.03, 1.03)
    return fig
