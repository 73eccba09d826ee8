"""Where Method A's random-init gap comes from (posgen.llm.gap_origin): the rule on hand-made intervals, and the
table and section from a summary with every outcome."""

from __future__ import annotations

import pandas as pd
import pytest

from posgen.llm.gap_origin import decide, origin_markdown, origin_table, write_origin


@pytest.mark.parametrize(
    "gap_hi, shared, drift, outcome",
    [
        (-0.05, (0.06, 0.09), (0.09, 0.11), "absolute position"),  # shared closes >= half of 0.10
        (-0.05, (0.00, 0.02), (0.07, 0.10), "per-window content"),
        (-0.05, (0.00, 0.02), (0.01, 0.03), "neither"),
        (-0.05, (0.03, 0.07), (0.08, 0.10), "inconclusive"),  # the shared interval straddles 0.05
        (-0.05, (0.00, 0.02), (0.04, 0.06), "inconclusive"),  # the drift interval straddles 0.05
        (0.01, (0.06, 0.09), (0.09, 0.11), "not testable here"),  # no gap: its interval reaches 0
        (-0.05, (float("nan"), float("nan")), (0.09, 0.11), "not testable here"),  # no held-out windows
    ],
)
def test_the_rule_decides_on_intervals_against_half_the_gap(gap_hi, shared, drift, outcome):
    assert decide(gap_hi, 0.10, shared, drift) == outcome


def _rows(model, variant, a_diff, a_hi, drift, shared, smooth=0.6, shared_share=0.1):
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
                "heldout_windows": 8,
                "n_samples": 8,
            }
        )
    return out


def test_the_table_and_section_give_each_seed_its_outcome_and_the_model_theirs_when_they_agree():
    rows = (
        _rows("m", "trained", float("nan"), float("nan"), (0.01, 0.0, 0.02), (0.0, -0.01, 0.01), 0.05, 0.01)
        + _rows("m", "random-seed0", -0.10, -0.08, (0.08, 0.07, 0.09), (0.01, 0.0, 0.02))
        + _rows("m", "random-seed1", -0.10, -0.08, (0.08, 0.07, 0.09), (0.06, 0.055, 0.07))
        + _rows("n", "random-seed0", -0.10, -0.08, (0.02, 0.01, 0.03), (0.01, 0.0, 0.02))
    )
    summary = pd.DataFrame(rows)
    table = origin_table(summary).set_index(["model", "variant"])
    assert table.loc[("m", "random-seed0"), "outcome"] == "per-window content"
    assert table.loc[("m", "random-seed1"), "outcome"] == "absolute position"
    assert table.loc[("n", "random-seed0"), "outcome"] == "neither"
    assert table.loc[("m", "trained"), "outcome"] == "-"
    assert table.loc[("m", "random-seed0"), "gap"] == pytest.approx(0.10)
    assert table.loc[("m", "random-seed0"), "k_window_share"] == pytest.approx(0.5)
    assert table.loc[("m", "random-seed0"), "shared_floor"] == pytest.approx(-0.5 / 8)
    text = origin_markdown(summary)
    assert "- **m**: inconclusive" in text  # its two seeds disagree
    assert "- **n**: neither" in text
    assert "| m | random-seed1 |" in text and "**absolute position**" in text


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
    assert "- **m**: per-window content" in text
    assert "config_hash abc123" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gap_origin.md", "summary.csv"]
