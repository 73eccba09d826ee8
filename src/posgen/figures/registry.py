"""The top of the figures: every figure of posgen.figure_table mapped to its loader and drawing function
(:data:`SPECS`), :func:`draw`, and :func:`render`, which the figure rules run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import xarray as xr
from matplotlib.figure import Figure

from posgen.figure_table import FIGURES, REGIME_FIGURES, STUDY_FIGURES, TRAJECTORY_FIGURES
from posgen.figures import block_swap, head_ablation, llm, synthetic, trajectory
from posgen.figures.style import save_figure
from posgen.store import stable_provenance


@dataclasses.dataclass(frozen=True)
class Spec:
    """How one paper figure is made: its drawing function and the loader of its input files."""

    func: object
    loader: object


# Figure name -> Spec, one entry per row of posgen.figure_table (which also says whether the figure
# bootstraps); rules/figures.smk makes one rule per row (fig_<name>); the tests cover every entry.
SPECS = {
    # the first paper
    "logit_maps": Spec(llm.fig_logit_maps, llm.load_examples),
    "scatter": Spec(llm.fig_scatter, llm.load_examples),
    "r_heatmap": Spec(llm.fig_r_heatmap, llm.load_r_heatmap),
    "layer_r": Spec(llm.fig_layer_r, llm.load_layer_r),
    "position_share": Spec(llm.fig_position_share, llm.load_layer_r),
    "bands": Spec(llm.fig_bands, llm.load_bands),
    "block_swap": Spec(block_swap.fig_block_swap, block_swap.load_block_swap),
    "dummy_sweep": Spec(llm.fig_dummy_sweep, llm.load_dummy_sweep),
    "perturb_ppl": Spec(llm.fig_perturb_ppl, llm.load_perturb),
    "perturb_fg": Spec(llm.fig_perturb_fg, llm.load_perturb),
    "cap": Spec(llm.fig_cap, llm.load_cap),
    # the pretrained LLMs' per-head ablation
    "head_ablation": Spec(head_ablation.fig_head_ablation, head_ablation.load_head_ablation),
    # the second paper
    "synthetic_probe": Spec(synthetic.fig_position_probe, synthetic.load_probe),
    "synthetic_accuracy": Spec(synthetic.fig_accuracy, synthetic.load_gathered("training")),
    "synthetic_ablation": Spec(synthetic.fig_ablation, synthetic.load_gathered("ablation")),
    "synthetic_deposit": Spec(synthetic.fig_deposit, synthetic.load_gathered("ablation")),
    "synthetic_toeplitz": Spec(synthetic.fig_toeplitz, synthetic.load_gathered("toeplitz")),
    "deposit_study": Spec(synthetic.fig_deposit_study, synthetic.load_deposit),
    "deposit_study_probe": Spec(synthetic.fig_position_probe, synthetic.load_probe),
    "regime_study": Spec(synthetic.fig_regime_study, synthetic.load_classifiers),
    # training trajectories
    "trajectory": Spec(trajectory.fig_trajectory, trajectory.load_trajectory),
    "trajectory_r_heatmap": Spec(llm.fig_r_heatmap, llm.load_r_heatmap),
}

ROWS = {**FIGURES, **TRAJECTORY_FIGURES, **STUDY_FIGURES, **REGIME_FIGURES}  # every row of the figure table


def check_table() -> None:
    """Raise if :data:`SPECS` and posgen.figure_table disagree, so a table row without a drawing function (or
    the reverse) fails the first figure job, and the tests."""
    if set(SPECS) != set(ROWS):
        differ = sorted(set(SPECS) ^ set(ROWS))
        raise KeyError(f"figure specs and posgen.figure_table differ in {', '.join(differ)}")


def draw(name: str, inputs: dict, *, variants=(), n_boot: int | None = 1000, seed: int | None = 0) -> Figure:
    """Load figure ``name``'s inputs (``inputs``: role -> path or paths, or the datasets of those files) and draw
    it. ``n_boot`` and ``seed`` (the `intervals` settings) are used only by figures whose table row bootstraps."""
    check_table()
    if name not in SPECS:
        raise KeyError(f"figure {name!r}: unknown (known: {', '.join(SPECS)})")
    spec = SPECS[name]
    inputs = {k: [v] if isinstance(v, (str, Path, xr.Dataset)) else list(v) for k, v in inputs.items()}
    data = spec.loader(inputs, list(variants or []))
    return spec.func(data, n_boot=n_boot, seed=seed) if ROWS[name].bootstrap else spec.func(data)


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
    """Load figure ``name``'s input files (``inputs``: role -> path or paths), draw it (:func:`draw`), save
    PNG + PDF."""
    fig = draw(name, inputs, variants=variants, n_boot=n_boot, seed=seed)
    save_figure(fig, png, pdf, provenance=stable_provenance(figure=name, **attrs))
