"""The verdict vocabulary of a reproduction: what a claim's test can conclude, decided at the seed level.

A claim is tested in one regime (a model size, a training budget, a task size, a set of seeds: the text every
verdict is followed by) and ends in one of :class:`Outcome`:

* ``reproduced``: the effect holds in every seed that can decide it, and the t interval over seeds lies wholly
  on the claim's side of its threshold;
* ``not reproduced``: it holds in no such seed, and the interval lies wholly on the other side;
* ``inconclusive``: anything between (seeds disagree, the interval straddles the threshold, a single seed, or
  no seed whose cells converged);
* ``not discriminative``: the test cannot tell the claim from its negation here, always with its reason
  (:data:`WHY`): a tautology, a ceiling tie, a rival or a control not trained, a control that did not learn;
* ``sanity check failed``: a check that holds by construction did not (a NoPE position leak);
* ``not testable here``: the regime removes the mechanism the claim is about (e.g. distances shorter than the
  paper's);
* ``not tested``: no experiment has what the claim needs.

Intervals over seeds are Student t intervals (docs/method.md section 8.9), never a bootstrap of three values; a
claim on one model (the first paper's trained model) is decided on its 95 % bootstrap interval over windows
(:func:`against`), and every such verdict prints the threshold at which it would flip.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
import pandas as pd
from scipy import stats

from posgen.verdict_rules import value

LEVEL = value("LEVEL")  # the confidence level of every seed interval


class Outcome(str, Enum):
    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not reproduced"
    INCONCLUSIVE = "inconclusive"
    NOT_DISCRIMINATIVE = "not discriminative"
    NOT_TESTABLE = "not testable here"
    NOT_TESTED = "not tested"
    SANITY_FAILED = "sanity check failed"


# why a test cannot discriminate (printed in the verdict cell: "not discriminative (ceiling tie)")
WHY = {
    "tautology": "holds by construction",
    "ceiling": "ceiling tie",
    "rival": "rival not trained",
    "control": "control not trained",
    "control failed": "control did not learn",
    "control meets it": "the random-init control meets it too",
}


@dataclass(frozen=True)
class Decision:
    """One claim decided in one regime: the outcome and the numbers behind it."""

    outcome: Outcome
    evidence: str
    why: str = ""  # a key of WHY: the reason a test is not discriminative, or "data per class" (not testable)

    @property
    def label(self) -> str:
        """The outcome with its reason: "not discriminative (ceiling tie)"."""
        return label(self.outcome, self.why)


def label(outcome: Outcome, why: str = "") -> str:
    """An outcome as a verdict cell prints it, with its reason where it has one."""
    return f"{outcome.value} ({WHY.get(why, why)})" if why else outcome.value


@dataclass(frozen=True)
class Claim:
    """A claim of a paper: its name, the paper's words, the test in words and ``check(rows) -> Decision | None``
    (None: the rows hold nothing the claim needs)."""

    name: str
    paper: str
    test: str
    check: object
    fixed: str = ""  # why a finished run cannot fail the test (then its verdict is "not discriminative")
    reads: str = ""  # the data its test reads, whose regime its verdict is followed by (the first paper's)
    rules: tuple = ()  # the names of the rules it depends on (posgen.verdict_rules), cited in its row
    # what its verdict was decided on: the first paper's the head statistic it reads (a heads.parquet statistic of
    # the atlas' menu, or the prefix of several); the second paper's the classifier cells it reads, "task/pe"
    # patterns (fnmatch: "distance/partial-rope-*")
    decided_on: tuple = ()


def t_interval(values, level: float = LEVEL) -> tuple[float, float, float]:
    """Mean of the finite ``values`` and its Student t interval; NaN bounds with fewer than two values."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return np.nan, np.nan, np.nan
    mean = float(values.mean())
    if len(values) < 2:
        return mean, np.nan, np.nan
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return mean, mean - float(half), mean + float(half)


def exceeds(differences, threshold: float, points: bool = True, min_seeds: int = 2) -> tuple[Outcome, str]:
    """The claim "difference > threshold", one difference per seed: reproduced when every seed holds and the
    t interval lies above ``threshold``, not reproduced when no seed holds and it lies below, else inconclusive
    (so a single seed is always inconclusive, and so are fewer than ``min_seeds``). The text: seeds holding, mean
    and interval (in points of a fraction with ``points``, else as they are)."""
    d = np.asarray(differences, dtype=np.float64)
    d = d[np.isfinite(d)]
    if len(d) == 0:
        return Outcome.INCONCLUSIVE, "no seed can decide"
    held = int((d > threshold).sum())
    mean, lo, hi = t_interval(d)
    scale, unit, fmt = (100, " points", "+.2f") if points else (1, "", "+.3f")
    if len(d) < 2:
        text = f"holds in {held} of 1 seed ({scale * mean:{fmt}}{unit}; one seed has no interval)"
        return Outcome.INCONCLUSIVE, text
    text = f"holds in {held} of {len(d)} seeds ({scale * mean:{fmt}} [{scale * lo:{fmt}}, {scale * hi:{fmt}}]{unit})"
    if held == len(d) and lo > threshold:  # the threshold at which it would flip: the nearer of lo and the seeds
        text += f"; flips at a threshold of {scale * min(lo, d.min()):{fmt}}"
    elif held == 0 and hi < threshold:
        text += f"; flips at a threshold of {scale * max(hi, d.max()):{fmt}}"
    decided = (held == len(d) and lo > threshold) or (held == 0 and hi < threshold)
    if decided and len(d) < min_seeds:
        return (
            Outcome.INCONCLUSIVE,
            f"{text}; {len(d)} seeds decide, the rule asks for {min_seeds}: a second run or more seeds",
        )
    if held == len(d) and lo > threshold:
        return Outcome.REPRODUCED, text
    if held == 0 and hi < threshold:
        return Outcome.NOT_REPRODUCED, text
    return Outcome.INCONCLUSIVE, text


def against(lo: float, hi: float, threshold: float, above: bool) -> tuple[Outcome, str]:
    """A claim on one model, "value >= threshold" (``above``) or "value <= threshold", decided on the value's
    95 % interval [lo, hi]: reproduced when it lies wholly on the claim's side, not reproduced when wholly on the
    other, inconclusive when it straddles (or is missing). The text names the threshold at which the outcome
    would flip (a reproduced "above" claim turns inconclusive at a threshold above ``lo``), in words a
    diagnostic's row may print too: "holds" and "fails", never "reproduced"."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return Outcome.INCONCLUSIVE, "no interval over windows"
    near, far = (lo, hi) if above else (hi, lo)
    holds, fails = (lo >= threshold, hi < threshold) if above else (hi <= threshold, lo > threshold)
    side, other = ("above", "below") if above else ("below", "above")
    if holds:
        return Outcome.REPRODUCED, f"flips at a threshold {side} {near:.3f}"
    if fails:
        return Outcome.NOT_REPRODUCED, f"flips at a threshold {other} {far:.3f}"
    text = f"straddles it: holds at a threshold {other} {near:.3f}, fails {side} {far:.3f}"
    return Outcome.INCONCLUSIVE, text


def combine(outcomes: list[Outcome]) -> Outcome:
    """One outcome of a claim made of parts that must all hold (e.g. one per partial-RoPE head count)."""
    if not outcomes:
        return Outcome.NOT_TESTED
    if any(o == Outcome.NOT_REPRODUCED for o in outcomes):
        return Outcome.NOT_REPRODUCED
    if all(o == Outcome.REPRODUCED for o in outcomes):
        return Outcome.REPRODUCED
    for other in (Outcome.INCONCLUSIVE, Outcome.NOT_DISCRIMINATIVE, Outcome.NOT_TESTABLE):
        if other in outcomes:
            return other
    return Outcome.NOT_TESTED


def overall(per_regime: dict) -> str:
    """A claim's verdict over several regimes (each an Outcome or a label with its reason): the common one (with
    the count), or each with the regimes that gave it."""
    if not per_regime:
        return Outcome.NOT_TESTED.value
    labels = {name: getattr(v, "value", v) for name, v in per_regime.items()}
    names = list(labels)
    values = list(dict.fromkeys(labels.values()))
    if len(values) == 1:
        return f"{values[0]} (in {len(names)} of {len(names)} regimes)"
    parts = [f"{v} in {', '.join(n for n in names if labels[n] == v)}" for v in values]
    return "depends on the regime: " + "; ".join(parts)


def verdict_markdown(
    title: str, preamble: str, rows: list[dict], evidence: str = "per regime: verdict, regime, evidence"
) -> str:
    """A Markdown verdict table: one row per claim with ``paper``, ``test``, ``verdict`` and ``evidence`` (a list
    of lines, each a verdict of one part: a regime, a model, a construction), under the heading ``evidence``."""
    lines = [
        f"## {title}",
        "",
        preamble,
        "",
        f"| claim (paper) | test | verdict | {evidence} |",
        "|---|---|---|---|",
    ]
    for row in rows:
        evidence = "<br>".join(row["evidence"]) or "-"
        lines.append(f"| {row['paper']} | {row['test']} | **{row['verdict']}** | {evidence} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- the verdicts as one table

# results/verdicts.csv (docs/data-model.md, "verdicts.csv"): one row per (paper, claim, scope), both papers'; a
# claim no scope tested has one row with an empty scope. Each paper's verdict section of reproduction.md is
# rendered from its rows (posgen.llm.verdicts.verdict_markdown, posgen.synthetic.verdicts.verdicts_markdown).
VERDICT_COLUMNS = {
    "paper": "1: Han & Ji 2025 (the LLMs), 2: arXiv 2505.13027 (the classifiers)",
    "claim": "the claim's name (posgen.llm.verdicts.CLAIMS, posgen.synthetic.verdicts.CLAIMS)",
    "statement": "the claim in the paper's words",
    "test": "the test in words",
    "rules": "the rules it cites with their values and status ('rules: NEAR 0.03 (post hoc), ...'; posgen.verdict_rules)",
    "verdict": "the claim's verdict over every scope (the same on each of its rows)",
    "scope": "where this row's outcome was decided: 'model / construction' (first paper), an experiment (second)",
    "model": "the model of a first-paper row (its scope without the construction)",
    "outcome": "this scope's outcome (posgen.claims.Outcome)",
    "reason": "why it is not discriminative / not testable, in words ('' otherwise)",
    "diagnostic": "a diagnostic's row: shown, never counted",
    "regime": "what the test read in this scope (windows, seeds, model size; a regime of classifiers)",
    "status": "exploratory / confirmatory under the registry version (first paper; posgen.verdict_rules.data_status)",
    "evidence": "the numbers behind the outcome",
    "decided_on": "the head statistic (first paper) or the classifier cells, 'task/pe; ...' (second) it read",
    "registry": "the registry version its rules were read under, with the time it was frozen",
    "source": "the table the verdict was decided from",
}
TEXT_COLUMNS = [c for c in VERDICT_COLUMNS if c not in ("paper", "diagnostic")]


def verdict_frame(rows: list[dict]) -> pd.DataFrame:
    """Verdict rows (dicts with VERDICT_COLUMNS' keys; missing text columns empty) as the table's DataFrame."""
    frame = pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
    frame[TEXT_COLUMNS] = frame[TEXT_COLUMNS].astype(object).fillna("").astype(str)
    return frame.astype({"paper": int, "diagnostic": bool})


def row_label(row) -> str:
    """A verdict row's outcome as a verdict cell prints it: "not discriminative (ceiling tie)"."""
    return f"{row['outcome']} ({row['reason']})" if row["reason"] else row["outcome"]
