"""The first paper's verdicts (posgen.verdicts) on summaries with known numbers."""

from __future__ import annotations

import pandas as pd
import pytest

from posgen.verdicts import CLAIMS, control_markdown, verdict, verdict_markdown, verdicts

GAP = {"A": -0.15, "B": -0.01, "A-drift": -0.01}  # random-init minus trained mean r


def summary(models=("m1", "m2")) -> pd.DataFrame:
    rows = []
    for model in models:
        for method, trained_r in (("A", 0.93), ("B", 0.87), ("A-drift", 0.94)):
            for variant in ("trained", "random-seed0"):
                diff = 0.0 if variant == "trained" else GAP[method]
                r = trained_r + diff
                rows.append(
                    {
                        "model": model,
                        "variant": variant,
                        "method": method,
                        "sink": "with",
                        "layer_type": "rope",
                        "mean_r": r,
                        "pooled_r": r + 0.04,
                        "diff_vs_trained": diff if variant != "trained" else float("nan"),
                        "diff_lo": diff - 0.01,
                        "diff_hi": diff + 0.005,
                    }
                )
    return pd.DataFrame(rows)


def by_claim(results):
    return {claim.check.__name__: (text, findings) for claim, text, findings in results}


def test_each_claim_gets_its_verdict_from_fixed_thresholds():
    bands = {
        m: {
            "trained": {"low_share_q": 0.7, "low_share_k": 0.8},
            "random-seed0": {"low_share_q": 0.5, "low_share_k": 0.5},
        }
        for m in ("m1",)
    }
    bands["m2"] = {
        "trained": {"low_share_q": 0.55, "low_share_k": 0.55},
        "random-seed0": {"low_share_q": 0.5, "low_share_k": 0.5},
    }
    ratio = {("token-swap", 0.05): 1.05, ("token-swap", 0.2): 1.5, ("posid-swap", 0.05): 1.02, ("posid-swap", 0.2): 1.3}
    perturb = {"m1": {"trained": ratio}, "m2": {"trained": {**ratio, ("posid-swap", 0.2): 1.1}}}
    results = by_claim(verdicts(summary(), bands, perturb))
    # r: A 0.93 / 0.97 is within 0.05 of 0.959, B's mean 0.87 is not; A-drift (0.94 / 0.98) is a diagnostic:
    # shown, never counted
    assert results["r_near_paper"][0] == "holds only under Method A"
    assert [f.construction for f in results["r_near_paper"][1] if f.diagnostic] == ["A-drift", "A-drift"]
    # only Method A's random-init gap exceeds 0.05
    assert results["random_init_lacks_split"][0] == "holds only under Method A"
    assert results["low_frequency_pattern_learned"][0] == "holds only for m1"
    assert results["perturbations_tolerated"][0] == "holds only for m1"
    assert len(results) == len(CLAIMS)
    md = verdict_markdown(verdicts(summary(), bands, perturb), "results/summary.csv")
    assert "**holds only under Method A**" in md and "m1 / A: trained 0.930" in md
    assert "m1 / A-drift (diagnostic): trained 0.940" in md
    # a diagnostic alone never makes a claim hold: A-drift's random-init gap would pass where A and B fail
    gaps = summary()
    gaps.loc[(gaps["method"] == "A-drift") & (gaps["variant"] != "trained"), ["diff_vs_trained", "diff_hi"]] = [
        -0.2,
        -0.1,
    ]
    gaps.loc[(gaps["method"] == "A") & (gaps["variant"] != "trained"), ["diff_vs_trained", "diff_hi"]] = [-0.01, 0.0]
    assert by_claim(verdicts(gaps, bands, perturb))["random_init_lacks_split"][0] == "does not hold at this size"


def test_verdict_words():
    from posgen.verdicts import Finding

    assert verdict([]) == "not tested"
    assert verdict([Finding("m", "A", True, ""), Finding("m", "B", True, "")]) == "holds"
    assert verdict([Finding("m", "A", False, ""), Finding("n", "A", False, "")]) == "does not hold at this size"
    mixed = [Finding("m", "A", True, ""), Finding("n", "A", False, ""), Finding("m", "B", False, "")]
    assert verdict(mixed) == "holds only in m/A"


def test_control_table_puts_the_constructions_side_by_side():
    md = control_markdown(summary(models=("m1",)))
    row = "| m1 | random-seed0 | with | -0.150 [-0.160, -0.145] | -0.010 [-0.020, -0.005] | -0.010 [-0.020, -0.005] |"
    assert row in md and "| Method A | Method B | Method A-drift (diagnostic) |" in md


@pytest.mark.parametrize("missing", ["bands", "perturb"])
def test_claims_without_their_inputs_are_not_tested(missing):
    bands = (
        {}
        if missing == "bands"
        else {
            "m1": {
                "trained": {"low_share_q": 0.7, "low_share_k": 0.8},
                "random-seed0": {"low_share_q": 0.5, "low_share_k": 0.5},
            }
        }
    )
    perturb = {} if missing == "perturb" else {"m1": {"trained": {("token-swap", 0.05): 1.0, ("token-swap", 0.2): 1.5}}}
    results = by_claim(verdicts(summary(), bands, perturb))
    name = "low_frequency_pattern_learned" if missing == "bands" else "perturbations_tolerated"
    assert results[name][0] == "not tested"
