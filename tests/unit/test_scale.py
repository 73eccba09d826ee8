"""The scale study's table (posgen.llm.scale) on summaries with known numbers: size order, gaps over seeds, the
registered trend rule (strictly monotone and an end-to-end interval that excludes 0), per-model verdicts, figure."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from posgen.llm import scale

MODELS = ["qwen2.5-coder-1.5b", "smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"]  # not in size order
BY_SIZE = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def summary(trained_a: dict, gap_a: dict, half: float = 0.005, seeds: int = 2) -> pd.DataFrame:
    """Method A and B rows of every model of ``trained_a`` (A's mean r), B 0.05 lower; random-init seed s scores
    ``gap_a[model] + 0.002 s`` below the trained model under A, 0.01 under B."""
    rows = []
    for model in MODELS:
        for method in ("A", "B"):
            base = trained_a[model] - (0.05 if method == "B" else 0.0)
            for variant in ("trained", *(f"random-seed{s}" for s in range(seeds))):
                s = -1 if variant == "trained" else int(variant[-1])
                gap = 0.0 if s < 0 else (gap_a[model] + 0.002 * s if method == "A" else 0.01)
                r = base - gap
                rows.append(
                    {
                        "model": model,
                        "variant": variant,
                        "method": method,
                        "sink": "with",
                        "layer_type": "rope",
                        "mean_r": r,
                        "mean_r_lo": r - half,
                        "mean_r_hi": r + half,
                        "pooled_r": r + 0.03,
                        "pooled_r_lo": r + 0.03 - half,
                        "pooled_r_hi": r + 0.03 + half,
                        "diff_vs_trained": -gap if s >= 0 else np.nan,
                        "diff_lo": -gap - 0.01,
                        "diff_hi": -gap + 0.01,
                        "n_samples": 16,
                        "sweep_spread": 0.06,
                        "sweep_spread_lo": 0.055,
                        "sweep_spread_hi": 0.065,
                        "k_position_share_smooth": 0.05 if s < 0 else 0.6,
                    }
                )
    table = pd.DataFrame(rows)
    # the row-centred r's columns (what the first paper's r claims decide on): the raw numbers, as the tests give them
    for raw, rc in (("mean_r", "mean_rc"), ("pooled_r", "pooled_rc"), ("diff_vs_trained", "diff_rc")):
        table[rc] = table[raw]
    for end in ("_lo", "_hi"):
        table[f"mean_rc{end}"], table[f"pooled_rc{end}"] = table[f"mean_r{end}"], table[f"pooled_r{end}"]
        table[f"diff_rc{end}"] = table[f"diff{end}"]
    return table


def bands(trained: float = 0.7, random=(0.5, 0.52)) -> dict:
    out = {}
    for model in MODELS:
        shares = {"trained": {"low_share_k": trained, "low_share_q": trained - 0.1}}
        shares |= {f"random-seed{s}": {"low_share_k": v, "low_share_q": v} for s, v in enumerate(random)}
        out[model] = shares
    return out


RISING = dict(zip(BY_SIZE, [0.90, 0.92, 0.94, 0.96]))
GAPS = dict(zip(BY_SIZE, [0.13, 0.31, 0.10, 0.12]))


def test_models_come_in_size_order_with_their_gap_over_seeds():
    rows = scale.model_rows(summary(RISING, GAPS), bands())
    assert rows["model"].tolist() == BY_SIZE
    assert rows["parameters"].tolist() == sorted(rows["parameters"])
    smol = rows.iloc[0]
    # gaps 0.130 and 0.132 over two seeds: mean 0.131, t(1) interval 0.131 +/- 12.706 * 0.001414 / sqrt(2)
    half = 12.7062 * np.std([0.13, 0.132], ddof=1) / math.sqrt(2)
    assert smol["a_gap"] == pytest.approx(0.131) and smol["a_gap_hi"] - smol["a_gap"] == pytest.approx(half, rel=1e-3)
    assert smol["b_gap"] == pytest.approx(0.01)
    assert smol["a_mean_r"] == pytest.approx(0.90) and smol["b_pooled_r"] == pytest.approx(0.88)
    assert smol["low_k"] == 0.7 and smol["low_k_random"] == pytest.approx(0.51)
    assert smol["low_k_learned"] == pytest.approx(0.19) and smol["seeds"] == 2 and smol["n_samples"] == 16
    assert smol["k_smooth_share"] == 0.05 and smol["k_smooth_share_random"] == 0.6


def test_an_unknown_model_is_refused_in_one_line():
    table = summary(RISING, GAPS).replace("gemma3-270m", "mystery-7b")
    with pytest.raises(KeyError, match="scale study: no parameter count for model 'mystery-7b'"):
        scale.model_rows(table, {})


def test_end_difference_adds_the_two_half_widths_in_quadrature():
    d, lo, hi = scale.end_difference(np.array([0.9, 0.0, 0.95]), np.array([0.89, 0, 0.93]), np.array([0.91, 0, 0.97]))
    assert d == pytest.approx(0.05)
    assert hi - d == pytest.approx(math.hypot(0.01, 0.02)) and d - lo == pytest.approx(math.hypot(0.01, 0.02))


@pytest.mark.parametrize(
    "values, half, outcome",
    [
        ([0.90, 0.92, 0.94, 0.96], 0.005, scale.RISES),
        ([0.96, 0.94, 0.92, 0.90], 0.005, scale.FALLS),
        ([0.90, 0.92, 0.94, 0.96], 0.05, scale.FLAT),  # monotone, but the end-to-end interval straddles 0
        ([0.90, 0.95, 0.93, 0.96], 0.001, scale.FLAT),  # not monotone (rho 0.8 < 1)
        ([0.90, 0.92, 0.92, 0.96], 0.001, scale.FLAT),  # a tie is not a strict rise
    ],
)
def test_the_registered_trend_rule(values, half, outcome):
    v = np.array(values)
    got, evidence = scale.trend(v, v - half, v + half)
    assert got == outcome, evidence
    assert evidence.startswith("rho ")


def test_no_interval_or_too_few_models_decide_no_trend():
    v = np.array([0.1, 0.2, 0.3, 0.4])
    got, evidence = scale.trend(v, np.full(4, np.nan), np.full(4, np.nan))
    assert got == scale.FLAT and evidence.endswith("(no interval: undecided)")
    got, evidence = scale.trend(v[:2], v[:2] - 0.01, v[:2] + 0.01)
    assert got == scale.FLAT and evidence == "2 model(s) with a value: fewer than three, undecided"


def test_trend_rows_decide_each_quantity_and_the_distance_to_the_paper():
    trends = scale.trend_rows(scale.model_rows(summary(RISING, GAPS), bands())).set_index("quantity")
    assert trends.loc["Method A mean r (trained)", "outcome"] == scale.RISES
    assert trends.loc["Method B pooled r (trained)", "outcome"] == scale.RISES
    assert trends.loc["random-init gap under A", "outcome"] == scale.FLAT  # 0.13, 0.31, 0.10, 0.12
    # |r - 0.959|: 0.059, 0.039, 0.019, 0.001: falls, so r approaches 0.959
    assert trends.loc["Method A mean r toward 0.959", "outcome"] == "approaches 0.959"
    # pooled r 0.93 ... 0.99: the distance is 0.029, 0.009, 0.011, 0.031: not monotone
    assert trends.loc["Method A pooled r toward 0.959", "outcome"] == scale.FLAT


def test_the_table_has_every_model_trend_and_verdict(tmp_path):
    path = tmp_path / "summary.csv"
    summary(RISING, GAPS, seeds=3).to_csv(path, index=False)  # SEEDS_MIN_FIRST: 3 seeds decide
    models, trends, claims = scale.write_scale(
        path, tmp_path / "scale.csv", tmp_path / "scale.md", tmp_path / "trends.csv", bands(), {}, {}
    )
    assert pd.read_csv(tmp_path / "scale.csv")["model"].tolist() == BY_SIZE
    assert len(pd.read_csv(tmp_path / "trends.csv")) == len(trends) == len(scale.TRENDS) + 2
    text = (tmp_path / "scale.md").read_text()
    assert "| smollm2-135m | 135 M (106 M) | instruct, de-quantised Q4_1 | 16 x 3 | 0.900 [0.895, 0.905] |" in text
    assert "| qwen2.5-coder-1.5b | 1.54 B (1.31 B) | code-instruct, de-quantised Q4_K_M |" in text
    assert "not bf16 base models" in text
    assert "| Method A mean r (trained) | **rises with size** |" in text
    # every claim for every model, decided on that model's rows alone: under A each random-init gap (0.10-0.31
    # over three seeds 0.002 apart) exceeds LACK, under B (0.01) none does
    assert len(claims) == 4 * claims["claim"].nunique() and set(claims["model"]) == set(BY_SIZE)
    lacks = claims[claims["claim"] == "learned"].set_index("model")["verdict"]
    assert (lacks == "depends on the construction: reproduced for Method A; not reproduced for Method B").all()
    assert "| random-init models lack the split (it is learned) | depends on the construction: reproduced for" in text


def test_the_figure_draws_from_the_table(tmp_path):
    from posgen.figures.scale import fig_scale

    fig = fig_scale(scale.model_rows(summary(RISING, GAPS), bands()))
    assert len(fig.axes) == 3 and fig.axes[0].get_xscale() == "log"


@pytest.mark.parametrize("model", BY_SIZE)
def test_the_recorded_counts_follow_from_the_recorded_shapes(model):
    """PARAMETERS (the releases' counts, tied embeddings once) and NON_EMBEDDING from posgen.shapes: the
    de-quantised Qwen checkpoints are untied, so their stored count is one vocabulary x width matrix larger."""
    from posgen.shapes import SHAPES, parameter_count, shape_config

    embedding = SHAPES[model]["vocab_size"] * SHAPES[model]["hidden_size"]
    untied = 0 if SHAPES[model]["tie_word_embeddings"] else embedding
    assert parameter_count(shape_config(model)) - untied == scale.PARAMETERS[model]
    assert scale.PARAMETERS[model] - embedding == scale.NON_EMBEDDING[model]
