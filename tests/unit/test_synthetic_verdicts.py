"""The second paper's verdicts: the outcome vocabulary on hand-made per-seed tables, the exact position-free Bayes
accuracy against brute force, the plateau slope, and training that gives identical weights twice (the gate's new
rules: tests/unit/test_gate.py)."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
import torch

from posgen.claims import Outcome, exceeds, overall, t_interval
from posgen.experiments import TaskOptions, TrainOptions
from posgen.integrity import StoreError
from posgen.store import open_dataset
from posgen.synthetic.bayes import distance_bayes_accuracy, position_free_bayes
from posgen.synthetic.convergence import plateau_slope
from posgen.synthetic.tasks import write_task
from posgen.synthetic.train import load_classifier, train_job
from posgen.synthetic.verdicts import (
    additive_displaced,
    alibi_fails_distance,
    deposit_rope_distance_only,
    few_rope_heads_suffice,
    nope_fails_distance,
    nope_ge_rope_count,
    rope_best_distance,
    verdicts,
)

# ------------------------------------------------------------------------------------------- Bayes floor


def brute_force_bayes(max_side: int, max_middle: int, fillers: tuple) -> float:
    """Every sequence the distance generator can make, with its probability: the best accuracy of any rule of
    the sequence's multiset of tokens (what a permutation-invariant classifier sees)."""
    joint = defaultdict(float)  # (multiset, label) -> probability
    for left, middle, right in itertools.product(
        range(1, max_side + 1), range(1, max_middle + 1), range(1, max_side + 1)
    ):
        n_fillers = left + middle + right
        p_shape = 1 / (max_side * max_middle * max_side)
        for chosen in itertools.product(fillers, repeat=n_fillers):
            bag = tuple(sorted((1, 2) + chosen))
            joint[bag, middle + 1] += p_shape / len(fillers) ** n_fillers
    best = defaultdict(float)
    for (bag, _), p in joint.items():
        best[bag] = max(best[bag], p)
    return sum(best.values())


@pytest.mark.parametrize("max_side, max_middle", [(1, 3), (2, 3), (3, 2)])
def test_bayes_floor_equals_brute_force_over_every_sequence(max_side, max_middle):
    assert distance_bayes_accuracy(max_side, max_middle) == pytest.approx(
        brute_force_bayes(max_side, max_middle, fillers=(3, 4)), abs=1e-12
    )


def test_bayes_floor_known_values():
    # one side filler: the length is middle + 4, so the length gives the label exactly
    assert distance_bayes_accuracy(1, 5) == pytest.approx(1.0)
    # the default task: above the empirical length rule of a finite train split (15.8 % in docs/results.md)
    assert distance_bayes_accuracy(8, 16) == pytest.approx(0.1796875)
    assert position_free_bayes("count", {}) == 1.0


# ----------------------------------------------------------------------------------------- convergence


def test_plateau_slope_reads_the_curve_while_the_rate_is_high():
    lr = np.array([1.0, 0.97, 0.88, 0.75, 0.59, 0.41, 0.25, 0.12, 0.03, 0.0])  # 10 epochs of a cosine
    rising = np.linspace(0.5, 0.95, 10)  # 5 points an epoch
    assert plateau_slope(rising, lr) == pytest.approx(0.05)
    flat_then_tail = np.r_[np.linspace(0.5, 0.9, 4), [0.9, 0.905, 0.9, 0.9, 0.97, 0.99]]
    assert abs(plateau_slope(flat_then_tail, lr)) < 0.01  # the late rise (rate under a tenth) does not count
    assert np.isnan(plateau_slope(flat_then_tail[:3], lr[:3][::-1] * 0 + 0.05))  # no epoch at a high rate
    # the slope is per tenth of the budget: the same per-epoch slope over 100 epochs is 10x steeper
    long_lr = np.r_[np.ones(80), np.zeros(20)]
    assert plateau_slope(np.linspace(0, 0.1, 100), long_lr) == pytest.approx(0.1 / 99 * 10)


# ------------------------------------------------------------------------------- outcome vocabulary


def test_t_interval_and_exceeds_known_answers():
    mean, lo, hi = t_interval([0.2, 0.4])
    half = 12.7062047 * np.std([0.2, 0.4], ddof=1) / math.sqrt(2)
    assert (mean, lo, hi) == pytest.approx((0.3, 0.3 - half, 0.3 + half))
    assert exceeds([0.1, 0.11, 0.12], 0.0)[0] == Outcome.REPRODUCED
    assert exceeds([-0.1, -0.11, -0.12], 0.0)[0] == Outcome.NOT_REPRODUCED
    assert exceeds([0.1, -0.1, 0.12], 0.0)[0] == Outcome.INCONCLUSIVE  # seeds disagree
    assert exceeds([0.01, 0.2, 0.4], 0.0)[0] == Outcome.INCONCLUSIVE  # all hold, the interval straddles 0
    assert exceeds([0.3], 0.0)[0] == Outcome.INCONCLUSIVE  # one seed has no interval
    # two seeds that agree: decided by the first paper's rule, inconclusive under the second paper's (3 seeds)
    assert exceeds([0.1, 0.11], 0.0)[0] == Outcome.REPRODUCED
    outcome, text = exceeds([0.1, 0.11], 0.0, min_seeds=3)
    assert outcome == Outcome.INCONCLUSIVE and "2 seeds decide, the rule asks for 3" in text
    assert "flips at a threshold of +8.52" in exceeds([0.1, 0.11, 0.12], 0.0)[1]  # the interval's lower end
    assert overall({"a": Outcome.REPRODUCED, "b": Outcome.REPRODUCED}) == "reproduced (in 2 of 2 regimes)"
    assert overall({"a": Outcome.REPRODUCED, "b": Outcome.NOT_TESTABLE}).startswith("depends on the regime")


def rows(
    spec: dict, *, experiment="e", n_layers=2, faithful=False, longest=17, bayes=0.18, n_train=2100, **columns
) -> pd.DataFrame:
    """A per-classifier table: ``spec[(task, pe)]`` = per-seed test accuracies; other columns as given (a
    scalar for every row, or a dict of (task, pe) -> per-seed values). By default every classifier fits its
    training data (final training accuracy 1.0) and its curves are flat: the gate says converged."""
    out = []
    for (task, pe), accuracies in spec.items():
        for seed, acc in enumerate(accuracies):
            row = {
                "experiment": experiment,
                "task": task,
                "pe": pe,
                "seed": seed,
                "n_layers": n_layers,
                "n_heads": 16,
                "d_model": 128,
                "faithful": faithful,
                "train_steps": 330,
                "lr": 6e-3,
                "n_train": n_train,
                "n_test": 900,
                "longest_distance": longest if task == "distance" else 0,
                "test_accuracy": acc,
                "final_train_accuracy": 1.0,
                "train_slope": 0.0,
                "baseline_majority": 0.07,
                "baseline_bayes": bayes if task == "distance" else 1.0,
                "layer0_top_drop": 0.1,
                "layer0_second_drop": 0.02,
                "layer0_deposit": False,
                "transfer_r2_input": 0.9,
                "transfer_r2_after_layer2": np.nan,
                "position_r2_after_layer2": np.nan,
            }
            for name, value in columns.items():
                row[name] = value[task, pe][seed] if isinstance(value, dict) else value
            out.append(row)
    return pd.DataFrame(out)


DISTANCE_SET = {("distance", pe): [0.5, 0.52, 0.51] for pe in ("nope", "sinusoidal", "alibi", "decoupled")}


def test_best_claim_every_outcome():
    clear = {**DISTANCE_SET, ("distance", "rope+sinusoidal"): [0.9, 0.91, 0.92]}
    assert rope_best_distance(rows(clear)).outcome == Outcome.REPRODUCED
    beaten = {**clear, ("distance", "sinusoidal"): [0.99, 0.98, 0.99]}
    assert rope_best_distance(rows(beaten)).outcome == Outcome.NOT_REPRODUCED
    split = {**clear, ("distance", "sinusoidal"): [0.8, 0.98, 0.91]}
    decision = rope_best_distance(rows(split))
    assert decision.outcome == Outcome.INCONCLUSIVE and "margin" in decision.evidence
    ceiling = {**clear, ("distance", "rope+sinusoidal"): [1.0, 1.0, 1.0], ("distance", "decoupled"): [1.0, 0.999, 1]}
    assert rope_best_distance(rows(ceiling)).outcome == Outcome.NOT_DISCRIMINATIVE
    # a competitor the claim names, not trained: the test cannot discriminate
    no_alibi = {k: v for k, v in clear.items() if k[1] != "alibi"}
    decision = rope_best_distance(rows(no_alibi))
    assert decision.outcome == Outcome.NOT_DISCRIMINATIVE and "alibi not trained" in decision.evidence
    # a seed still learning keeps it open: inconclusive, the seed not dropped
    learning = {key: [False, False, key[1] == "rope+sinusoidal"] for key in clear}
    decision = rope_best_distance(rows(clear, heldout_rising=learning))
    assert decision.outcome == Outcome.INCONCLUSIVE and "seed(s) 2 still learning" in decision.evidence
    assert rope_best_distance(rows({("distance", "nope"): [0.2]})) is None  # the claim's PE absent: untested


def test_tie_margin_is_at_least_two_binomial_errors():
    # 1.5 points behind with identical seeds: inside 2 SE of 900 test sequences (about 2.6 points): a tie
    tie = {**DISTANCE_SET, ("distance", "sinusoidal"): [0.8] * 3, ("distance", "rope+sinusoidal"): [0.785] * 3}
    assert rope_best_distance(rows(tie)).outcome == Outcome.REPRODUCED
    behind = {**tie, ("distance", "rope+sinusoidal"): [0.75] * 3}
    assert rope_best_distance(rows(behind)).outcome == Outcome.NOT_REPRODUCED


def test_fails_claims_read_the_bayes_ceiling_the_bias_and_the_control():
    nope = {("distance", "nope"): [0.19, 0.18, 0.17]}
    decision = nope_fails_distance(rows(nope))
    assert decision.label == "not discriminative (holds by construction)" and "sanity check" in decision.evidence
    leak = nope_fails_distance(rows({("distance", "nope"): [0.4, 0.42, 0.41]}))
    assert leak.label == "sanity check failed" and "a position leak" in leak.evidence  # was "not reproduced"
    alibi = {("distance", "alibi"): [0.2, 0.21, 0.19]}
    clean = alibi_fails_distance(rows(alibi, longest=71, n_train=30000))
    assert clean.label == "not testable here (bias hides nothing)" and "is -0.28, above -4.6" in clean.evidence
    far = dict(longest=71, bayes=0.05, faithful=True, n_train=30000)  # faithful slopes: -27.9 at 71
    learned = {("distance", "rope+sinusoidal"): [0.9, 0.95, 0.92]}  # the positive control
    failing = {("distance", "alibi"): [0.07, 0.08, 0.06], **learned}  # within 5 points of a 5 % ceiling
    assert alibi_fails_distance(rows(failing, **far)).outcome == Outcome.REPRODUCED
    fine = {("distance", "alibi"): [0.8, 0.85, 0.9], **learned}
    assert alibi_fails_distance(rows(fine, **far)).outcome == Outcome.NOT_REPRODUCED
    # a regime in which the control fails too cannot say that ALiBi fails
    hard = {("distance", "alibi"): [0.07, 0.08, 0.06], ("distance", "rope+sinusoidal"): [0.06, 0.09, 0.07]}
    assert alibi_fails_distance(rows(hard, **far)).label == "not discriminative (control did not learn)"
    alone = alibi_fails_distance(rows({("distance", "alibi"): [0.07, 0.08, 0.06]}, **far))
    assert alone.label == "not discriminative (control not trained)"
    # seeds whose control did not learn are left out; one seed left cannot decide
    mixed = {("distance", "alibi"): [0.07, 0.08, 0.06], ("distance", "rope+sinusoidal"): [0.9, 0.07, 0.06]}
    decision = alibi_fails_distance(rows(mixed, **far))
    assert decision.outcome == Outcome.INCONCLUSIVE and "one seed has no interval" in decision.evidence


def test_count_contrast_names_the_component():
    spec = {
        ("count", "nope"): [0.72, 0.71, 0.73],
        ("count", "rope"): [0.72, 0.73, 0.71],
        ("count", "rope+sinusoidal"): [0.57, 0.55, 0.58],
        ("count", "sinusoidal"): [0.6, 0.61, 0.62],
    }
    decision = nope_ge_rope_count(rows(spec))
    assert decision.outcome == Outcome.REPRODUCED
    assert "rope - nope +0.0" in decision.evidence and "rope+sinusoidal - sinusoidal -4.3" in decision.evidence


def test_deposit_claim_decides_its_measured_half_first():
    spec = {
        ("distance", "rope+sinusoidal"): [0.9] * 3,
        ("distance", "nope"): [0.2] * 3,
        ("count", "rope+sinusoidal"): [0.9] * 3,
    }
    flags = {key: [True, True, True] if key == ("distance", "rope+sinusoidal") else [False] * 3 for key in spec}
    assert deposit_rope_distance_only(rows(spec, layer0_deposit=flags)).outcome == Outcome.REPRODUCED
    assert deposit_rope_distance_only(rows(spec)).outcome == Outcome.NOT_REPRODUCED
    some = {**flags, ("distance", "rope+sinusoidal"): [True, False, True]}
    assert deposit_rope_distance_only(rows(spec, layer0_deposit=some)).outcome == Outcome.INCONCLUSIVE
    # no seed learned the task (25 % against a 59 % line): the question stays open, never "no"
    weak = {**spec, ("distance", "rope+sinusoidal"): [0.25] * 3}
    decision = deposit_rope_distance_only(rows(weak))
    assert decision.outcome == Outcome.INCONCLUSIVE and "the question stays open" in decision.evidence
    # without the count control the measured half still decides "not reproduced"; a measured "yes" stays open
    half = {k: v for k, v in spec.items() if k[0] == "distance"}
    assert deposit_rope_distance_only(rows(half)).outcome == Outcome.NOT_REPRODUCED
    decision = deposit_rope_distance_only(rows(half, layer0_deposit={k: flags[k] for k in half}))
    assert decision.outcome == Outcome.INCONCLUSIVE and "the 'only' half stays open" in decision.evidence
    # the criterion in the count control (a seed that learned count) breaks "only"
    both = {**flags, ("count", "rope+sinusoidal"): [True, False, False]}
    assert deposit_rope_distance_only(rows(spec, layer0_deposit=both)).outcome == Outcome.NOT_REPRODUCED


def test_partial_rope_and_displacement():
    spec = {("distance", "rope"): [1.0, 1.0, 1.0], ("distance", "partial-rope-1"): [0.97, 0.98, 0.99]}
    assert few_rope_heads_suffice(rows(spec)).outcome == Outcome.REPRODUCED
    spec[("distance", "partial-rope-2")] = [0.5, 0.6, 0.55]
    assert few_rope_heads_suffice(rows(spec)).outcome == Outcome.NOT_REPRODUCED
    hybrid = {("distance", "rope+sinusoidal"): [1.0, 1.0, 1.0]}
    assert additive_displaced(rows(hybrid)).outcome == Outcome.NOT_TESTABLE  # depth 2
    kept = rows(hybrid, n_layers=6, transfer_r2_after_layer2=0.85)
    assert additive_displaced(kept).outcome == Outcome.NOT_REPRODUCED
    gone = rows(hybrid, n_layers=6, transfer_r2_after_layer2=-3.0)
    assert additive_displaced(gone).outcome == Outcome.REPRODUCED


def test_verdict_table_names_the_regime_of_every_row():
    spec = {**DISTANCE_SET, ("distance", "rope+sinusoidal"): [0.9, 0.91, 0.92]}
    table = verdicts(pd.concat([rows(spec, experiment="small"), rows(spec, experiment="wide", faithful=True)]))
    best = table[table["claim"] == "rope_best_distance"]
    assert list(best["scope"]) == ["small", "wide"]
    # what each regime's verdict read: every PE of the paper's set trained there, on distance
    read = ["distance/nope", "distance/sinusoidal", "distance/alibi", "distance/decoupled", "distance/rope+sinusoidal"]
    assert best["decided_on"].iloc[0].split("; ") == read
    assert best["verdict"].iloc[0] == "reproduced (in 2 of 2 regimes)"
    assert "330 steps at lr 0.006" in best["regime"].iloc[0] and "distance <= 17" in best["regime"].iloc[0]
    assert "faithful" in best["regime"].iloc[1]
    untested = table[table["claim"] == "decoupled_best_count"]
    assert list(untested["verdict"]) == ["not tested"]


# --------------------------------------------------------------------------------------------- determinism


TINY_OPTIONS = {
    "data_seed": 0,
    "vocab_size": 12,
    "test_fraction": 0.3,
    "distance": {"n_samples": 120, "max_side": 2, "max_middle": 4},
    "count": {"n_samples": 120, "seq_len": 8, "n_triggers": 2, "max_count": 4},
    "model": {"n_layers": 1, "n_heads": 2, "d_model": 8, "d_ff": 8, "dropout": 0.1},
    "train": {
        "epochs": 2,
        "batch_size": 16,
        "lr": 3e-3,
        "weight_decay": 0.0,
        "warmup_fraction": 0.1,
        "betas": [0.9, 0.98],
        "ignore_index": None,
        "snapshots": [0.5],
        "snapshot_samples": 8,
        "precision": "float32",
        "ensemble": False,
    },
    "faithful": False,
    "rope_base": 10000.0,
}
TINY_TASK = TaskOptions.of_experiment(TINY_OPTIONS, "distance")
TINY_TRAIN = TrainOptions.of_experiment(TINY_OPTIONS)


def test_a_training_job_gives_identical_weights_twice(tmp_path):
    data = tmp_path / "distance.nc"
    write_task(TINY_TASK, data)
    states = []
    for run in range(2):
        paths = {3: (tmp_path / f"{run}.pt", tmp_path / f"{run}.nc")}
        (curves,) = train_job(data, paths, pe="rope", options=TINY_TRAIN)
        assert curves.attrs["threads"] == torch.get_num_threads() and curves.attrs["train_steps"] == 12
        states.append(torch.load(tmp_path / f"{run}.pt", weights_only=True)["state_dict"])
    for name, value in states[0].items():
        assert torch.equal(value, states[1][name]), name
    # the same weights make the same file: a checkpoint's bytes can take part in content lineage
    assert (tmp_path / "0.pt").read_bytes() == (tmp_path / "1.pt").read_bytes()


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    data = root / "distance.nc"
    write_task(TINY_TASK, data)
    paths = {seed: (root / f"seed{seed}.pt", root / f"seed{seed}.nc") for seed in (0, 1)}
    train_job(data, paths, pe="alibi", options=TINY_TRAIN, experiment="clean")
    return root


def _load(root, seed, checkpoint=None):
    recorded = int(open_dataset(root / f"seed{seed}.nc", lazy=False)["checkpoint_digest"])
    expect = {"experiment": "clean", "task": "distance", "pe": "alibi", "seed": seed}
    return load_classifier(checkpoint or root / f"seed{seed}.pt", expect=expect, digest=recorded)


def test_the_checkpoint_its_job_expects_loads(two_seeds):
    model = _load(two_seeds, 1)
    state = torch.load(two_seeds / "seed1.pt", weights_only=True)
    assert all(torch.equal(v, state["state_dict"][k]) for k, v in model.state_dict().items())


def test_a_swapped_reinitialised_or_truncated_checkpoint_stops_with_one_line(two_seeds, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # messages name files relative to the working directory
    swapped = tmp_path / "swapped.pt"  # another classifier's checkpoint in this one's place
    swapped.write_bytes((two_seeds / "seed0.pt").read_bytes())
    with pytest.raises(StoreError, match="^swapped.pt: holds seed 0, this job's is 1; delete it and run: snakemake"):
        _load(two_seeds, 1, swapped)
    state = torch.load(two_seeds / "seed1.pt", weights_only=True)  # the same metadata, fresh weights
    state["state_dict"] = {k: torch.randn_like(v) for k, v in state["state_dict"].items()}
    torch.save(state, tmp_path / "fresh.pt")
    with pytest.raises(StoreError, match="^fresh.pt: its weights are not those its train.nc recorded"):
        _load(two_seeds, 1, tmp_path / "fresh.pt")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((two_seeds / "seed1.pt").read_bytes()[:500])
    with pytest.raises(StoreError) as info:
        _load(two_seeds, 1, truncated)
    assert str(info.value).startswith("truncated.pt: not a readable classifier checkpoint (")
    assert "\n" not in str(info.value) and info.value.__cause__ is None


def test_an_analysis_names_the_curves_in_anothers_place_not_the_checkpoint(tmp_path, monkeypatch):
    """rope's train.nc in ALiBi's place (issue 53): the analysis refuses naming train.nc, which was replaced, and not
    model.pt, whose weights no longer match the digest the replaced train.nc recorded."""
    from posgen.experiments import AnalysisOptions
    from posgen.synthetic.analysis import analyse_job

    monkeypatch.chdir(tmp_path)
    write_task(TINY_TASK, "distance.nc")
    folder = "results/synthetic/clean/distance/{}/seed0"
    for pe in ("alibi", "rope"):
        files = (f"{folder.format(pe)}/model.pt", f"{folder.format(pe)}/train.nc")
        train_job("distance.nc", {0: files}, pe=pe, options=TINY_TRAIN, experiment="clean")
    curves = f"{folder.format('alibi')}/train.nc"
    (tmp_path / curves).write_bytes((tmp_path / folder.format("rope") / "train.nc").read_bytes())
    outputs = {part: f"{folder.format('alibi')}/{part}.nc" for part in ("ablation", "toeplitz", "probe")}
    with pytest.raises(StoreError) as info:
        analyse_job(
            "distance.nc",
            f"{folder.format('alibi')}/model.pt",
            curves,
            outputs,
            key=("clean", "distance", "alibi", 0),
            options=AnalysisOptions(ablation_samples=8, toeplitz_samples=3),
        )
    assert str(info.value).startswith(
        f"{curves}: another file in its place: it is the train.nc of experiment clean, task distance, pe rope, seed 0"
    )
    assert not [name for name in outputs.values() if (tmp_path / name).exists()]
