"""Where Method A's random-init gap comes from: absolute position, each window's own prefix trajectory, or neither
(docs/method.md section 3C). A diagnostic question beside the paper's claims, decided per random-init seed.

Under Method A a random-init model's mean r falls below the trained model's (the gap). Two constructions replace
Method A's constant mean key by a smooth trajectory kbar(j):

* Method A-drift: the window's own fit, which takes absolute position and the prefix's content alike;
* Method A-shared: a function of absolute position shared by every window, s(j), from held-out windows.

A-shared's closure of the gap is biased by the noise left in s(j) from few held-out windows (it can fall below
Method A's), so the question "is the drift shared?" is decided on the keys' shares instead: the smooth share S
(each window's own fit), the shared share X (what s(j) explains as it is), and its held-out floor
F = -(S - X) / n for n held-out windows (what s(j) keeps of their own drifts). Rule (``posgen.verdict_rules``: HALF,
GAP_SHARED, FLOOR_K; all post hoc), with t = HALF x the gap and the noise-corrected shared share X_c = X - F:

* ``not testable here``: no gap under Method A (its interval reaches 0), or no A-shared (no held-out windows);
* ``neither``: A-drift closes less than t (its interval below t): the smooth drift does not explain the gap;
* ``inconclusive``: A-drift's interval straddles t;
* ``inconclusive (held-out floor)``: A-drift closes at least t, and X_c lies within FLOOR_K |F| of HALF x S,
  the line between the two readings: the held-out windows are too few to tell them apart;
* ``absolute position``: X_c above HALF x S: at least half of the drift is shared by every window;
* ``each window's own prefix trajectory``: X_c below it: most of the drift differs from window to window.

Beside the rule, a second diagnostic: the shared share with one fitted amplitude per window and KV head
(``k_scaled_share``, ``posgen.decomposition.drift.shared_shares``), which a shared profile with a per-window size
would raise where the fixed-amplitude share stays low.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from posgen.config import VARIANT_TRAINED
from posgen.store import atomic_path, stable_provenance
from posgen.verdict_rules import value

HALF = value("HALF")  # a construction explains the gap when it closes at least this share of it
SINK = value("SINK")  # every causal entry, as the paper's correlation
FLOOR_K = value("FLOOR_K")  # power: undecided while the corrected shared share is this many floors from its line
OWN = "each window's own prefix trajectory"
FLOOR = "inconclusive (held-out floor)"
OUTCOMES = ("absolute position", OWN, "neither", "inconclusive", FLOOR, "not testable here")


def _closed(row) -> str:
    return f"{row.diff_vs_a:+.3f} [{row.diff_vs_a_lo:+.3f}, {row.diff_vs_a_hi:+.3f}]"


def decide(gap_hi: float, gap: float, drift: tuple, smooth: float, shared: float, floor: float) -> str:
    """The rule of the module docstring: ``gap`` = trained minus random-init mean r under Method A, ``gap_hi``
    the upper end of the interval of random-init minus trained; ``drift`` the (lo, hi) interval of what A-drift
    closes; ``smooth``, ``shared`` and ``floor`` the key's smooth share S, shared share X and its floor F."""
    if not gap_hi < 0 or pd.isna(shared) or pd.isna(floor):
        return "not testable here"
    t = HALF * gap
    if drift[1] < t:
        return "neither"
    if drift[0] < t:
        return "inconclusive"
    corrected, line = shared - floor, HALF * smooth
    if abs(corrected - line) <= FLOOR_K * abs(floor):
        return FLOOR
    return "absolute position" if corrected > line else OWN


def origin_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, variant): Method A's gap, what A-drift and A-shared close, the key's shares (smooth,
    shared, its floor and the corrected share, with a fitted amplitude) and the outcome (random-init variants; the
    trained model's row carries its shares for comparison)."""
    rows = summary[summary["sink"] == SINK]
    if "layer_type" in rows.columns:  # the rows over every RoPE layer
        rows = rows[rows["layer_type"] == "rope"]
    out = []
    for (model, variant), group in rows.groupby(["model", "variant"], sort=False):
        by = group.set_index("method")
        if not {"A", "A-drift", "A-shared"} <= set(by.index):
            continue
        a, drift, shared = by.loc["A"], by.loc["A-drift"], by.loc["A-shared"]
        trained = variant == VARIANT_TRAINED
        gap = float("nan") if trained else -float(a["diff_vs_trained"])
        smooth, shared_share = float(a["k_position_share_smooth"]), float(a["k_shared_share"])
        n_heldout = int(a["heldout_windows"])
        # s(j) averages n windows' own drifts: what is left of them lowers the shared share by ~ this
        floor = -(smooth - shared_share) / n_heldout if n_heldout else float("nan")
        out.append(
            {
                "model": model,
                "variant": variant,
                "a_r": float(a["mean_r"]),
                "gap": gap,
                "gap_ci": "" if trained else f"[{-a['diff_hi']:+.3f}, {-a['diff_lo']:+.3f}]",
                "drift_closes": _closed(drift),
                "shared_closes": _closed(shared),
                "k_smooth_share": smooth,
                "k_shared_share": shared_share,
                "k_window_share": smooth - shared_share,
                "share_floor": float(a["share_floor"]),
                "shared_floor": floor,
                "k_shared_corrected": shared_share - floor,
                "k_scaled_share": float(a.get("k_scaled_share", float("nan"))),
                "heldout_windows": n_heldout,
                "n_samples": int(a["n_samples"]),
                "outcome": "-"
                if trained
                else decide(
                    float(a["diff_hi"]),
                    gap,
                    (float(drift["diff_vs_a_lo"]), float(drift["diff_vs_a_hi"])),
                    smooth,
                    shared_share,
                    floor,
                ),
            }
        )
    return pd.DataFrame(out)


def model_outcome(table: pd.DataFrame, model: str) -> str:
    """A model's outcome: its seeds' common outcome, else ``inconclusive`` (the seeds disagree)."""
    seeds = table[(table["model"] == model) & (table["variant"] != VARIANT_TRAINED)]["outcome"]
    if seeds.empty:
        return "not tested"
    return seeds.iloc[0] if seeds.nunique() == 1 else "inconclusive"


def origin_markdown(summary: pd.DataFrame) -> str:
    """reproduction.md's section on where Method A's random-init gap comes from."""
    table = origin_table(summary)
    lines = [
        "## Position or prefix content? Where Method A's random-init gap comes from (diagnostic)",
        "",
        "Not a claim of the paper: a test of what the random-init control's low Method A r is. Method A-drift "
        "fits each window's own smooth key trajectory (absolute position and prefix content alike); Method "
        "A-shared uses one function of absolute position shared by every window, the mean key of held-out "
        "windows (docs/method.md section 3C). Each closes part of the gap (its mean r less Method A's, paired over "
        f"windows, 95 % bootstrap interval). Rule (`posgen.verdict_rules` HALF, GAP_SHARED, FLOOR_K; post hoc): with t = "
        f"{HALF} x the gap, *neither* if A-drift closes less than t, *inconclusive* if its interval straddles t; "
        "else the shared share corrected for its held-out floor (X - F) against half the smooth share: *absolute "
        f"position* above it, *{OWN}* below it, *{FLOOR}* within {FLOOR_K:g} floor(s) of it (too few held-out "
        "windows to tell). A-shared's own closure is shown, not decisive: the noise left in s(j) biases it down. "
        "Shares: the key's variance explained by its smooth fit (degree 8), by the shared s(j) as it is, and with "
        "one fitted amplitude per window and KV head (a diagnostic: a shared profile with per-window sizes), "
        "beside the floors (smooth: pure noise, (M - 1)/(T - 1); shared: minus the per-window share over the "
        f"number of held-out windows). Every RoPE layer, sink '{SINK}'.",
        "",
        "| model | variant | A mean r | gap under A [CI] | A-drift closes | A-shared closes | k smooth share | "
        "shared | shared, corrected | fitted amplitude | per-window | floors (smooth / shared) | "
        "windows + held-out | outcome |",
        "|---|---|---:|---|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for row in table.itertuples():
        gap = "-" if row.variant == VARIANT_TRAINED else f"{row.gap:+.3f} {row.gap_ci}"
        lines.append(
            f"| {row.model} | {row.variant} | {row.a_r:.3f} | {gap} | {row.drift_closes} | {row.shared_closes} | "
            f"{row.k_smooth_share:.3f} | {row.k_shared_share:.3f} | {row.k_shared_corrected:.3f} | "
            f"{row.k_scaled_share:.3f} | {row.k_window_share:.3f} | "
            f"{row.share_floor:.4f} / {row.shared_floor:+.4f} | {row.n_samples} + {row.heldout_windows} | "
            f"**{row.outcome}** |"
        )
    lines.append("")
    for model in dict.fromkeys(table["model"]) if not table.empty else []:
        seeds = (table["model"] == model) & (table["variant"] != VARIANT_TRAINED)
        lines.append(
            f"- **{model}**: {model_outcome(table, model)} (decided per random-init seed, {int(seeds.sum())} "
            f"seed(s); the same outcome in every seed, else inconclusive)."
        )
    if table.empty:
        lines.append("Not tested: no run has Method A, A-drift and A-shared side by side.")
    return "\n".join(lines) + "\n"


def write_origin(summary_csv: str | Path, md: str | Path, config_hash: str = "") -> None:
    """results/gap_origin.md (target ``position_study``): :func:`origin_markdown` of a run's summary.csv, with the
    config hash and posgen version it was made with."""
    prov = stable_provenance(config_hash=config_hash)
    text = "# " + origin_markdown(pd.read_csv(summary_csv)).removeprefix("## ")
    text += f"\nFrom `{summary_csv}`; config_hash {prov['config_hash']}, posgen {prov['posgen_version']}.\n"
    with atomic_path(md) as tmp:
        Path(tmp).write_text(text)


def main(argv=None) -> None:
    """``python -m posgen.llm.gap_origin SUMMARY_CSV [...]``: the section, from a run's results/summary.csv (or its
    per-model summary.csv files)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m posgen.llm.gap_origin", description=main.__doc__)
    parser.add_argument("summary", nargs="+", help="a run's results/summary.csv, or per-model summary.csv files")
    args = parser.parse_args(argv)
    print(origin_markdown(pd.concat([pd.read_csv(path) for path in args.summary], ignore_index=True)))


if __name__ == "__main__":
    main()


def gap_origin_step(job) -> None:
    """Rule gap_origin's job (a :class:`posgen.workflow.job.StepJob`)."""
    write_origin(job.input["csv"], job.output["md"], config_hash=job.params["config_hash"])
