"""A verdict per claim of arXiv 2505.13027, decided per regime from the per-classifier table (``classifiers.csv``).

Each experiment of a collection is one regime (its depth, heads, width, optimiser steps, learning rate, train
sequences, longest distance, seeds and mode; :func:`regime`). In each, a claim's test is decided at the seed
level with the outcomes of ``posgen.claims`` (docs/method.md section 8.9):

* a seed counts only where every cell the test compares converged (``posgen.synthetic.convergence``);
* differences are judged against a tie margin: the larger of the compared cells' seed SD and two binomial
  standard errors of the test set, never less;
* a threshold at or above the models' ceiling makes the test not discriminative, a competitor the claim names
  that was not trained too, and a regime that removes the mechanism makes it not testable here.

Thresholds are constants of this module, fixed before any result was seen.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from posgen.claims import Claim, Decision, Outcome, combine, exceeds, overall, t_interval, verdict_markdown
from posgen.rules import value
from posgen.stats import CRITERION_TOP
from posgen.store import atomic_path

ROPE = "rope+sinusoidal"  # the authors' "rope"
AUTHORS_PES = ("nope", "sinusoidal", "learned", "t5", "alibi", ROPE, "decoupled")  # the PEs the paper compares
FAIL_MARGIN = value("FAIL_MARGIN")  # "fails": at most 5 points above the exact position-free Bayes accuracy
SUFFICE = value("SUFFICE")  # "suffice": within 5 points of full RoPE
TIE_SE = value("TIE_SE")  # the tie margin: at least this many binomial SE of the test set
LEAK_SE = value("LEAK_SE")  # NoPE's sanity check: a leak above its ceiling by more than this many SE
MIN_SEEDS = value("MIN_SEEDS")  # deciding seeds a reproduced / not reproduced rests on
MIN_PER_CLASS = value("MIN_PER_CLASS")  # training sequences per class below which a distance cell is not testable
ALIBI_HIDES = value("ALIBI_HIDES")  # the shallowest head's bias at the longest distance hides a trigger below -this
DISPLACED = value("DISPLACED")  # "displaced": the input probe's R^2 after layer 2 below half its R^2 on the input
PAPER_LONGEST_DISTANCE = 71  # the paper's distance task: middle ~ U{1..70}
PAPER_REGIME = "6 layers x 16 heads, width 256, 13,700 steps at lr 1e-4, 70,000 train sequences, distance <= 71"


def size_and_budget(rows: pd.DataFrame) -> str:
    """Model size, optimiser budget, train sequences and longest distance of rows of one experiment (a summary's
    or a per-classifier table's), in words."""
    first = rows.iloc[0]
    longest = rows.loc[rows["task"] == "distance", "longest_distance"]
    parts = [
        f"{first['n_layers']} x {first['n_heads']} heads, width {first['d_model']}",
        f"{int(rows['train_steps'].max())} steps at lr {float(first['lr']):g}",
        f"{int(rows['n_train'].max())} train sequences",
    ]
    if len(longest):
        parts.append(f"distance <= {int(longest.max())}")
    return ", ".join(parts)


def regime(rows: pd.DataFrame) -> str:
    """The regime an experiment's per-classifier rows were decided in, in words."""
    first = rows.iloc[0]
    seeds = rows["seed"].nunique()
    parts = [
        size_and_budget(rows),
        f"{seeds} seed{'s' if seeds > 1 else ''}",
        "faithful" if first["faithful"] else "clean",
    ]
    parts.append(f"{int(rows['converged'].sum())} of {len(rows)} classifiers converged")
    return ", ".join(parts)


def _pct(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def _table(rows: pd.DataFrame, task: str, column: str = "test_accuracy") -> pd.DataFrame:
    """(seed, pe) of ``column`` for ``task``."""
    part = rows[rows["task"] == task]
    return part.pivot_table(index="seed", columns="pe", values=column, aggfunc="first")


def _converged(rows: pd.DataFrame, task: str, pes) -> pd.Series:
    """Per seed: every one of ``pes`` trained and converged on ``task``."""
    gate = _table(rows.assign(converged=rows["converged"].astype(float)), task, "converged")
    return gate.reindex(columns=list(pes)).fillna(0).astype(bool).all(axis=1)


def tie_margin(acc: pd.DataFrame, n_test: int) -> float:
    """The larger of the compared cells' seed SD and two binomial standard errors of the test set at the larger
    mean accuracy."""
    p = float(np.clip(acc.mean().max(), 0, 1))
    binomial = 2 * math.sqrt(p * (1 - p) / n_test)
    sd = acc.std(ddof=1).max() if len(acc) > 1 else 0.0
    return float(max(binomial, np.nan_to_num(sd)))


def _paired(rows, task, pe, rival, threshold_of_margin) -> Decision:
    """``pe`` minus ``rival`` per converged seed, judged against ``threshold_of_margin(margin)``."""
    acc = _table(rows, task)[[pe, rival]].dropna()
    margin = tie_margin(acc, int(rows["n_test"].max()))
    means = acc.mean()
    if means.min() >= 1 - margin:
        return Decision(
            Outcome.NOT_DISCRIMINATIVE,
            f"{pe} {_pct(means[pe])} %, {rival} {_pct(means[rival])} %: both at the ceiling (margin "
            f"{100 * margin:.1f} points)",
        )
    gate = _converged(rows, task, [pe, rival]).reindex(acc.index).fillna(False)
    if not gate.any():
        return Decision(Outcome.INCONCLUSIVE, f"no seed in which {pe} and {rival} both converged")
    outcome, text = exceeds((acc[pe] - acc[rival])[gate], threshold_of_margin(margin))
    evidence = (
        f"{pe} {_pct(means[pe])} % vs {rival} {_pct(means[rival])} %: {text}; margin {100 * margin:.1f} points"
        f"{'' if gate.all() else f'; {int((~gate).sum())} unconverged seed(s) left out'}"
    )
    return Decision(outcome, evidence)


def _best(rows: pd.DataFrame, task: str, pe: str, named: tuple) -> Decision | None:
    """``pe`` at least as good as every other PE of the paper's set trained here (within the tie margin)."""
    trained = set(rows.loc[rows["task"] == task, "pe"])
    if pe not in trained:
        return None
    missing = [c for c in named if c not in trained]
    if missing:
        return Decision(Outcome.NOT_DISCRIMINATIVE, f"{', '.join(missing)} not trained here")
    rivals = [c for c in AUTHORS_PES if c in trained and c != pe]
    means = _table(rows, task)[rivals].mean()
    rival = str(means.idxmax())
    return _paired(rows, task, pe, rival, lambda margin: -margin)


def rope_best_distance(rows):
    return _best(rows, "distance", ROPE, ("nope", "sinusoidal", "alibi", "decoupled"))


def decoupled_best_count(rows):
    decision = _best(rows, "count", "decoupled", ("nope", "sinusoidal", "alibi", ROPE))
    if decision is None:
        return None
    note = "; decoupled is the MLA-style PE on our backbone, not the paper's MLA model"
    return Decision(decision.outcome, decision.evidence + note)


def nope_fails_distance(rows):
    """A sanity check: NoPE with mean pooling is permutation invariant, so the exact position-free Bayes accuracy
    is its ceiling and "fails" holds by construction; only a leak (above it in every seed) can break it."""
    cells = rows[(rows["task"] == "distance") & (rows["pe"] == "nope")]
    if cells.empty:
        return None
    bayes = float(cells["baseline_bayes"].iloc[0])
    se = math.sqrt(bayes * (1 - bayes) / int(cells["n_test"].iloc[0]))
    over = cells["test_accuracy"] - bayes
    text = (
        f"nope {_pct(cells['test_accuracy'].mean())} % per seed {', '.join(_pct(a) for a in cells['test_accuracy'])}"
        f"; its ceiling, the exact position-free Bayes accuracy, {_pct(bayes)} % (2 SE = {100 * 2 * se:.1f} points)"
    )
    if (over > 2 * se).all():
        return Decision(Outcome.NOT_REPRODUCED, text + ": above the ceiling in every seed, a position leak")
    return Decision(Outcome.NOT_DISCRIMINATIVE, text + ": a sanity check that holds by construction")


def _shallowest_slope(n_heads: int, faithful: bool) -> float:
    """The smallest ALiBi slope (posgen.synthetic.pe): exp(-(H-1)/H) faithful, 2^-8 clean."""
    return math.exp(-(n_heads - 1) / n_heads) if faithful else 2.0**-8


def alibi_fails_distance(rows):
    cells = rows[(rows["task"] == "distance") & (rows["pe"] == "alibi")]
    if cells.empty:
        return None
    first = cells.iloc[0]
    longest = int(cells["longest_distance"].max())
    slope = _shallowest_slope(int(first["n_heads"]), bool(first["faithful"]))
    if longest < PAPER_LONGEST_DISTANCE:
        return Decision(
            Outcome.NOT_TESTABLE,
            f"longest distance {longest} < the paper's {PAPER_LONGEST_DISTANCE}: with {'faithful' if first['faithful'] else 'clean'}"
            f" slopes the shallowest head's bias is "
            f"{-slope * longest:.1f} at {longest} against {-slope * PAPER_LONGEST_DISTANCE:.1f} at "
            f"{PAPER_LONGEST_DISTANCE} (alibi {_pct(cells['test_accuracy'].mean())} %)",
        )
    bayes = float(first["baseline_bayes"])
    by_seed = cells.set_index("seed")
    alibi = by_seed["test_accuracy"]
    reference = _table(rows, "distance").get(ROPE, pd.Series(dtype=float)).reindex(alibi.index)
    stated = f"alibi {_pct(alibi.mean())} % vs position-free Bayes {_pct(bayes)} % + 5"
    # the positive control: "fails" says something about ALiBi only where the reference PE learned the task in
    # the same regime and seed (more than the failure margin above the Bayes accuracy)
    if reference.isna().all():
        return Decision(
            Outcome.NOT_DISCRIMINATIVE,
            f"{stated}; {ROPE}, the control that the task is learnable in this regime, not trained here",
        )
    learned = reference > bayes + FAIL_MARGIN
    per_seed = f"{ROPE} per seed {', '.join(_pct(a) for a in reference)} %"
    if not learned.any():
        return Decision(
            Outcome.NOT_DISCRIMINATIVE,
            f"{stated}; {per_seed}: the control fails too, so the regime, not ALiBi, may be what fails",
        )
    gate = by_seed["converged"].astype(bool) & learned
    if not gate.any():
        return Decision(
            Outcome.INCONCLUSIVE, f"{stated}; no seed in which alibi converged and {ROPE} learned ({per_seed})"
        )
    outcome, text = exceeds((bayes + FAIL_MARGIN - alibi)[gate], 0.0)
    left_out = int(len(gate) - gate.sum())
    note = f"; {left_out} seed(s) left out (alibi unconverged or {ROPE} not learned)" if left_out else ""
    return Decision(outcome, f"{stated}: {text}; control {per_seed}{note}")


def _contrast(rows, task, a, b) -> str:
    acc = _table(rows, task)
    if a not in acc or b not in acc:
        return f"{a} - {b}: not trained"
    mean, lo, hi = t_interval((acc[a] - acc[b]).dropna())
    interval = "" if not np.isfinite(lo) else f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    return f"{a} - {b} {100 * mean:+.1f}{interval}"


def nope_ge_rope_count(rows):
    acc = _table(rows, "count")
    if "nope" not in acc or ROPE not in acc:
        return None
    decision = _paired(rows, "count", "nope", ROPE, lambda margin: -margin)
    contrasts = "; ".join(_contrast(rows, "count", a, b) for a, b in (("rope", "nope"), (ROPE, "sinusoidal")))
    return Decision(decision.outcome, f"{decision.evidence}; which component: {contrasts} points")


def deposit_rope_distance_only(rows):
    main = rows[(rows["task"] == "distance") & (rows["pe"] == ROPE)]
    if main.empty:
        return None
    controls = {
        "nope distance": rows[(rows["task"] == "distance") & (rows["pe"] == "nope")],
        f"{ROPE} count": rows[(rows["task"] == "count") & (rows["pe"] == ROPE)],
    }
    shown = (
        f"{ROPE} distance: top / second {', '.join(f'{_pct(t)}/{_pct(s)}' for t, s in zip(main['layer0_top_drop'], main['layer0_second_drop']))}"
        f" points, criterion in {int(main['layer0_deposit'].sum())} of {len(main)} seeds"
    )
    for name, cells in controls.items():
        if not cells.empty:
            shown += f"; {name}: criterion in {int(cells['layer0_deposit'].sum())} of {len(cells)}"
    missing = [name for name, cells in controls.items() if cells.empty]
    if missing:
        return Decision(
            Outcome.NOT_DISCRIMINATIVE, f"{shown}; {', '.join(missing)} not trained: the 'only' half is untested"
        )
    if main["test_accuracy"].mean() < CRITERION_TOP:
        text = f"{shown}; {ROPE} accuracy {_pct(main['test_accuracy'].mean())} % leaves no room for a 30-point drop"
        return Decision(Outcome.NOT_DISCRIMINATIVE, text)
    gate = main["converged"].astype(bool)
    held, n = int(main.loc[gate, "layer0_deposit"].sum()), int(gate.sum())
    in_controls = sum(int(c["layer0_deposit"].sum()) for c in controls.values())
    if n < 2:
        outcome = Outcome.INCONCLUSIVE
    elif held == n and in_controls == 0:
        outcome = Outcome.REPRODUCED
    elif held == 0:
        outcome = Outcome.NOT_REPRODUCED
    else:
        outcome = Outcome.INCONCLUSIVE
    return Decision(outcome, f"{shown}; {n} converged {ROPE} distance seed(s) decide")


def few_rope_heads_suffice(rows):
    acc = _table(rows, "distance")
    partial = [pe for pe in acc.columns if re.fullmatch(r"partial-rope-\d+", pe)]
    full = [pe for pe in ("rope", ROPE) if pe in acc.columns]
    if not partial or not full:
        return None
    reference = acc[full].max(axis=1)  # per seed, the better full-RoPE PE
    outcomes, texts = [], []
    for pe in partial:
        gate = _converged(rows, "distance", [pe, *full]).reindex(acc.index).fillna(False)
        if not gate.any():
            outcomes.append(Outcome.INCONCLUSIVE)
            texts.append(f"{pe}: no seed in which it and full RoPE both trained and converged")
            continue
        outcome, text = exceeds((acc[pe] - reference)[gate], -SUFFICE)
        outcomes.append(outcome)
        texts.append(f"{pe} {_pct(acc[pe].mean())} %: {outcome.value}, {text}")
    return Decision(combine(outcomes), f"{'; '.join(texts)}; full RoPE {_pct(reference.mean())} %")


def _displacement(cells: pd.DataFrame) -> pd.Series:
    """Per seed: half the input probe's R^2 on the input minus its mean R^2 after layer 2 (> 0: displaced)."""
    return DISPLACED * cells["transfer_r2_input"] - cells["transfer_r2_after_layer2"]


def additive_displaced(rows):
    cells = rows[(rows["task"] == "distance") & (rows["pe"] == ROPE)]
    if cells.empty:
        return None
    depth = int(cells["n_layers"].iloc[0])
    if depth <= 3:
        return Decision(Outcome.NOT_TESTABLE, f"depth {depth}: no stream after layer 2 to test")
    gate = cells["converged"].astype(bool)
    r2 = (
        f"{ROPE}: input probe R^2 {cells['transfer_r2_input'].mean():.2f} on the input, "
        f"{cells['transfer_r2_after_layer2'].mean():.2f} after layer 2 (fresh probe {cells['position_r2_after_layer2'].mean():.2f})"
    )
    references = []
    for pe in ("sinusoidal", "rope"):
        ref = rows[(rows["task"] == "distance") & (rows["pe"] == pe)]
        if ref.empty:
            references.append(f"{pe}: not trained")
        else:
            references.append(
                f"{pe}: {ref['transfer_r2_input'].mean():.2f} -> {ref['transfer_r2_after_layer2'].mean():.2f}"
            )
    if not gate.any():
        return Decision(Outcome.INCONCLUSIVE, f"{r2}; no converged seed; references {', '.join(references)}")
    outcome, text = exceeds(_displacement(cells)[gate].values, 0.0, points=False)
    return Decision(
        outcome, f"{r2}; half the input R^2 minus R^2 after layer 2 {text}; references {', '.join(references)}"
    )


CLAIMS = [
    Claim(
        "rope_best_distance",
        "RoPE best on distance (92.6 %)",
        f"{ROPE} not below the best other PE of the paper's set by more than the tie margin, per seed",
        rope_best_distance,
    ),
    Claim(
        "nope_fails_distance",
        "NoPE fails on distance",
        "a sanity check: nope at most 2 SE above the exact position-free Bayes accuracy (its ceiling)",
        nope_fails_distance,
    ),
    Claim(
        "alibi_fails_distance",
        "ALiBi fails on distance",
        f"alibi at most 5 points above the position-free Bayes accuracy, per seed; testable at distances up to "
        f"{PAPER_LONGEST_DISTANCE}",
        alibi_fails_distance,
    ),
    Claim(
        "nope_ge_rope_count",
        "NoPE >= RoPE on count (77.7 vs 69.4 %)",
        f"nope not below {ROPE} by more than the tie margin, per seed; contrasts rope - nope and "
        f"{ROPE} - sinusoidal say which component",
        nope_ge_rope_count,
    ),
    Claim(
        "decoupled_best_count",
        "MLA-style best on count (97.4 %)",
        "decoupled not below the best other PE by more than the tie margin, per seed",
        decoupled_best_count,
    ),
    Claim(
        "deposit_rope_distance_only",
        "layer-0 single-head deposit for RoPE on distance only (about -60 points)",
        f"criterion (top >= 30, second <= 5 points) in every converged seed of {ROPE} on distance, in none of nope "
        f"on distance or {ROPE} on count",
        deposit_rope_distance_only,
    ),
    Claim(
        "few_rope_heads_suffice",
        "one or two RoPE heads suffice (about 90 %)",
        "every partial-rope-k within 5 points of the better full RoPE, per seed",
        few_rope_heads_suffice,
    ),
    Claim(
        "additive_displaced",
        "additive positional directions gone after layer 2 (absolute + RoPE)",
        "the probe fitted on the input stream, applied unchanged after layer 2: R^2 below half its input R^2, per "
        "seed (depth > 3)",
        additive_displaced,
    ),
]


def verdicts(classifiers: pd.DataFrame) -> pd.DataFrame:
    """One row per (claim, experiment) that tests it: outcome, regime and evidence, and the claim's ``verdict``
    over every regime (a claim no experiment tests gets one row, "not tested")."""
    out = []
    for claim in CLAIMS:
        claim_rows, outcomes = [], {}
        for experiment, rows in classifiers.groupby("experiment", sort=False):
            decision = claim.check(rows)
            if decision is None:
                continue
            outcomes[experiment] = decision.outcome
            claim_rows.append(
                {
                    "experiment": experiment,
                    "outcome": decision.outcome.value,
                    "regime": regime(rows),
                    "evidence": decision.evidence,
                }
            )
        verdict = overall(outcomes)
        for row in claim_rows or [{"experiment": "", "outcome": verdict, "regime": "", "evidence": ""}]:
            out.append({"claim": claim.name, "paper": claim.paper, "test": claim.test, "verdict": verdict, **row})
    return pd.DataFrame(out)


def verdicts_markdown(table: pd.DataFrame, source: str) -> str:
    """Markdown of :func:`verdicts`: one row per claim, its verdict per regime with the regime and evidence."""
    rows = []
    for name, part in table.groupby("claim", sort=False):
        first = part.iloc[0]
        evidence = [
            f"{r.experiment}: **{r.outcome}** at {r.regime}. {r.evidence}" for r in part.itertuples() if r.experiment
        ]
        rows.append({"paper": first["paper"], "test": first["test"], "verdict": first["verdict"], "evidence": evidence})
    preamble = (
        f"From `{source}`, decided per regime (experiment) at the seed level: a seed counts where the cells compared "
        "converged; 95 % t intervals over seeds; tie margin = max(seed SD, 2 binomial SE of the test set). The "
        f"paper's regime: {PAPER_REGIME}. Thresholds are fixed in `posgen.synthetic.verdicts`, not tuned. "
        "Outcomes: reproduced / not reproduced / inconclusive / not discriminative / not testable here "
        "(docs/method.md section 8.9)."
    )
    return verdict_markdown("Verdict per claim (arXiv 2505.13027)", preamble, rows)


def write_verdicts(classifiers_csv, md_path, title: str = "") -> pd.DataFrame:
    """A collection's verdicts (``verdicts.md`` beside its ``classifiers.csv``): every claim per regime."""
    table = verdicts(pd.read_csv(classifiers_csv))
    text = (f"# {title}\n\n" if title else "") + verdicts_markdown(table, str(classifiers_csv))
    with atomic_path(md_path) as tmp:
        Path(tmp).write_text(text)
    return table
