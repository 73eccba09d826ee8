"""The second paper's gate and the rules of issue 50 on hand-made tables, each flipping an old verdict: the held-out
gate on a memorising model, a control below its registered accuracy, data per class, the ALiBi bias, the seed
count, the table that decides nothing; and the committed H200 regime table re-decided."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from posgen.claims import Outcome
from posgen.synthetic.convergence import CONVERGED, LEARNING, NO_FIT, gate, heldout_rising, learned
from posgen.synthetic.regime import regime
from posgen.synthetic.verdicts import (
    alibi_fails_distance,
    deposit_contrast,
    deposit_rope_distance_only,
    few_rope_heads_suffice,
    main,
    verdicts,
    verdicts_markdown,
)

H200 = Path(__file__).resolve().parents[2] / "docs" / "gpu" / "regime_study-classifiers.csv"
LR = np.array([1.0, 1.0, 0.97, 0.88, 0.75, 0.59, 0.41, 0.25, 0.12, 0.03])  # 10 epochs: warm-up, then a cosine


def row(**values) -> pd.Series:
    """One distance classifier (Bayes 18 %: fit and learned lines at 59 %)."""
    base = {"task": "distance", "baseline_bayes": 0.18, "baseline_majority": 0.07, "train_slope": 0.0}
    return pd.Series({**base, **values})


def test_the_held_out_curve_decides_whether_a_classifier_still_learns():
    flat = np.array([0.10, 0.11, 0.12, 0.12, 0.121, 0.119, 0.12, 0.12, 0.12, 0.12])
    assert not heldout_rising(flat, LR, 900)
    rising = np.linspace(0.2, 0.65, 10)  # 5 points an epoch
    assert heldout_rising(rising, LR, 900)
    # 1.5 points an epoch is more than MAX_SLOPE per tenth, but its rise over the window is within 2 binomial SE
    # of 900 test sequences: noise; the same rise on a million sequences is not
    creeping = 0.5 + 0.015 * np.arange(10)
    assert not heldout_rising(creeping, LR, 900) and heldout_rising(creeping, LR, 10**6)
    assert heldout_rising(flat[:2], LR[:2], 900)  # too few epochs at a high rate: cannot be judged, still open


def test_the_gate_cannot_pick_the_outcome():
    """The old gate read the training slope: a memorising NoPE (97 % train, 12 % test, training accuracy still
    rising) was 'unconverged', a model at 100 % test too, and one that could not fit its data 'converged'."""
    memorising = row(final_train_accuracy=0.97, train_slope=0.05, test_accuracy=0.12, heldout_rising=False)
    assert gate(memorising) == CONVERGED and not learned(memorising)
    perfect = row(final_train_accuracy=1.0, train_slope=0.02, test_accuracy=1.0, heldout_rising=False)
    assert gate(perfect) == CONVERGED and learned(perfect)
    unfit = row(final_train_accuracy=0.068, train_slope=-0.004, test_accuracy=0.047)  # H200 faithful alibi, d71
    assert gate(unfit) == NO_FIT
    climbing = row(final_train_accuracy=0.34, train_slope=0.11, test_accuracy=0.08)
    assert gate(climbing) == LEARNING
    assert gate(row(final_train_accuracy=1.0, test_accuracy=0.9, heldout_rising=True)) == LEARNING
    # count: its floor is the majority class (its Bayes accuracy is 100 %)
    assert learned(row(task="count", baseline_bayes=1.0, test_accuracy=0.6)) is True


def table(spec: dict, *, longest=71, bayes=0.054, faithful=True, n_train=30000, train=None) -> pd.DataFrame:
    """Distance classifiers: ``spec[pe]`` per-seed test accuracies, ``train[pe]`` per-seed (train accuracy, slope)
    (default: fitted and flat)."""
    out = []
    for pe, accuracies in spec.items():
        for seed, acc in enumerate(accuracies):
            fit, slope = (train or {}).get(pe, [(1.0, 0.0)] * len(accuracies))[seed]
            out.append(
                {
                    "experiment": "e",
                    "task": "distance",
                    "pe": pe,
                    "seed": seed,
                    "n_layers": 2,
                    "n_heads": 16,
                    "d_model": 128,
                    "faithful": faithful,
                    "train_steps": 990,
                    "lr": 6e-3,
                    "n_train": n_train,
                    "n_test": 900,
                    "longest_distance": longest,
                    "test_accuracy": acc,
                    "final_train_accuracy": fit,
                    "train_slope": slope,
                    "baseline_majority": 0.02,
                    "baseline_bayes": bayes,
                    "layer0_top_drop": 0.1,
                    "layer0_second_drop": 0.02,
                    "layer0_deposit": False,
                }
            )
    return pd.DataFrame(out)


def test_a_control_below_its_registered_accuracy_does_not_count():
    """The H200 run's faithful controls at 15.7 and 13.7 % cleared the old line (Bayes 5.4 % + 5) and made
    'ALiBi fails' reproduced; the learned line is now the midpoint of Bayes and 100 % (52.7 %)."""
    failing = {"alibi": [0.047, 0.044, 0.05], "rope+sinusoidal": [0.157, 0.137, 0.14]}
    decision = alibi_fails_distance(table(failing))
    assert decision.label == "not discriminative (control did not learn)"
    assert "the control counts where it learned (52.7 %, the learned line)" in decision.evidence
    learnt = {**failing, "rope+sinusoidal": [0.9, 0.95, 0.92]}
    assert alibi_fails_distance(table(learnt)).outcome == Outcome.REPRODUCED


def test_a_seed_that_did_not_fit_fails_only_where_the_control_learned_and_a_climbing_seed_stays_open():
    spec = {"alibi": [0.047, 0.081, 0.044], "rope+sinusoidal": [0.9, 0.9, 0.13]}
    train = {"alibi": [(0.068, -0.004), (0.34, 0.11), (0.14, -0.03)]}  # did not fit / still learning / did not fit
    decision = alibi_fails_distance(table(spec, train=train))
    assert decision.outcome == Outcome.INCONCLUSIVE and "seed(s) 1 still learning" in decision.evidence
    assert "seed 2: alibi 4.4 % (did not fit), control 13.0 % (converged)" in decision.evidence
    # two seeds that did not fit, each beside a control that learned: both fail, and two seeds ask for a third
    spec = {**spec, "rope+sinusoidal": [0.9, 0.13, 0.9]}
    decision = alibi_fails_distance(table(spec, train=train))
    assert decision.outcome == Outcome.INCONCLUSIVE and "2 seeds decide, the rule asks for 3" in decision.evidence
    assert "holds in 2 of 2 seeds" in decision.evidence


def test_data_per_class_and_the_bias_decide_what_is_testable():
    spec = {"alibi": [0.047, 0.044, 0.05], "rope+sinusoidal": [0.9, 0.95, 0.92]}
    small = table(spec, n_train=2100)  # 30 per class at distance 71: the H200 regime study
    decision = alibi_fails_distance(small)
    assert decision.label == "not testable here (data per class)"
    assert decision.evidence.startswith("30 training sequences per class, fewer than 100")
    assert "by the gate and the control alone: reproduced" in decision.evidence
    assert "2100 train sequences (30 per class), distance <= 71" in regime(small)
    assert "held-out curve not recorded" in regime(small)
    assert alibi_fails_distance(table(spec)).outcome == Outcome.REPRODUCED  # 30,000: 435 per class
    # clean slopes give the shallowest head a bias of -0.28 at 71: no mechanism to test, whatever the data
    assert alibi_fails_distance(table(spec, faithful=False)).label == "not testable here (bias hides nothing)"
    # faithful slopes hide a trigger at 17 already (-6.7), which distance alone called untestable
    short = table({"alibi": [0.2, 0.21, 0.19], "rope+sinusoidal": [0.99] * 3}, longest=17, bayes=0.18)
    assert alibi_fails_distance(short).outcome == Outcome.REPRODUCED
    # PER_CLASS_BEARS (issue 61): a claim whose seeds all learned decides at any data size; one seed that did not
    # learn leaves it not testable (sample efficiency)
    few = table({"partial-rope-1": [0.97, 0.98, 0.99], "rope+sinusoidal": [1.0] * 3}, n_train=2100)
    decision = few_rope_heads_suffice(few)
    assert decision.outcome == Outcome.REPRODUCED and "30 training sequences per class" in decision.evidence
    short = table({"partial-rope-1": [0.97, 0.30, 0.99], "rope+sinusoidal": [1.0] * 3}, n_train=2100)
    assert few_rope_heads_suffice(short).label == "not testable here (data per class)"


def with_count(distance: pd.DataFrame, count_accuracy, count_deposit) -> pd.DataFrame:
    """``distance``'s classifiers and rope+sinusoidal on count (the decisive experiment's count control,
    DEPOSIT_COUNT): its per-seed test accuracies and whether each meets the deposit criterion."""
    count = distance[distance["pe"] == "rope+sinusoidal"].copy()
    count["task"], count["test_accuracy"], count["layer0_deposit"] = "count", count_accuracy, count_deposit
    count["baseline_majority"] = 0.1
    return pd.concat([distance, count], ignore_index=True)


def deposit_table(accuracies, tops, seconds, n_train=30000) -> pd.DataFrame:
    """rope+sinusoidal on distance (per-seed test accuracies and layer-0 drops) beside a NoPE that cannot learn."""
    rows = table({"rope+sinusoidal": accuracies, "nope": [0.05] * len(accuracies)}, n_train=n_train)
    main = rows["pe"] == "rope+sinusoidal"
    rows.loc[main, "layer0_top_drop"], rows.loc[main, "layer0_second_drop"] = tops, seconds
    rows.loc[main, "layer0_deposit"] = [t >= 0.3 and s <= 0.05 for t, s in zip(tops, seconds)]
    return rows


def test_the_deposit_is_decided_with_its_count_control():
    """Issue 61: the measured half holds in 3 of 3 learned seeds and the count control learned without the
    criterion: reproduced; the count control with it: not reproduced; without a count control the 'only' half
    stays open."""
    distance = deposit_table([0.95, 0.97, 0.96], [0.6, 0.55, 0.62], [0.02, 0.01, 0.03])
    assert deposit_rope_distance_only(distance).outcome == Outcome.INCONCLUSIVE  # the 'only' half open
    clean = deposit_rope_distance_only(with_count(distance, [0.9, 0.92, 0.91], [False] * 3))
    assert clean.outcome == Outcome.REPRODUCED and "rope+sinusoidal count: criterion in 0 of 3" in clean.evidence
    present = deposit_rope_distance_only(with_count(distance, [0.9, 0.92, 0.91], [True, False, False]))
    assert present.outcome == Outcome.NOT_REPRODUCED


def test_a_learned_seed_decides_the_deposit_at_30_sequences_per_class():
    """PER_CLASS_BEARS: at 30 per class (distance 71, 2,100 sequences) the seeds that learned decide the deposit
    (size-d71-clean's drops: the criterion in 0 of 3); a regime where none learned is not testable (data per
    class)."""
    learned = deposit_table([1.0, 1.0, 1.0], [0.187, 0.053, 0.317], [0.157, 0.04, 0.057], n_train=2100)
    decision = deposit_rope_distance_only(with_count(learned, [0.9] * 3, [False] * 3))
    assert decision.outcome == Outcome.NOT_REPRODUCED
    assert "30 training sequences per class, fewer than 100, but the seeds that learned decide" in decision.evidence
    none = deposit_table([0.157, 0.137, 0.14], [0.1] * 3, [0.01] * 3, n_train=2100)
    assert deposit_rope_distance_only(none).label == "not testable here (data per class)"


def test_an_unfit_memorising_seed_with_a_flat_held_out_curve_did_not_fit():
    """GATE_CURVE (issue 61): training accuracy still climbing (slope 0.05 > MAX_SLOPE) below the fit line, held-out
    curve flat: 'did not fit', where the training slope called it 'still learning'; without a held-out curve the
    training slope still decides."""
    memorising = row(final_train_accuracy=0.4, train_slope=0.05, test_accuracy=0.12, heldout_rising=False)
    assert gate(memorising) == NO_FIT
    assert gate(row(final_train_accuracy=0.4, train_slope=0.05, test_accuracy=0.12)) == LEARNING
    assert gate(row(final_train_accuracy=0.4, train_slope=0.0, test_accuracy=0.3, heldout_rising=True)) == LEARNING


def test_a_table_that_decides_nothing_says_so():
    spec = {"alibi": [0.047, 0.044, 0.05], "rope+sinusoidal": [0.157, 0.137, 0.14], "nope": [0.05] * 3}
    classifiers = table(spec, n_train=2100, train={"nope": [(0.3, 0.05)] * 3})
    text = verdicts_markdown(verdicts(classifiers, "x.csv"), classifiers)
    assert "**This table decides nothing**" in text and "(6 of 9 classifiers converged)" in text
    assert "docs/gpu/regime_study-classifiers.csv" in text
    decided = table({"alibi": [0.047, 0.044, 0.05], "rope+sinusoidal": [0.9, 0.95, 0.92]})
    assert "decides nothing" not in verdicts_markdown(verdicts(decided, "x.csv"), decided)


def test_the_command_prints_the_verdicts_and_names_a_missing_file(tmp_path, capsys):
    classifiers = table({"alibi": [0.047, 0.044, 0.05], "rope+sinusoidal": [0.9, 0.95, 0.92]})
    classifiers.to_csv(tmp_path / "classifiers.csv", index=False)
    main([str(tmp_path / "classifiers.csv")])
    assert "| ALiBi fails on distance | " in capsys.readouterr().out
    with pytest.raises(SystemExit, match="nothing.csv: no such file"):
        main([str(tmp_path / "nothing.csv")])


def test_the_h200_regime_table_re_decided():
    """docs/gpu/regime_study-classifiers.csv under the rules of issue 50: the numbers of docs/results.md."""
    classifiers = pd.read_csv(H200)
    by = verdicts(classifiers).set_index(["claim", "scope"])
    alibi = by.loc[("alibi_fails_distance", "size-d71-faithful")]  # was "reproduced"
    assert (alibi["outcome"], alibi["reason"]) == ("not testable here", "data per class")
    assert "by the gate and the control alone: inconclusive" in alibi["evidence"]
    assert "seed 1: alibi 8.1 % (still learning), control 90.0 % (converged, learned)" in alibi["evidence"]
    assert "seed 0: alibi 4.7 % (did not fit), control 15.7 % (converged)" in alibi["evidence"]
    # the deposit on its measured half: 0 of 3 learned seeds in every clean 17-token regime and faithful 17
    deposit = by.xs("deposit_rope_distance_only")
    assert set(deposit.loc[["budget-1x", "budget-3x", "budget-10x", "size-d17-faithful"], "outcome"]) == {
        "not reproduced"
    }
    d71 = deposit.loc["size-d71-faithful", "evidence"]  # the one learned seed meets the criterion: still open
    assert "1 of 3 seeds learned the task (top / second layer-0 drop 65.7/4.3 points" in d71
    assert "measured half inconclusive" in d71
    finding = deposit_contrast(classifiers)
    assert "faithful: top drop >= 30 points in 4 of 7 learned seeds, criterion in 1" in finding
    assert "clean: top drop >= 30 points in 1 of 21 learned seeds, criterion in 0" in finding
