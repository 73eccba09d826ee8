"""The second paper's family inside the tiny end-to-end run: its files, its task data, its figures."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from posgen.reproduction import synthetic_reproduction_markdown, synthetic_reproduction_rows
from posgen.store import open_dataset
from posgen.synthetic.bayes import distance_bayes_accuracy
from posgen.synthetic.tasks import TEST, make_task
from posgen.testing.runs import TINY_SYNTHETIC


@pytest.fixture(scope="module")
def synthetic_run(tiny_workflow):
    """The synthetic family runs inside the shared tiny end-to-end run (its config has TINY_SYNTHETIC)."""
    return tiny_workflow


def test_tiny_synthetic_run(synthetic_run):
    root = synthetic_run.workdir / "results/synthetic"
    ablation = open_dataset(root / "ablation.nc", lazy=False)
    sizes = {"experiment": 1, "task": 2, "pe": 4, "seed": 2, "layer": 2, "head": 2}
    assert dict(ablation["drop"].sizes) == sizes
    assert sorted(ablation["pe"].values.tolist()) == sorted(TINY_SYNTHETIC["pes"])
    np.testing.assert_allclose(ablation["drop"], ablation["base_accuracy"] - ablation["ablated_accuracy"])
    toeplitz = open_dataset(root / "toeplitz.nc", lazy=False)
    assert dict(toeplitz["toeplitz_share"].sizes) == sizes
    # ALiBi adds an exact Toeplitz term; NoPE logits hold no position at all
    share = toeplitz["toeplitz_share"]
    assert ((share >= -1e-9) & (share <= toeplitz["additive_share"] + 1e-9)).all()
    training = open_dataset(root / "training.nc", lazy=False)
    assert training.sizes["step"] == 2 and training.attrs["config_hash"]
    summary = pd.read_csv(root / "summary.csv")
    assert len(summary) == 8 and summary["test_accuracy"].between(0, 1).all()
    assert (summary["experiment"] == "clean").all()
    # every accuracy sits beside the task's position-free baselines, the exact Bayes ceiling included
    assert summary[["baseline_majority", "baseline_length", "baseline_bag", "baseline_bayes"]].notna().all().all()
    assert (summary.loc[summary["task"] == "count", "baseline_bag"] == 1.0).all()
    sizes = TINY_SYNTHETIC["distance"]
    bayes = distance_bayes_accuracy(sizes["max_side"], sizes["max_middle"])
    assert np.allclose(summary.loc[summary["task"] == "distance", "baseline_bayes"], bayes)
    # one row per classifier, with its regime and the convergence gate; the summary counts converged seeds
    per_seed = pd.read_csv(root / "classifiers.csv")
    assert len(per_seed) == 8 * 2 and per_seed["converged"].dtype == bool
    assert (per_seed["train_steps"] == float(training["train_steps"].max())).all()
    assert summary["converged_seeds"].between(0, 2).all()
    log = (synthetic_run.workdir / "logs/synthetic/train/clean/distance.log").read_text()  # clean: jobs: task
    assert "train clean/distance/rope/seed1: 100%" in log
    rows = synthetic_reproduction_rows(summary)
    nope = [
        line for line in synthetic_reproduction_markdown(rows).splitlines() if "| clean | distance | nope |" in line
    ]
    assert len(nope) == 1 and "| fails |" in nope[0] and "steps" in nope[0]  # the regime beside the paper's word
    reproduction = (synthetic_run.workdir / "results/reproduction.md").read_text()
    assert "## Verdict per claim" in reproduction and "results/synthetic/classifiers.csv" in reproduction
    verdict_rows = [
        line for line in reproduction.split("## Verdict per claim (arXiv")[1].splitlines() if "| **" in line
    ]
    assert len(verdict_rows) == 8  # every claim, each with its regime where an experiment tests it
    outcomes = ("reproduced", "inconclusive", "not discriminative", "not testable here", "not tested")
    assert all(any(f"**{o}" in row for o in outcomes) for row in verdict_rows)
    assert (root / "verdicts.md").read_text().count("| **") == 8
    proc = synthetic_run.snakemake("--cores", "1", "--dry-run", "results/synthetic/summary.csv")
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_the_verdict_sections_of_reproduction_md_are_rendered_from_the_verdicts_table(synthetic_run):
    """results/verdicts.csv (and its digested twin verdicts.parquet) holds every verdict row of both papers; each
    paper's verdict section of reproduction.md is its rows rendered (nothing reads the Markdown back), and
    posgen.api.verdicts() reads the same table."""
    from posgen.api import verdicts
    from posgen.claims import VERDICT_COLUMNS
    from posgen.llm.verdicts import CLAIMS as FIRST
    from posgen.llm.verdicts import verdict_markdown
    from posgen.synthetic.verdicts import CLAIMS as SECOND
    from posgen.synthetic.verdicts import verdicts_markdown

    results = synthetic_run.workdir / "results"
    table = verdicts(results / "verdicts.parquet")  # digested; verdicts.csv holds the same rows as text
    text = pd.read_csv(results / "verdicts.csv", dtype=str, keep_default_na=False)
    assert text.drop(columns=["paper", "diagnostic"]).equals(table.drop(columns=["paper", "diagnostic"]).astype(str))
    assert list(table.columns[: len(VERDICT_COLUMNS)]) == list(VERDICT_COLUMNS)
    assert table.groupby("paper")["claim"].unique().map(list).to_dict() == {
        1: [c.name for c in FIRST],
        2: [c.name for c in SECOND],
    }
    reproduction = (results / "reproduction.md").read_text()
    first = verdict_markdown(table)
    classifiers = pd.read_csv(results / "synthetic/classifiers.csv")
    second = verdicts_markdown(table, classifiers)
    assert first.startswith("## Verdict per claim (Han & Ji 2025)") and first in reproduction
    assert second.startswith("## Verdict per claim (arXiv 2505.13027)") and reproduction.endswith(second)
    # what each verdict was decided on: a head statistic, the cells of its experiment
    assert set(table.loc[table["paper"] == 1, "decided_on"]) <= {
        "r_rc_A",
        "r_sweep_spread",
        "f_share",
        "low_share_k",
        "loss_increase",
    }
    # the cells it read among those the claim declares (the tiny run trains no rope+sinusoidal: alibi alone)
    alibi = table[(table["claim"] == "alibi_fails_distance") & (table["scope"] == "clean")]
    assert alibi["decided_on"].tolist() == ["distance/alibi"]
    nope = table[(table["claim"] == "nope_fails_distance") & (table["scope"] == "clean")]
    assert nope["decided_on"].tolist() == ["distance/nope"]
    pd.testing.assert_frame_equal(verdicts(results / "verdicts.parquet"), table)


def test_tiny_synthetic_data_matches_its_task_file(synthetic_run):
    ds = open_dataset(synthetic_run.workdir / "results/synthetic/tasks/distance.nc", lazy=False)
    fresh = make_task("distance", {"vocab_size": 32, "test_fraction": 0.3, **TINY_SYNTHETIC}, seed=0)
    xr.testing.assert_equal(ds[["tokens", "label", "split"]], fresh[["tokens", "label", "split"]])
    assert math.isclose(float((ds["split"] == TEST).mean()), 0.3, abs_tol=0.01)


def test_figures_draw_from_the_gathered_files(synthetic_run, tmp_path):
    from posgen.figures.registry import draw
    from posgen.workflow.figures import FIGURES as TABLE

    n_tasks, n_pes = 2, len(TINY_SYNTHETIC["pes"])
    panels = {
        "synthetic_accuracy": 1,
        "synthetic_ablation": n_tasks * n_pes,
        "synthetic_deposit": n_tasks,
        "synthetic_toeplitz": n_tasks,
        "synthetic_probe": n_tasks,
    }
    assert {name for name, row in TABLE.items() if name.startswith("synthetic_") and row.group == "all"} == set(panels)
    for name, n_panels in panels.items():
        inputs = {role: [synthetic_run.workdir / path] for role, path in TABLE[name].inputs.items()}
        fig = draw(name, inputs, n_boot=100)
        assert len([ax for ax in fig.axes if ax.get_label() != "<colorbar>"]) == n_panels, name
        # the workflow drew the same figure through its figure rule (fig_global)
        assert (synthetic_run.workdir / TABLE[name].output("png")).stat().st_size > 5000
