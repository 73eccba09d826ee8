"""The figure of the pretrained LLMs' per-head ablation (``head_ablation.nc``, docs/method.md section 8): per
variant, the loss increase of a probe and Method A r over layer x head, and the increase against each head's f
share."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from posgen.figures.style import PAGE_WIDTH, by_variant, integer_ticks, styled, symmetric_limit, variant_colors
from posgen.stats import spearman
from posgen.store import require

HEAD_ABLATION_VARIABLES = ["loss_increase", "method_a_r", "f_share", "deposit_index"]


def load_head_ablation(inputs, variants) -> xr.Dataset:
    """``inputs["head_ablation"]``: one head_ablation.nc per variant, stacked along ``variant``."""
    return by_variant(inputs["head_ablation"], variants, HEAD_ABLATION_VARIABLES)


@styled
def fig_head_ablation(ablation: xr.Dataset, probe: str = "repeat") -> Figure:
    """Per variant (rows): loss increase of ``probe`` (layer x head), Method A r (layer x head), and the
    increase against the head's f share, with the Spearman correlation in the title. A run without ``probe``
    (config ``head_ablation.probes``) shows the probe it has.

    ``ablation`` has dims (variant, probe, layer, head) as :func:`load_head_ablation` returns it.
    """
    require(ablation, HEAD_ABLATION_VARIABLES + ["variant", "probe", "layer", "head"], "head ablation figure input")
    probes = ablation["probe"].values.tolist()
    probe = probe if probe in probes else probes[0]
    increase = ablation["loss_increase"].sel(probe=probe).transpose("variant", "layer", "head")
    r = ablation["method_a_r"].transpose("variant", "layer", "head")
    variants = list(ablation["variant"].values)
    colors = variant_colors(variants)
    limit = max(symmetric_limit(increase.values), 1e-6)
    finite_r = r.values[np.isfinite(r.values)]
    r_range = (float(finite_r.min()), float(finite_r.max())) if finite_r.size else (0.0, 1.0)
    fig, axes = plt.subplots(len(variants), 3, figsize=(PAGE_WIDTH, 2.0 * len(variants)), squeeze=False)
    for row, variant in enumerate(variants):
        ax_drop, ax_r, ax_scatter = axes[row]
        im_drop = ax_drop.imshow(
            increase.sel(variant=variant).values,
            aspect="auto",
            origin="lower",
            cmap="RdBu_r",
            vmin=-limit,
            vmax=limit,
            interpolation="nearest",
        )
        im_r = ax_r.imshow(
            r.sel(variant=variant).values,
            aspect="auto",
            origin="lower",
            cmap="viridis",
            vmin=r_range[0],
            vmax=max(r_range[1], r_range[0] + 1e-6),
            interpolation="nearest",
        )
        for ax, title in ((ax_drop, f"loss increase ({probe})"), (ax_r, "Method A $r$")):
            ax.grid(False)
            ax.set_title(f"{variant}: {title}")
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            integer_ticks(ax.xaxis)
            integer_ticks(ax.yaxis)
        fig.colorbar(im_drop, ax=ax_drop, label="nats", pad=0.01)
        fig.colorbar(im_r, ax=ax_r, label="$r$", pad=0.01)
        share = ablation["f_share"].sel(variant=variant).values.ravel()
        drop = increase.sel(variant=variant).values.ravel()
        ax_scatter.scatter(share, drop, s=6, color=colors[variant], alpha=0.7, linewidths=0)
        ax_scatter.set_xlabel("f share $r_f^2 / (r_f^2 + r_g^2)$")
        ax_scatter.set_ylabel("loss increase (nats)")
        ax_scatter.set_title(f"Spearman {spearman(drop, share):+.2f}")
    return fig
