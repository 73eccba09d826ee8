"""Where Method A's random-init gap comes from (posgen.llm.gap_origin): the rule on hand-made intervals, and the
table and section from a summary with every outcome."""

from __future__ import annotations

import pandas as pd
import pytest

from posgen.llm.gap_origin import decide, origin_markdown, origin_table, write_origin

OWN, FLOOR = "each window's own prefix trajectory", "inconclusive (held-out floor)"


@pytest.mark.parametrize(
    "gap_hi, drift, shares, outcome",
    [
        (-0.05, (0.09, 0.11), (0.6, 0.45, -0.02), "absolute position"),  # corrected 0.47 above half of 0.6
        (-0.05, (0.07, 0.10), (0.6, 0.03, -0.02), OWN),  # corrected 0.05
        (-0.05, (0.01, 0.03), (0.6, 0.45, -0.02), "neither"),  # the drift closes less than half of 0.10
        (-0.05, (0.04, 0.06), (0.6, 0.03, -0.02), "inconclusive"),  # the drift interval straddles 0.05
        (-0.05, (0.07, 0.10), (0.6, 0.20, -0.12), FLOOR),  # corrected 0.32, within one floor (0.12) of 0.30
        (-0.05, (0.07, 0.10), (0.6, 0.20, -0.005), OWN),  # the same share, many held-out windows: 0.205
        (0.01, (0.09, 0.11), (0.6, 0.45, -0.02), "not testable here"),  # no gap: its interval reaches 0
        (-0.05, (0.09, 0.11), (0.6, float("nan"), float("nan")), "not testable here"),  # no held-out windows
    ],
)
def test_the_rule_decides_on_the_corrected_shared_share_with_power(gap_hi, drift, shares, outcome):
    assert decide(gap_hi, 0.10, drift, *shares) == outcome


def _rows(model, variant, a_diff, a_hi, drift, shared, smooth=0.6, shared_share=0.1, heldout=8):
    """Summary rows of one (model, variant): Methods A, A-drift, A-shared, sink 'with', every RoPE layer."""
    out = []
    for method, closes in (("A", (0.0, 0.0, 0.0)), ("A-drift", drift), ("A-shared", shared)):
        out.append(
            {
                "model": model,
                "variant": variant,
                "method": method,
                "sink": "with",
                "layer_type": "rope",
                "mean_r": 0.8 + closes[0],
                "diff_vs_trained": a_diff,
                "diff_lo": a_diff - 0.02,
                "diff_hi": a_hi,
                "diff_vs_a": closes[0],
                "diff_vs_a_lo": closes[1],
                "diff_vs_a_hi": closes[2],
                "k_position_share_smooth": smooth,
                "k_shared_share": shared_share,
                "share_floor": 8 / 1199,
                "heldout_windows": heldout,
                "k_scaled_share": shared_share + 0.05,
                "n_samples": 8,
            }
        )
    return out


def test_the_table_and_section_give_each_seed_its_outcome_and_the_model_theirs_when_they_agree():
    rows = (
        _rows("m", "trained", float("nan"), float("nan"), (0.01, 0.0, 0.02), (0.0, -0.01, 0.01), 0.05, 0.01)
        + _rows("m", "random-seed0", -0.10, -0.08, (0.08, 0.07, 0.09), (0.01, 0.0, 0.02))
        + _rows("m", "random-seed1", -0.10, -0.08, (0.08, 0.07, 0.09), (0.06, 0.055, 0.07), shared_share=0.5)
        + _rows("n", "random-seed0", -0.10, -0.08, (0.02, 0.01, 0.03), (0.01, 0.0, 0.02))
    )
    summary = pd.DataFrame(rows)
    table = origin_table(summary).set_index(["model", "variant"])
    assert table.loc[("m", "random-seed0"), "outcome"] == OWN  # corrected 0.1 + 0.0625 against 0.3
    assert table.loc[("m", "random-seed1"), "outcome"] == "absolute position"
    assert table.loc[("n", "random-seed0"), "outcome"] == "neither"
    assert table.loc[("m", "trained"), "outcome"] == "-"
    assert table.loc[("m", "random-seed0"), "gap"] == pytest.approx(0.10)
    assert table.loc[("m", "random-seed0"), "k_window_share"] == pytest.approx(0.5)
    assert table.loc[("m", "random-seed0"), "shared_floor"] == pytest.approx(-0.5 / 8)
    assert table.loc[("m", "random-seed0"), "k_shared_corrected"] == pytest.approx(0.1 + 0.5 / 8)
    text = origin_markdown(summary)
    assert "- **m**: inconclusive" in text  # its two seeds disagree
    assert "- **n**: neither" in text
    assert "| m | random-seed1 |" in text and "**absolute position**" in text
    assert "| 0.600 | 0.100 | 0.163 | 0.150 | 0.500 |" in text  # smooth, shared, corrected, fitted, per-window


def test_the_power_rule_holds_back_a_verdict_that_few_held_out_windows_cannot_support():
    """A-shared closes little (0.01 of a 0.10 gap: the old rule said per-window content) and the shared share is
    0.25 of a 0.70 drift: with 8 held-out windows its floor (-0.056) reaches the line (0.35), with 32 it does not."""
    few = _rows("m", "random-seed0", -0.10, -0.08, (0.09, 0.08, 0.10), (0.01, 0.0, 0.02), 0.70, 0.25, heldout=8)
    many = _rows("m", "random-seed0", -0.10, -0.08, (0.09, 0.08, 0.10), (0.01, 0.0, 0.02), 0.70, 0.25, heldout=32)
    assert origin_table(pd.DataFrame(few))["outcome"].iloc[0] == FLOOR
    assert origin_table(pd.DataFrame(many))["outcome"].iloc[0] == OWN


def test_the_position_study_file_is_the_section_with_its_provenance(tmp_path):
    """results/gap_origin.md (target `position_study`): the same table and outcomes as reproduction.md's section,
    its own title, the config hash it was made with; no temporary left beside it."""
    rows = _rows("m", "trained", float("nan"), float("nan"), (0.0, -0.01, 0.01), (0.0, -0.01, 0.01), 0.05, 0.01)
    rows += _rows("m", "random-seed0", -0.10, -0.08, (0.08, 0.07, 0.09), (0.01, 0.0, 0.02))
    csv, md = tmp_path / "summary.csv", tmp_path / "gap_origin.md"
    pd.DataFrame(rows).to_csv(csv, index=False)
    write_origin(csv, md, config_hash="abc123")
    text = md.read_text()
    section = origin_markdown(pd.read_csv(csv))
    assert text.startswith("# Position or prefix content?")
    assert section.split("\n", 1)[1] in text  # everything below the section's title, unchanged
    assert f"- **m**: {OWN}" in text
    assert "config_hash abc123" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gap_origin.md", "summary.csv"]
