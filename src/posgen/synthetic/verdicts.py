"""A verdict per claim of arXiv 2505.13027, decided per regime from the per-classifier table (``classifiers.csv``).

Each experiment of a collection is one regime (``posgen.synthetic.regime``). In each, a claim's test is decided at
the seed level with the outcomes of ``posgen.claims`` (docs/method.md section 8.9), under the rules of
``posgen.verdict_rules`` (each cited in its row, the post-hoc ones marked):

* every classifier passes the gate of ``posgen.synthetic.convergence``: converged, did not fit, or still
  learning; a seed with a cell still learning is inconclusive, never dropped, and a cell that did not fit is a
  result of its budget, compared as it is;
* a "fails" claim counts a seed only where its positive control learned the task (``LEARN_FRACTION``) in the same
  regime and seed; a control below that line in every seed makes the test not discriminative;
* differences are judged against a tie margin: the larger of the compared cells' seed SD and ``TIE_SE`` binomial
  standard errors of the test set; a reproduced or not reproduced rests on at least ``MIN_SEEDS`` deciding seeds;
* a threshold at or above the models' ceiling, a rival or a control not trained make a test not discriminative
  (with the reason); a regime that removes the mechanism (too little data per class, an ALiBi bias that hides
  nothing) makes it not testable here.

``python -m posgen.synthetic.verdicts CLASSIFIERS_CSV`` prints the verdicts of a per-classifier table (e.g. the
committed H200 regime table, docs/gpu/regime_study-classifiers.csv).
"""

from __future__ import annotations

import fnmatch
import functools
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from posgen.claims import (
    WHY,
    Claim,
    Decision,
    Outcome,
    combine,
    exceeds,
    overall,
    row_label,
    t_interval,
    verdict_frame,
    verdict_markdown,
)
from posgen.stats import CRITERION_TOP
from posgen.store import atomic_path
from posgen.synthetic.convergence import LEARN_FRACTION, LEARNING, line
from posgen.synthetic.regime import MIN_PER_CLASS, per_class, regime, too_little_data, with_states
from posgen.verdict_rules import cite, frozen_at, value, version

ROPE = "rope+sinusoidal"  # the authors' "rope"
AUTHORS_PES = ("nope", "sinusoidal", "learned", "t5", "alibi", ROPE, "decoupled")  # the PEs the paper compares
FAIL_MARGIN = value("FAIL_MARGIN")  # "fails": at most 5 points above the exact position-free Bayes accuracy
SUFFICE = value("SUFFICE")  # "suffice": within 5 points of full RoPE
TIE_SE = value("TIE_SE")  # the tie margin: at least this many binomial SE of the test set
LEAK_SE = value("LEAK_SE")  # NoPE's sanity check: a leak above its ceiling by more than this many SE
MIN_SEEDS = value("MIN_SEEDS")  # deciding seeds a reproduced / not reproduced rests on
ALIBI_HIDES = value("ALIBI_HIDES")  # the shallowest head's bias at the longest distance hides a trigger below -this
DISPLACED = value("DISPLACED")  # "displaced": the input probe's R^2 after layer 2 below half its R^2 on the input
PAPER_REGIME = "6 layers x 16 heads, width 256, 13,700 steps at lr 1e-4, 70,000 train sequences, distance <= 71"
DECIDING_RUNS = (
    "the regime study on one H200 (docs/gpu/regime_study-classifiers.csv, re-decided in docs/results.md) and the "
    "decisive study at the authors' size (docs/method.md section 8.10)"
)


def _pct(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def _states(rows: pd.DataFrame) -> pd.DataFrame:
    return rows if "state" in rows.columns else with_states(rows)


def _table(rows: pd.DataFrame, task: str, column: str = "test_accuracy") -> pd.DataFrame:
    """(seed, pe) of ``column`` for ``task``."""
    part = rows[rows["task"] == task]
    return part.pivot_table(index="seed", columns="pe", values=column, aggfunc="first")


def _learning(rows: pd.DataFrame, task: str, pes, seeds) -> pd.Series:
    """Per seed of ``seeds``: a cell of ``pes`` on ``task`` still learning (the gate)."""
    state = rows[(rows["task"] == task) & rows["pe"].isin(list(pes))]
    still = state.assign(open=state["state"] == LEARNING).groupby("seed")["open"].any()
    return still.reindex(seeds, fill_value=False)


def tie_margin(acc: pd.DataFrame, n_test: int) -> float:
    """The larger of the compared cells' seed SD and TIE_SE binomial standard errors of the test set at the larger
    mean accuracy."""
    p = float(np.clip(acc.mean().max(), 0, 1))
    binomial = TIE_SE * math.sqrt(p * (1 - p) / n_test)
    sd = acc.std(ddof=1).max() if len(acc) > 1 else 0.0
    return float(max(binomial, np.nan_to_num(sd)))


def _needs_data(pes=None, learned_seeds_decide: bool = False):
    """A distance claim's check under too little data per class (PER_CLASS_BEARS): ``pes`` None, a claim that a PE
    fails (or that RoPE is best), is not testable here (data per class); otherwise the claim stands where every
    seed of ``pes(rows)`` (the classifiers it reads on distance) learned the task, and is not testable where one did
    not; with ``learned_seeds_decide`` (the deposit, which counts only the seeds that learned), it stands where any
    seed learned. The evidence keeps what the gate and the control alone would say, and the data per class."""

    def wrap(check):
        @functools.wraps(check)
        def checked(rows):
            decision = check(rows)
            why = too_little_data(rows)
            if decision is None or not why or decision.outcome == Outcome.NOT_TESTABLE:
                return decision
            if pes is not None:
                cells = _states(rows)
                cells = cells[(cells["task"] == "distance") & cells["pe"].isin(pes(cells))]
                learned = cells["learned"].eq(True)
                if len(cells) and (learned.any() if learned_seeds_decide else learned.all()):
                    said = "the seeds that learned decide" if learned_seeds_decide else "every seed learned"
                    data = f"{per_class(rows):.0f} training sequences per class, fewer than {MIN_PER_CLASS}"
                    return Decision(decision.outcome, f"{decision.evidence}; {data}, but {said}", decision.why)
            evidence = f"{why}; by the gate and the control alone: {decision.label}, {decision.evidence}"
            return Decision(Outcome.NOT_TESTABLE, evidence, "data per class")

        return checked

    return wrap


def _partial_and_full(rows: pd.DataFrame) -> list[str]:
    return [pe for pe in rows["pe"].unique() if re.fullmatch(r"partial-rope-\d+", pe) or pe in ("rope", ROPE)]


def _over_seeds(diff: pd.Series, open_seeds: pd.Series, threshold: float, points: bool = True):
    """(outcome, text) of a per-seed difference: inconclusive while a seed is still learning (never dropped),
    else claims.exceeds over the seeds with at least MIN_SEEDS of them."""
    if open_seeds.any():
        seeds = ", ".join(str(s) for s in open_seeds[open_seeds].index)
        return Outcome.INCONCLUSIVE, f"seed(s) {seeds} still learning, so no verdict over seeds"
    return exceeds(diff, threshold, points, min_seeds=MIN_SEEDS)


def _paired(rows, task, pe, rival, threshold_of_margin) -> Decision:
    """``pe`` minus ``rival`` per seed, judged against ``threshold_of_margin(margin)``."""
    acc = _table(rows, task)[[pe, rival]].dropna()
    margin = tie_margin(acc, int(rows["n_test"].max()))
    means = acc.mean()
    stated = f"{pe} {_pct(means[pe])} % vs {rival} {_pct(means[rival])} %"
    if means.min() >= 1 - margin:
        return Decision(
            Outcome.NOT_DISCRIMINATIVE, f"{stated}: both at the ceiling (margin {100 * margin:.1f} points)", "ceiling"
        )
    open_seeds = _learning(rows, task, [pe, rival], acc.index)
    outcome, text = _over_seeds(acc[pe] - acc[rival], open_seeds, threshold_of_margin(margin))
    return Decision(outcome, f"{stated}: {text}; margin {100 * margin:.1f} points")


def _best(rows: pd.DataFrame, task: str, pe: str, named: tuple) -> Decision | None:
    """``pe`` at least as good as every other PE of the paper's set trained here (within the tie margin)."""
    rows = _states(rows)
    trained = set(rows.loc[rows["task"] == task, "pe"])
    if pe not in trained:
        return None
    missing = [c for c in named if c not in trained]
    if missing:
        return Decision(Outcome.NOT_DISCRIMINATIVE, f"{', '.join(missing)} not trained here", "rival")
    rivals = [c for c in AUTHORS_PES if c in trained and c != pe]
    means = _table(rows, task)[rivals].mean()
    rival = str(means.idxmax())
    return _paired(rows, task, pe, rival, lambda margin: -margin)


@_needs_data()
def rope_best_distance(rows):
    return _best(rows, "distance", ROPE, ("nope", "sinusoidal", "alibi", "decoupled"))


def decoupled_best_count(rows):
    decision = _best(rows, "count", "decoupled", ("nope", "sinusoidal", "alibi", ROPE))
    if decision is None:
        return None
    note = "; decoupled is the MLA-style PE on our backbone, not the paper's MLA model"
    return Decision(decision.outcome, decision.evidence + note, decision.why)


def nope_fails_distance(rows):
    """A sanity check: NoPE with mean pooling is permutation invariant, so the exact position-free Bayes accuracy
    is its ceiling and "fails" holds by construction; only a leak (above it in every seed) breaks it, and then the
    check failed: "sanity check failed", never "not reproduced"."""
    cells = rows[(rows["task"] == "distance") & (rows["pe"] == "nope")]
    if cells.empty:
        return None
    bayes = float(cells["baseline_bayes"].iloc[0])
    se = math.sqrt(bayes * (1 - bayes) / int(cells["n_test"].iloc[0]))
    over = cells["test_accuracy"] - bayes
    text = (
        f"nope {_pct(cells['test_accuracy'].mean())} % per seed {', '.join(_pct(a) for a in cells['test_accuracy'])}"
        f"; its ceiling, the exact position-free Bayes accuracy, {_pct(bayes)} % ({LEAK_SE} SE = "
        f"{100 * LEAK_SE * se:.1f} points)"
    )
    if (over > LEAK_SE * se).all():
        return Decision(Outcome.SANITY_FAILED, text + ": above the ceiling in every seed, a position leak")
    return Decision(Outcome.NOT_DISCRIMINATIVE, text + ": a sanity check that holds", "tautology")


def _shallowest_slope(n_heads: int, faithful: bool) -> float:
    """The smallest ALiBi slope (posgen.synthetic.pe): exp(-(H-1)/H) faithful, 2^-8 clean."""
    return math.exp(-(n_heads - 1) / n_heads) if faithful else 2.0**-8


def _seed_text(cells: pd.DataFrame, seed) -> str:
    """One classifier of one seed: "4.7 % (did not fit)", "90.0 % (converged, learned)"."""
    row = cells.loc[seed]
    return f"{_pct(row['test_accuracy'])} % ({row['state']}{', learned' if row['learned'] else ''})"


@_needs_data()
def alibi_fails_distance(rows):
    rows = _states(rows)
    cells = rows[(rows["task"] == "distance") & (rows["pe"] == "alibi")]
    if cells.empty:
        return None
    first = cells.iloc[0]
    longest = int(cells["longest_distance"].max())
    mode = "faithful" if first["faithful"] else "clean"
    bias = -_shallowest_slope(int(first["n_heads"]), bool(first["faithful"])) * longest
    if bias > -ALIBI_HIDES:  # the mechanism: a bias that hides a far trigger from every head
        text = (
            f"with {mode} slopes the shallowest head's bias at distance {longest} is {bias:.2f}, above -{ALIBI_HIDES}"
        )
        return Decision(Outcome.NOT_TESTABLE, text + ": it hides no trigger", "bias hides nothing")
    bayes = float(first["baseline_bayes"])
    alibi = cells.set_index("seed")
    control = rows[(rows["task"] == "distance") & (rows["pe"] == ROPE)].set_index("seed").reindex(alibi.index)
    stated = f"alibi {_pct(alibi['test_accuracy'].mean())} % vs position-free Bayes {_pct(bayes)} % + 5"
    if control["test_accuracy"].isna().all():
        return Decision(Outcome.NOT_DISCRIMINATIVE, f"{stated}; {ROPE}, the positive control, not trained", "control")
    bar = line(first, LEARN_FRACTION)
    learned = control["learned"].eq(True)  # a seed without a control row did not learn
    control_open = ~learned & (control["state"] == LEARNING)
    deciding = learned & (alibi["state"] != LEARNING)
    open_seeds = (learned & (alibi["state"] == LEARNING)) | control_open
    seeds = "; ".join(f"seed {s}: alibi {_seed_text(alibi, s)}, control {_seed_text(control, s)}" for s in alibi.index)
    stated += f"; the control counts where it learned ({_pct(bar)} %, the learned line); {seeds}"
    if not deciding.any() and not open_seeds.any():
        return Decision(Outcome.NOT_DISCRIMINATIVE, f"{stated}: the control learned in no seed", "control failed")
    if not deciding.any():
        return Decision(Outcome.INCONCLUSIVE, f"{stated}: no seed decides yet")
    outcome, text = _over_seeds((bayes + FAIL_MARGIN - alibi["test_accuracy"])[deciding], open_seeds, 0.0)
    return Decision(outcome, f"{stated}: {text}")


def _contrast(rows, task, a, b) -> str:
    acc = _table(rows, task)
    if a not in acc or b not in acc:
        return f"{a} - {b}: not trained"
    mean, lo, hi = t_interval((acc[a] - acc[b]).dropna())
    interval = "" if not np.isfinite(lo) else f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    return f"{a} - {b} {100 * mean:+.1f}{interval}"


def nope_ge_rope_count(rows):
    rows = _states(rows)
    acc = _table(rows, "count")
    if "nope" not in acc or ROPE not in acc:
        return None
    decision = _paired(rows, "count", "nope", ROPE, lambda margin: -margin)
    contrasts = "; ".join(_contrast(rows, "count", a, b) for a, b in (("rope", "nope"), (ROPE, "sinusoidal")))
    return Decision(decision.outcome, f"{decision.evidence}; which component: {contrasts} points", decision.why)


def _drops(cells: pd.DataFrame) -> str:
    return ", ".join(f"{_pct(t)}/{_pct(s)}" for t, s in zip(cells["layer0_top_drop"], cells["layer0_second_drop"]))


def _measured_half(main: pd.DataFrame) -> tuple[Outcome, str]:
    """The deposit in rope+sinusoidal on distance, over the seeds that learned the task (and are settled)."""
    learned = main["learned"].eq(True)
    open_seeds = learned & (main["state"] == LEARNING)
    count = main[learned & ~open_seeds]
    held, n = int(count["layer0_deposit"].sum()), len(count)
    text = (
        f"{ROPE} distance: {int(learned.sum())} of {len(main)} seeds learned the task (top / second layer-0 drop "
        f"{_drops(main[learned]) or '-'} points; all seeds {_drops(main)}); criterion in {held} of {n} that count"
    )
    if open_seeds.any():
        return Outcome.INCONCLUSIVE, text + f"; {int(open_seeds.sum())} learned seed(s) still learning"
    if n == 0:
        return Outcome.INCONCLUSIVE, text + ": no seed learned the task, so the question stays open"
    if n < MIN_SEEDS:
        return Outcome.INCONCLUSIVE, text + f": {n} seed(s) decide, the rule asks for {MIN_SEEDS}"
    if held in (0, n):
        return (Outcome.REPRODUCED if held else Outcome.NOT_REPRODUCED), text
    return Outcome.INCONCLUSIVE, text


def _only_half(rows: pd.DataFrame) -> tuple[str, str]:
    """("missing" / "present" / "absent", text): the criterion in the controls, nope on distance (every settled
    seed: it cannot learn distance) and rope+sinusoidal on count (learned, settled seeds: the same gate)."""
    controls = {
        "nope distance": rows[(rows["task"] == "distance") & (rows["pe"] == "nope")],
        f"{ROPE} count": rows[(rows["task"] == "count") & (rows["pe"] == ROPE)],
    }
    texts, state = [], "absent"
    for name, cells in controls.items():
        counted = cells[cells["state"] != LEARNING]
        counted = counted[counted["learned"].eq(True)] if name.endswith("count") else counted
        if counted.empty:
            texts.append(f"{name}: {'not trained' if cells.empty else 'no seed counts'}")
            state = "missing" if state != "present" else state
            continue
        found = int(counted["layer0_deposit"].sum())
        texts.append(f"{name}: criterion in {found} of {len(counted)}")
        state = "present" if found else state
    return state, "; ".join(texts)


@_needs_data(lambda rows: [ROPE], learned_seeds_decide=True)
def deposit_rope_distance_only(rows):
    """The measured half first (the deposit in the seeds of rope+sinusoidal that learned distance), then the
    "only" half (the controls); a question the data cannot answer stays inconclusive."""
    rows = _states(rows)
    main = rows[(rows["task"] == "distance") & (rows["pe"] == ROPE)]
    if main.empty:
        return None
    measured, text = _measured_half(main)
    only, only_text = _only_half(rows)
    text = f"measured half {measured.value}: {text}; the 'only' half: {only_text}"
    if measured != Outcome.REPRODUCED:
        return Decision(measured, text)
    if only == "missing":
        return Decision(Outcome.INCONCLUSIVE, text + ": the 'only' half stays open")
    return Decision(Outcome.NOT_REPRODUCED if only == "present" else Outcome.REPRODUCED, text)


def deposit_contrast(classifiers: pd.DataFrame) -> str:
    """A finding beside the deposit claim: the layer-0 top drop of the rope+sinusoidal distance seeds that
    learned the task, faithful against clean; "" unless both modes have such seeds."""
    rows = _states(classifiers)
    main = rows[(rows["task"] == "distance") & (rows["pe"] == ROPE) & rows["learned"].eq(True)]
    parts = []
    for faithful, mode in ((True, "faithful"), (False, "clean")):
        cells = main[main["faithful"] == faithful]
        if cells.empty:
            return ""
        big = int((cells["layer0_top_drop"] >= CRITERION_TOP).sum())
        parts.append(
            f"{mode}: top drop >= {100 * CRITERION_TOP:.0f} points in {big} of {len(cells)} learned seeds, "
            f"criterion in {int(cells['layer0_deposit'].sum())} (top drops {_pct(cells['layer0_top_drop'].min())}-"
            f"{_pct(cells['layer0_top_drop'].max())} points)"
        )
    return "**Finding, deposit by mode** (rope+sinusoidal on distance, seeds that learned it): " + "; ".join(parts)


@_needs_data(_partial_and_full)
def few_rope_heads_suffice(rows):
    rows = _states(rows)
    acc = _table(rows, "distance")
    partial = [pe for pe in acc.columns if re.fullmatch(r"partial-rope-\d+", pe)]
    full = [pe for pe in ("rope", ROPE) if pe in acc.columns]
    if not partial or not full:
        return None
    reference = acc[full].max(axis=1)  # per seed, the better full-RoPE PE
    outcomes, texts = [], []
    for pe in partial:
        both = acc[[pe, *full]].notna().all(axis=1)
        open_seeds = _learning(rows, "distance", [pe, *full], acc.index[both])
        outcome, text = _over_seeds((acc[pe] - reference)[both], open_seeds, -SUFFICE)
        outcomes.append(outcome)
        texts.append(f"{pe} {_pct(acc[pe].mean())} %: {outcome.value}, {text}")
    return Decision(combine(outcomes), f"{'; '.join(texts)}; full RoPE {_pct(reference.mean())} %")


def _displacement(cells: pd.DataFrame) -> pd.Series:
    """Per seed: half the input probe's R^2 on the input minus its mean R^2 after layer 2 (> 0: displaced)."""
    return DISPLACED * cells["transfer_r2_input"] - cells["transfer_r2_after_layer2"]


@_needs_data(lambda rows: [ROPE])
def additive_displaced(rows):
    rows = _states(rows)
    cells = rows[(rows["task"] == "distance") & (rows["pe"] == ROPE)]
    if cells.empty:
        return None
    depth = int(cells["n_layers"].iloc[0])
    if depth <= 3:
        return Decision(Outcome.NOT_TESTABLE, f"depth {depth}: no stream after layer 2 to test", "depth")
    r2 = (
        f"{ROPE}: input probe R^2 {cells['transfer_r2_input'].mean():.2f} on the input, "
        f"{cells['transfer_r2_after_layer2'].mean():.2f} after layer 2 (fresh probe "
        f"{cells['position_r2_after_layer2'].mean():.2f})"
    )
    references = []
    for pe in ("sinusoidal", "rope"):
        ref = rows[(rows["task"] == "distance") & (rows["pe"] == pe)]
        shown = f"{ref['transfer_r2_input'].mean():.2f} -> {ref['transfer_r2_after_layer2'].mean():.2f}"
        references.append(f"{pe}: {'not trained' if ref.empty else shown}")
    by_seed = cells.set_index("seed")
    outcome, text = _over_seeds(_displacement(by_seed), by_seed["state"] == LEARNING, 0.0, points=False)
    return Decision(
        outcome, f"{r2}; half the input R^2 minus R^2 after layer 2 {text}; references {', '.join(references)}"
    )


GATE_RULES = ("GATE_CURVE", "FIT_FRACTION", "LR_FLOOR", "PLATEAU_WINDOW", "MAX_SLOPE", "HELDOUT_SE", "MIN_SEEDS")
CLAIMS = [
    Claim(
        "rope_best_distance",
        "RoPE best on distance (92.6 %)",
        f"{ROPE} not below the best other PE of the paper's set by more than the tie margin, per seed",
        rope_best_distance,
        rules=("TIE_SE", "MIN_PER_CLASS", "PER_CLASS_BEARS", *GATE_RULES),
        decided_on=tuple(f"distance/{pe}" for pe in AUTHORS_PES),
    ),
    Claim(
        "nope_fails_distance",
        "NoPE fails on distance",
        f"a sanity check: nope at most {LEAK_SE} SE above the exact position-free Bayes accuracy (its ceiling); a "
        "leak is 'sanity check failed'",
        nope_fails_distance,
        rules=("LEAK_SE",),
        decided_on=("distance/nope",),
    ),
    Claim(
        "alibi_fails_distance",
        "ALiBi fails on distance",
        "alibi at most 5 points above the position-free Bayes accuracy, per seed where the control "
        f"({ROPE}) learned the task; testable where the shallowest head's bias at the longest distance is at most "
        f"-{ALIBI_HIDES}",
        alibi_fails_distance,
        rules=("FAIL_MARGIN", "LEARN_FRACTION", "ALIBI_HIDES", "MIN_PER_CLASS", "PER_CLASS_BEARS", *GATE_RULES),
        decided_on=("distance/alibi", f"distance/{ROPE}"),
    ),
    Claim(
        "nope_ge_rope_count",
        "NoPE >= RoPE on count (77.7 vs 69.4 %)",
        f"nope not below {ROPE} by more than the tie margin, per seed; contrasts rope - nope and "
        f"{ROPE} - sinusoidal say which component",
        nope_ge_rope_count,
        rules=("TIE_SE", *GATE_RULES),
        decided_on=("count/nope", f"count/{ROPE}", "count/rope", "count/sinusoidal"),
    ),
    Claim(
        "decoupled_best_count",
        "MLA-style best on count (97.4 %)",
        "decoupled not below the best other PE by more than the tie margin, per seed",
        decoupled_best_count,
        rules=("TIE_SE", *GATE_RULES),
        decided_on=tuple(f"count/{pe}" for pe in AUTHORS_PES),
    ),
    Claim(
        "deposit_rope_distance_only",
        "layer-0 single-head deposit for RoPE on distance only (about -60 points)",
        f"the measured half first: criterion (top >= 30, second <= 5 points) in every seed of {ROPE} that learned "
        f"distance, in none (not reproduced); then the 'only' half: in no seed of nope on distance or of {ROPE} that "
        "learned count",
        deposit_rope_distance_only,
        rules=(
            "CRITERION_TOP",
            "CRITERION_SECOND",
            "LEARN_FRACTION",
            "DEPOSIT_RULE",
            "DEPOSIT_COUNT",
            "MIN_PER_CLASS",
            "PER_CLASS_BEARS",
            *GATE_RULES,
        ),
        decided_on=(f"distance/{ROPE}", "distance/nope", f"count/{ROPE}"),
    ),
    Claim(
        "few_rope_heads_suffice",
        "one or two RoPE heads suffice (about 90 %)",
        "every partial-rope-k within 5 points of the better full RoPE, per seed",
        few_rope_heads_suffice,
        rules=("SUFFICE", "MIN_PER_CLASS", "PER_CLASS_BEARS", *GATE_RULES),
        decided_on=("distance/partial-rope-*", "distance/rope", f"distance/{ROPE}"),
    ),
    Claim(
        "additive_displaced",
        "additive positional directions gone after layer 2 (absolute + RoPE)",
        "the probe fitted on the input stream, applied unchanged after layer 2: R^2 below half its input R^2, per "
        "seed (depth > 3)",
        additive_displaced,
        rules=("DISPLACED", "MIN_PER_CLASS", "PER_CLASS_BEARS", *GATE_RULES),
        decided_on=(f"distance/{ROPE}", "distance/sinusoidal", "distance/rope"),
    ),
]


def _cells_read(claim: Claim, rows: pd.DataFrame) -> str:
    """The classifier cells of ``rows`` (one experiment's) that ``claim`` reads: "task/pe; ..." in their order."""
    trained = dict.fromkeys(f"{t}/{pe}" for t, pe in zip(rows["task"], rows["pe"]))
    return "; ".join(c for c in trained if any(fnmatch.fnmatchcase(c, p) for p in claim.decided_on))


def verdicts(classifiers: pd.DataFrame, source: str = "") -> pd.DataFrame:
    """The second paper's rows of a verdicts table (posgen.claims.VERDICT_COLUMNS): one per (claim, experiment)
    that tests it, with its outcome, regime, evidence and the cells it read, and the claim's ``verdict`` over every
    regime (a claim no experiment tests gets one row without a scope, "not tested"); ``source``: the
    per-classifier table's path."""
    groups = [(name, _states(rows)) for name, rows in classifiers.groupby("experiment", sort=False)]
    registry = f"{version()} (frozen at {frozen_at()})"
    out = []
    for claim in CLAIMS:
        claim_rows, outcomes = [], {}
        for experiment, rows in groups:
            decision = claim.check(rows)
            if decision is None:
                continue
            outcomes[experiment] = decision.label
            claim_rows.append(
                {
                    "scope": experiment,
                    "outcome": decision.outcome.value,
                    "reason": WHY.get(decision.why, decision.why),
                    "regime": regime(rows),
                    "evidence": decision.evidence,
                    "decided_on": _cells_read(claim, rows),
                }
            )
        verdict = overall(outcomes)
        common = {"paper": 2, "claim": claim.name, "statement": claim.paper, "test": claim.test}
        common.update(rules=cite(claim.rules), verdict=verdict, diagnostic=False, registry=registry, source=source)
        for row in claim_rows or [{"outcome": verdict}]:
            out.append({**common, **row})
    return verdict_frame(out)


def claim_cells(table: pd.DataFrame) -> list[dict]:
    """Per claim of the second paper's rows of a verdicts table, its verdict row's cells (``paper``, ``test``,
    ``verdict``, ``evidence``: a line per regime)."""
    cells = []
    for _, part in table[table["paper"] == 2].groupby("claim", sort=False):
        first, scoped = part.iloc[0], part[part["scope"] != ""]
        evidence = [f"{r['scope']}: **{row_label(r)}** at {r['regime']}. {r['evidence']}" for _, r in scoped.iterrows()]
        test = f"{first['test']}; {first['rules']}"
        cells.append({"paper": first["statement"], "test": test, "verdict": first["verdict"], "evidence": evidence})
    return cells


def verdicts_markdown(table: pd.DataFrame, classifiers: pd.DataFrame | None = None) -> str:
    """The second paper's verdict section, rendered from its rows of a verdicts table (:func:`verdicts`): one row
    per claim, its verdict per regime with the regime and evidence. With the per-classifier table, a preamble says
    when no claim is decided here, and the deposit's mode contrast follows."""
    table = table[table["paper"] == 2]
    first = table.iloc[0]
    preamble = (
        f"From `{first['source']}`, decided per regime (experiment) at the seed level: every classifier through the "
        "gate (converged / did not fit / still learning, from its held-out curve and its fit of the training data); a "
        "seed still learning is inconclusive; a 'fails' claim counts a seed only where its control learned; 95 % "
        f"t intervals over seeds, at least {MIN_SEEDS} seeds to decide; tie margin = max(seed SD, {TIE_SE} "
        f"binomial SE of the test set). The paper's regime: {PAPER_REGIME}. Rules: `posgen.verdict_rules` (post-hoc ones "
        "marked in each row). Outcomes: reproduced / not reproduced / inconclusive / not discriminative (with its "
        "reason) / not testable here / sanity check failed (docs/method.md section 8.9). "
        f"Registry {first['registry']}."
    )
    decided = table["outcome"].isin([Outcome.REPRODUCED.value, Outcome.NOT_REPRODUCED.value]).any()
    if classifiers is not None and not decided:
        states = with_states(classifiers)["state"]
        preamble += (
            f" **This table decides nothing**: no claim is reproduced or not reproduced in its regime(s) "
            f"({int((states == 'converged').sum())} of {len(states)} classifiers converged), so a paper number "
            f"beside an accuracy here is not a result. The deciding runs: {DECIDING_RUNS}."
        )
    text = verdict_markdown("Verdict per claim (arXiv 2505.13027)", preamble, claim_cells(table))
    finding = deposit_contrast(classifiers) if classifiers is not None else ""
    return text + (f"\n{finding}\n" if finding else "")


def write_verdicts(classifiers_csv, md_path, title: str = "") -> pd.DataFrame:
    """A collection's verdicts (``verdicts.md`` beside its ``classifiers.csv``): every claim per regime."""
    classifiers = pd.read_csv(classifiers_csv)
    table = verdicts(classifiers, str(classifiers_csv))
    text = (f"# {title}\n\n" if title else "") + verdicts_markdown(table, classifiers)
    with atomic_path(md_path) as tmp:
        Path(tmp).write_text(text)
    return table


def verdicts_step(job) -> pd.DataFrame:
    """Rule synthetic_verdicts's job (a :class:`posgen.workflow.job.StepJob`)."""
    return write_verdicts(job.input["classifiers"], job.output["md"], job.params["title"])


def main(argv=None) -> None:
    """``python -m posgen.synthetic.verdicts CLASSIFIERS_CSV``: the verdicts of a per-classifier table, printed
    (e.g. docs/gpu/regime_study-classifiers.csv, the H200 regime study, re-decided under the rules of today)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m posgen.synthetic.verdicts", description=main.__doc__)
    parser.add_argument("classifiers", help="a collection's classifiers.csv")
    args = parser.parse_args(argv)
    if not Path(args.classifiers).exists():
        raise SystemExit(f"{args.classifiers}: no such file")
    classifiers = pd.read_csv(args.classifiers)
    print(verdicts_markdown(verdicts(classifiers, args.classifiers), classifiers), end="")


if __name__ == "__main__":
    main()
