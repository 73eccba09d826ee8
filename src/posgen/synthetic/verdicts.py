"""A verdict per claim of arXiv 2505.13027, from the summary of a collection of experiments.

Each claim is a test on the rows of ``summary.csv`` of one experiment, stated in ``CLAIMS`` (the test and its
threshold in words are printed beside the verdict). Per experiment a claim holds, fails, or cannot be tested
(the PEs or depth it needs are absent). Across experiments:

* ``reproduced``: holds in every experiment that tests it;
* ``not reproduced``: holds in none;
* ``only in faithful mode`` / ``only in clean mode``: holds in exactly the experiments of one mode;
* ``only at 6 layers`` (``only at <n> layers``): holds in exactly the experiments of one depth;
* ``mixed``: any other pattern (the table lists where it holds);
* ``not tested``: no experiment tests it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

ROPE = "rope+sinusoidal"  # the authors' "rope"
FAIL_MARGIN = 0.05  # "fails": no more than 5 points above the best length-only rule
TIE = 0.01  # "best": within 1 point of the best PE of the experiment
SUFFICE = 0.05  # "suffice": within 5 points of full RoPE
DISPLACED = 0.5  # "displaced": mean R^2 after layer 2 below half the input's


def _row(rows: pd.DataFrame, task: str, pe: str):
    match = rows[(rows["task"] == task) & (rows["pe"] == pe)]
    return None if match.empty else match.iloc[0]


def _pct(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def _best(rows, task, pe):
    task_rows = rows[rows["task"] == task]
    row = _row(rows, task, pe)
    if row is None or len(task_rows) < 3:
        return None
    best = task_rows.loc[task_rows["test_accuracy"].idxmax()]
    held = row["test_accuracy"] >= best["test_accuracy"] - TIE
    return held, f"{pe} {_pct(row['test_accuracy'])} % (best: {best['pe']} {_pct(best['test_accuracy'])} %)"


def rope_best_distance(rows):
    return _best(rows, "distance", ROPE)


def decoupled_best_count(rows):
    return _best(rows, "count", "decoupled")


def _fails_distance(rows, pe):
    """``pe`` at most :data:`FAIL_MARGIN` above the best length-only rule on distance; untested where the
    experiment did not train it."""
    row = _row(rows, "distance", pe)
    if row is None:
        return None
    floor = row["baseline_length"]
    held = row["test_accuracy"] <= floor + FAIL_MARGIN
    return held, f"{pe} {_pct(row['test_accuracy'])} %; length-only rule {_pct(floor)} %"


def nope_fails_distance(rows):
    return _fails_distance(rows, "nope")


def alibi_fails_distance(rows):
    return _fails_distance(rows, "alibi")


def nope_ge_rope_count(rows):
    nope, rope = _row(rows, "count", "nope"), _row(rows, "count", ROPE)
    if nope is None or rope is None:
        return None
    held = nope["test_accuracy"] >= rope["test_accuracy"]
    return held, f"nope {_pct(nope['test_accuracy'])} % vs {ROPE} {_pct(rope['test_accuracy'])} %"


def _deposit_seeds(row) -> float:
    return float(row["layer0_deposit_seeds"]) if row is not None else np.nan


def deposit_rope_distance_only(rows):
    rope, nope, count = _row(rows, "distance", ROPE), _row(rows, "distance", "nope"), _row(rows, "count", ROPE)
    if rope is None:
        return None
    held = _deposit_seeds(rope) > 0.5 and not _deposit_seeds(nope) > 0.5 and not _deposit_seeds(count) > 0.5
    parts = [
        f"{ROPE} distance: top {_pct(rope['layer0_top_drop'])}, second {_pct(rope['layer0_second_drop'])} "
        f"points, criterion in {_deposit_seeds(rope):.0%} of seeds"
    ]
    for name, row in (("nope distance", nope), (f"{ROPE} count", count)):
        if row is not None:
            parts.append(f"{name}: top {_pct(row['layer0_top_drop'])}, criterion {_deposit_seeds(row):.0%}")
    return held, "; ".join(parts)


def few_rope_heads_suffice(rows):
    full = [r for r in (_row(rows, "distance", pe) for pe in ("rope", ROPE)) if r is not None]
    partial = rows[(rows["task"] == "distance") & rows["pe"].str.match(r"partial-rope-\d+$")]
    if not full or partial.empty:
        return None
    reference = max(r["test_accuracy"] for r in full)
    held = bool((partial["test_accuracy"] >= reference - SUFFICE).all())
    text = ", ".join(f"{r.pe} {_pct(r.test_accuracy)} %" for r in partial.itertuples())
    return held, f"{text}; full RoPE {_pct(reference)} %"


def additive_displaced(rows):
    row = _row(rows, "distance", ROPE)
    if row is None or not np.isfinite(row["position_r2_after_layer2"]):
        return None
    held = row["position_r2_after_layer2"] < DISPLACED * row["position_r2_input"]
    return held, (
        f"{ROPE} position R^2: input {row['position_r2_input']:.2f}, after layer 2 (mean) "
        f"{row['position_r2_after_layer2']:.2f}, last {row['position_r2_last']:.2f}"
    )


@dataclass(frozen=True)
class Claim:
    name: str
    paper: str
    test: str
    check: object


CLAIMS = [
    Claim(
        "rope_best_distance",
        "RoPE best on distance (92.6 %)",
        f"{ROPE} within 1 point of the best PE",
        rope_best_distance,
    ),
    # the paper's "NoPE and ALiBi fail on distance" as two claims, so that each is judged where its PE was trained
    Claim(
        "nope_fails_distance",
        "NoPE fails on distance",
        "nope at most 5 points above the best length-only rule",
        nope_fails_distance,
    ),
    Claim(
        "alibi_fails_distance",
        "ALiBi fails on distance",
        "alibi at most 5 points above the best length-only rule",
        alibi_fails_distance,
    ),
    Claim(
        "nope_ge_rope_count", "NoPE >= RoPE on count (77.7 vs 69.4 %)", f"nope accuracy >= {ROPE}'s", nope_ge_rope_count
    ),
    Claim(
        "decoupled_best_count",
        "MLA-style best on count (97.4 %)",
        "decoupled within 1 point of the best PE",
        decoupled_best_count,
    ),
    Claim(
        "deposit_rope_distance_only",
        "layer-0 single-head deposit for RoPE on distance only (about -60 points)",
        f"criterion (top >= 30, second <= 5 points) in most seeds for {ROPE} on distance, not for nope or count",
        deposit_rope_distance_only,
    ),
    Claim(
        "few_rope_heads_suffice",
        "one or two RoPE heads suffice (about 90 %)",
        "every partial-rope-k within 5 points of full RoPE on distance",
        few_rope_heads_suffice,
    ),
    Claim(
        "additive_displaced",
        "additive positional directions gone after layer 2 (absolute + RoPE)",
        "position R^2 after layer 2 below half the input's (needs depth > 3)",
        additive_displaced,
    ),
]


def _overall(results: dict[str, bool], meta: pd.DataFrame) -> str:
    tested = list(results)
    held = [e for e in tested if results[e]]
    if not tested:
        return "not tested"
    if len(held) == len(tested):
        return "reproduced"
    if not held:
        return "not reproduced"
    for column, words in (("faithful", {True: "faithful mode", False: "clean mode"}), ("n_layers", None)):
        values = {e: meta.loc[e, column] for e in tested}
        held_values = {values[e] for e in held}
        if len(held_values) == 1:
            value = held_values.pop()
            same = [e for e in tested if values[e] == value]
            if sorted(same) == sorted(held):
                return f"only in {words[bool(value)]}" if words else f"only at {int(value)} layers"
    return "mixed: holds in " + ", ".join(held)


def verdicts(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per claim: verdict, and per experiment whether it held with the numbers behind it."""
    meta = summary.groupby("experiment")[["faithful", "n_layers", "n_heads", "n_seeds"]].max()
    rows = []
    for claim in CLAIMS:
        results, evidence = {}, []
        for experiment, part in summary.groupby("experiment", sort=False):
            outcome = claim.check(part)
            if outcome is None:
                continue
            held, text = outcome
            results[experiment] = bool(held)
            evidence.append(f"{experiment} ({'holds' if held else 'fails'}): {text}")
        rows.append(
            {
                "claim": claim.name,
                "paper": claim.paper,
                "test": claim.test,
                "verdict": _overall(results, meta),
                "evidence": " | ".join(evidence),
            }
        )
    return pd.DataFrame(rows)


def verdict_markdown(table: pd.DataFrame, source: str, meta: pd.DataFrame | None = None) -> str:
    """Markdown of :func:`verdicts`; ``source`` says which collection the verdicts come from."""
    lines = [
        "## Verdict per claim (arXiv 2505.13027)",
        "",
        f"From `{source}`. Seeds per cell and sizes are in its summary; thresholds are fixed in "
        "`posgen.synthetic.verdicts`, not tuned.",
        "",
        "| claim (paper) | test | verdict | evidence per experiment |",
        "|---|---|---|---|",
    ]
    for r in table.itertuples():
        evidence = r.evidence.replace(" | ", "<br>") if r.evidence else "-"
        lines.append(f"| {r.paper} | {r.test} | **{r.verdict}** | {evidence} |")
    return "\n".join(lines) + "\n"
