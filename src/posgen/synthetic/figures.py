"""Drawing functions of the second paper's family and its reproduction rows, in the house style of
``posgen.figures`` (``style``, ``save_figure``). Inputs are the gathered NetCDFs of ``rules/synthetic.smk``:
``training.nc`` (task, pe, seed, step), ``ablation.nc`` and ``toeplitz.nc`` (task, pe, seed, layer, head).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.figure import Figure

from posgen.figures import PAGE_WIDTH, Spec, _by_variant, _integer_ticks, _styled, _symmetric_limit, variant_colors
from posgen.stats import seed_interval, spearman
from posgen.store import require
from posgen.synthetic.study_figures import fig_position_probe

# Reported numbers of arXiv 2505.13027 (secondary notes, docs in /shared/notes/deconstructing-pe.md section 5):
# test accuracy in percent; None where only a qualitative statement is known.
PAPER_ACCURACY = {
    ("distance", "rope+sinusoidal"): (92.64, "best"),
    ("count", "rope+sinusoidal"): (69.43, ""),
    ("distance", "decoupled"): (88.34, ""),
    ("count", "decoupled"): (97.41, "best"),
    ("distance", "sinusoidal"): (None, "second best"),
    ("count", "sinusoidal"): (None, "moderate"),
    ("distance", "alibi"): (None, "fails"),
    ("count", "alibi"): (None, "worst"),
    ("distance", "nope"): (None, "fails"),
    ("count", "nope"): (77.69, ""),
}
PAPER_DEPOSIT = {  # (task, pe): layer-0 largest single-head drop in points, as reported
    ("distance", "rope+sinusoidal"): (60.0, "one layer-0 head, about 60 points; others barely matter"),
    ("distance", "nope"): (None, "absent"),
    ("count", "rope+sinusoidal"): (None, "absent"),
}


@_styled
def fig_accuracy(training: xr.Dataset, n_boot: int = 1000, seed: int = 0) -> Figure:
    """Final test accuracy per PE (x) and task (colour), mean over seeds with 95 % bootstrap intervals."""
    acc = training["final_test_accuracy"]
    tasks, pes = list(acc["task"].values), list(acc["pe"].values)
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 2.4))
    width = 0.8 / len(tasks)
    for t, task in enumerate(tasks):
        stats = np.array([seed_interval(acc.sel(task=task, pe=pe).values, n_boot, seed) for pe in pes]) * 100
        x = np.arange(len(pes)) + (t - (len(tasks) - 1) / 2) * width
        err = np.abs(stats[:, 1:] - stats[:, :1]).T
        ax.bar(x, stats[:, 0], width, label=task, yerr=np.nan_to_num(err), capsize=2)
    ax.set_xticks(np.arange(len(pes)), pes, rotation=30, ha="right")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(title="task")
    return fig


@_styled
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
            _integer_ticks(ax.xaxis)
            _integer_ticks(ax.yaxis)
        axes[row, 0].set_ylabel(f"{task}\nlayer")
    for ax in axes[-1]:
        ax.set_xlabel("head")
    fig.colorbar(image, ax=axes, label="accuracy drop (points)", shrink=0.8)
    return fig


@_styled
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
        _integer_ticks(ax.xaxis)
    axes[0, 0].set_ylabel("deposit index")
    axes[0, 0].set_ylim(0, 1.05)
    axes[0, -1].legend(fontsize=6, ncols=2)
    return fig


@_styled
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


def reproduction_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The second paper's reported numbers beside ours, one row per (experiment, task, pe) of ``summary.csv``,
    with the position-free baselines of the task."""
    rows = []
    for _, row in summary.iterrows():
        key = (row["task"], row["pe"])
        paper_acc, paper_note = PAPER_ACCURACY.get(key, (None, ""))
        paper_drop, drop_note = PAPER_DEPOSIT.get(key, (None, ""))
        rows.append(
            {
                "experiment": row["experiment"],
                "task": row["task"],
                "pe": row["pe"],
                "paper_accuracy": np.nan if paper_acc is None else paper_acc,
                "paper_note": paper_note,
                "accuracy": 100 * row["test_accuracy"],
                "accuracy_lo": 100 * row["test_accuracy_lo"],
                "accuracy_hi": 100 * row["test_accuracy_hi"],
                "mae": row["test_mae"],
                "within_one": 100 * row["test_within_one"],
                **{f"baseline_{b}": 100 * row[f"baseline_{b}"] for b in ("majority", "length", "bag")},
                "n_seeds": row["n_seeds"],
                "paper_layer0_max_drop": np.nan if paper_drop is None else paper_drop,
                "paper_deposit_note": drop_note,
                "layer0_top_drop": 100 * row["layer0_top_drop"],
                "layer0_second_drop": 100 * row["layer0_second_drop"],
                "layer0_deposit_index": row["layer0_deposit_index"],
            }
        )
    return pd.DataFrame(rows)


def _num(value, fmt="{:.1f}"):
    return "-" if not np.isfinite(value) else fmt.format(value)


def _paper(value, note) -> str:
    return " ".join(x for x in [_num(value) if np.isfinite(value) else "", note] if x) or "-"


def reproduction_markdown(rows: pd.DataFrame) -> str:
    """Markdown of :func:`reproduction_rows` (accuracies and drops in percentage points)."""
    lines = [
        "# Reproduction of arXiv 2505.13027 (positional encodings on synthetic tasks)",
        "",
        "Test accuracy (%), mean absolute error (label units) and within-one accuracy (%), beside the task's "
        "position-free baselines (majority class, best length-only rule, best trigger-count rule; "
        "docs/method.md section 8.2), and the layer-0 single-head ablation (top and second drop in points; "
        "deposit index = top / sum of positive drops, '-' when the top drop is under 5 points). Paper numbers "
        "from secondary notes; their 'rope' is our rope+sinusoidal. Intervals: 95 % bootstrap over seeds.",
        "",
        "| experiment | task | PE | paper acc. | ours acc. [95 % CI] | MAE | within 1 | majority / length / bag | "
        "paper layer-0 drop | ours top / second drop | deposit idx |",
        "|---|---|---|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for _, r in rows.iterrows():
        ci = f" [{_num(r['accuracy_lo'])}, {_num(r['accuracy_hi'])}]" if np.isfinite(r["accuracy_lo"]) else ""
        base = " / ".join(_num(r[f"baseline_{b}"]) for b in ("majority", "length", "bag"))
        lines.append(
            f"| {r['experiment']} | {r['task']} | {r['pe']} | {_paper(r['paper_accuracy'], r['paper_note'])} | "
            f"{_num(r['accuracy'])}{ci} | {_num(r['mae'], '{:.2f}')} | {_num(r['within_one'])} | {base} | "
            f"{_paper(r['paper_layer0_max_drop'], r['paper_deposit_note'])} | "
            f"{_num(r['layer0_top_drop'])} / {_num(r['layer0_second_drop'])} | "
            f"{_num(r['layer0_deposit_index'], '{:.2f}')} |"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------
# The pretrained LLMs' per-head ablation (posgen.synthetic.llm_heads)

LLM_HEADS_VARIABLES = ["loss_increase", "method_a_r", "f_share", "deposit_index"]


def load_llm_heads(inputs, variants) -> xr.Dataset:
    """``inputs["head_ablation"]``: one head_ablation.nc per variant, stacked along ``variant``."""
    return _by_variant(inputs["head_ablation"], variants, LLM_HEADS_VARIABLES)


@_styled
def fig_llm_heads(ablation: xr.Dataset, probe: str = "repeat") -> Figure:
    """Per variant (rows): loss increase of ``probe`` (layer x head), Method A r (layer x head), and the
    increase against the head's f share, with the Spearman correlation in the title.

    ``ablation`` has dims (variant, probe, layer, head) as :func:`load_llm_heads` returns it.
    """
    require(ablation, LLM_HEADS_VARIABLES + ["variant", "probe", "layer", "head"], "llm heads figure input")
    increase = ablation["loss_increase"].sel(probe=probe).transpose("variant", "layer", "head")
    r = ablation["method_a_r"].transpose("variant", "layer", "head")
    variants = list(ablation["variant"].values)
    colors = variant_colors(variants)
    limit = max(_symmetric_limit(increase.values), 1e-6)
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
            _integer_ticks(ax.xaxis)
            _integer_ticks(ax.yaxis)
        fig.colorbar(im_drop, ax=ax_drop, label="nats", pad=0.01)
        fig.colorbar(im_r, ax=ax_r, label="$r$", pad=0.01)
        share = ablation["f_share"].sel(variant=variant).values.ravel()
        drop = increase.sel(variant=variant).values.ravel()
        ax_scatter.scatter(share, drop, s=6, color=colors[variant], alpha=0.7, linewidths=0)
        ax_scatter.set_xlabel("f share $r_f^2 / (r_f^2 + r_g^2)$")
        ax_scatter.set_ylabel("loss increase (nats)")
        ax_scatter.set_title(f"Spearman {spearman(drop, share):+.2f}")
    return fig


def _open(path) -> xr.Dataset:
    from posgen.store import open_dataset

    return open_dataset(path, lazy=False)


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


def _load(role: str):
    """Loader of a figure drawn from one gathered file (inputs: role -> [path])."""
    return lambda inputs, variants: by_pe(_open(inputs[role][0]))


def _load_probe(inputs, variants) -> pd.DataFrame:
    probe = _open(inputs["probe"][0])["position_r2"]
    return probe.to_dataframe().reset_index().dropna(subset=["position_r2"])


# Figure name -> Spec, one entry per second-family row of posgen.figure_table.
FIGURES = {
    "synthetic_probe": Spec(fig_position_probe, _load_probe),
    "synthetic_accuracy": Spec(fig_accuracy, _load("training")),
    "synthetic_ablation": Spec(fig_ablation, _load("ablation")),
    "synthetic_deposit": Spec(fig_deposit, _load("ablation")),
    "synthetic_toeplitz": Spec(fig_toeplitz, _load("toeplitz")),
    "llm_heads": Spec(fig_llm_heads, load_llm_heads),
}
