"""The scale study (README "The scale study", issue 54): the first paper's numbers per model against its size, and
whether each rises or falls with size under rules registered before the study ran (``posgen.verdict_rules`` SCALE_*).

Per model (trained, sink "with", every RoPE layer): Method A and B mean and pooled r with their 95 % bootstrap
intervals over windows, the random-init gap under each (trained minus random-init mean r, t interval over
seeds), the low-frequency share of keys and queries (trained and random-init), the dummy-distance sweep's spread,
the keys' smooth position share, the gap origin's outcome, and every first-paper verdict for that model alone.

A trend (:func:`trend`): the models in size order (SCALE_SIZE); a quantity *rises* when it increases strictly from
each model to the next (Spearman rho = +1: with four models, a one-sided exact p of 1/24) and the largest model's
value less the smallest's has a 95 % interval above 0 (SCALE_DIFF: each model's own interval as a normal one, half
widths added in quadrature: the models' windows are cut by different tokenizers, so independent); *falls* is the
mirror image; anything else is *no monotone trend*. "Toward 0.959" is the same test on |r - 0.959|, falling.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from posgen.claims import t_interval
from posgen.config import VARIANT_TRAINED
from posgen.integrity import made_from
from posgen.llm.gap_origin import model_outcome, origin_table
from posgen.llm.verdicts import PAPER_R, verdicts
from posgen.parts import WEIGHTS_NOTE
from posgen.store import atomic_path
from posgen.verdict_rules import value

SIZE = value("SCALE_SIZE")  # what orders the models
RHO = value("SCALE_RHO")  # |Spearman rho| a trend needs
DIFF = value("SCALE_DIFF")  # how the end-to-end difference's interval is formed
SINK = value("SINK")
Z95 = 1.959964  # a normal 95 % interval's half width in standard errors

# Published total parameter counts (tied embeddings counted once), from each release's config: the GGUF-derived
# Qwen checkpoints store the output matrix separately (630 M / 1.78 B stored), which is not the model's size.
PARAMETERS = {
    "smollm2-135m": 134_515_008,
    "gemma3-270m": 268_098_176,
    "qwen2.5-coder-0.5b": 494_032_768,
    "qwen2.5-coder-1.5b": 1_543_714_304,
}
# the same without the input embedding (vocabulary x width): the usual scaling-law count, reported, not deciding
NON_EMBEDDING = {
    "smollm2-135m": 106_203_456,
    "gemma3-270m": 100_326_016,
    "qwen2.5-coder-0.5b": 357_898_112,
    "qwen2.5-coder-1.5b": 1_310_340_608,
}
METHODS = ("A", "B")
RISES, FALLS, FLAT = "rises with size", "falls with size", "no monotone trend"


def size_of(model: str) -> int:
    """The parameter count that orders ``model`` (SCALE_SIZE); unknown models stop in one line."""
    if model not in PARAMETERS:
        raise KeyError(f"scale study: no parameter count for model {model!r} (have {', '.join(PARAMETERS)})")
    return PARAMETERS[model]


def _rope(summary: pd.DataFrame) -> pd.DataFrame:
    rows = summary[summary["sink"] == SINK]
    return rows[rows["layer_type"] == "rope"] if "layer_type" in rows.columns else rows


def _half(lo: float, hi: float) -> float:
    return (hi - lo) / 2 if np.isfinite(lo) and np.isfinite(hi) else np.nan


def model_rows(summary: pd.DataFrame, bands: dict) -> pd.DataFrame:
    """One row per model, in size order: the numbers of the module docstring, each with its interval (``_lo``,
    ``_hi``). ``bands``: {model: {variant: {"low_share_q": .., "low_share_k": ..}}}."""
    rows = _rope(summary)
    origins = origin_table(summary)
    out = []
    for model in sorted(rows["model"].unique(), key=size_of):
        mine = rows[rows["model"] == model]
        trained = mine[mine["variant"] == VARIANT_TRAINED].set_index("method")
        random = mine[mine["variant"].str.startswith("random-seed")]
        row = {
            "model": model,
            "parameters": size_of(model),
            "non_embedding": NON_EMBEDDING.get(model, np.nan),
            "weights": WEIGHTS_NOTE.get(model, ""),
            "n_samples": int(trained["n_samples"].iloc[0]) if len(trained) else 0,
            "seeds": int(random["variant"].nunique()),
        }
        for method in METHODS:
            m = method.lower()
            for stat in ("mean_r", "pooled_r", "mean_rc", "pooled_rc"):  # raw, then row-centred
                for end in ("", "_lo", "_hi"):
                    column = f"{stat}{end}"
                    has = method in trained.index and column in trained.columns
                    row[f"{m}_{stat}{end}"] = float(trained.loc[method, column]) if has else np.nan
            for gap, column in (("gap", "diff_vs_trained"), ("gap_rc", "diff_rc")):
                if column not in random.columns:
                    row[f"{m}_{gap}"] = row[f"{m}_{gap}_lo"] = row[f"{m}_{gap}_hi"] = np.nan
                    continue
                gaps = -random[random["method"] == method][column].to_numpy(dtype=float)
                row[f"{m}_{gap}"], row[f"{m}_{gap}_lo"], row[f"{m}_{gap}_hi"] = t_interval(gaps)
        if "A" in trained.index:
            a = trained.loc["A"]
            for end in ("", "_lo", "_hi"):
                row[f"sweep_spread{end}"] = float(a[f"sweep_spread{end}"])
            row["k_smooth_share"] = float(a.get("k_position_share_smooth", np.nan))
        rand_a = random[random["method"] == "A"]
        row["k_smooth_share_random"] = float(rand_a["k_position_share_smooth"].mean()) if len(rand_a) else np.nan
        shares = bands.get(model, {})
        for side in ("k", "q"):
            column = f"low_share_{side}"
            row[f"low_{side}"] = shares.get(VARIANT_TRAINED, {}).get(column, np.nan)
            seeds = [v[column] for variant, v in shares.items() if variant.startswith("random-seed")]
            row[f"low_{side}_random"] = float(np.mean(seeds)) if seeds else np.nan
            learned = [row[f"low_{side}"] - s for s in seeds]
            row[f"low_{side}_learned"], row[f"low_{side}_learned_lo"], row[f"low_{side}_learned_hi"] = t_interval(
                learned
            )
        row["gap_origin"] = model_outcome(origins, model) if len(origins) else "not tested"
        out.append(row)
    return pd.DataFrame(out)


def spearman(values) -> float:
    """Spearman's rho of ``values`` against their order (ties get mean ranks); NaN with fewer than 3 finite."""
    v = np.asarray(values, dtype=float)
    if np.count_nonzero(np.isfinite(v)) < 3 or not np.isfinite(v).all():
        return np.nan
    ranks = pd.Series(v).rank().to_numpy()
    order = np.arange(1, len(v) + 1, dtype=float)
    if ranks.std() == 0:
        return 0.0
    return float(np.corrcoef(order, ranks)[0, 1])


def end_difference(values, lo, hi) -> tuple[float, float, float]:
    """The last value less the first, with its 95 % interval by SCALE_DIFF (NaN bounds where either lacks one)."""
    d = float(values[-1] - values[0])
    se = math.hypot(_half(lo[0], hi[0]), _half(lo[-1], hi[-1])) / Z95
    return d, d - Z95 * se, d + Z95 * se


def trend(values, lo, hi) -> tuple[str, str]:
    """(outcome, evidence) of one quantity over the models in size order (module docstring). ``lo``/``hi``: each
    model's 95 % interval (NaN where it has none: then no trend can be decided)."""
    values, lo, hi = (np.asarray(x, dtype=float) for x in (values, lo, hi))
    rho = spearman(values)
    d, d_lo, d_hi = end_difference(values, lo, hi)
    text = f"rho {rho:+.2f}; largest - smallest {d:+.3f} [{d_lo:+.3f}, {d_hi:+.3f}]"
    if not np.isfinite(rho):
        return FLAT, f"{np.count_nonzero(np.isfinite(values))} model(s) with a value: fewer than three, undecided"
    if not (np.isfinite(d_lo) and np.isfinite(d_hi)):
        return FLAT, text + " (no interval: undecided)"
    if rho >= RHO and d_lo > 0:
        return RISES, text
    if rho <= -RHO and d_hi < 0:
        return FALLS, text
    return FLAT, text


# the quantities whose trend is decided: (name, column stem; its interval columns are <stem>_lo / <stem>_hi)
TRENDS = [
    ("Method A mean r (trained)", "a_mean_r"),
    ("Method A pooled r (trained)", "a_pooled_r"),
    ("Method B mean r (trained)", "b_mean_r"),
    ("Method B pooled r (trained)", "b_pooled_r"),
    ("Method A row-centred mean r (trained)", "a_mean_rc"),
    ("Method A row-centred pooled r (trained)", "a_pooled_rc"),
    ("Method B row-centred mean r (trained)", "b_mean_rc"),
    ("Method B row-centred pooled r (trained)", "b_pooled_rc"),
    ("random-init gap under A", "a_gap"),
    ("random-init gap under B", "b_gap"),
    ("random-init gap under A, row-centred", "a_gap_rc"),
    ("keys' low-frequency share, trained - random", "low_k_learned"),
    ("queries' low-frequency share, trained - random", "low_q_learned"),
    ("D sweep spread (Method A)", "sweep_spread"),
]


def trend_rows(models: pd.DataFrame) -> pd.DataFrame:
    """One row per quantity of :data:`TRENDS`, plus "toward 0.959" for Method A's mean and pooled r."""
    out = []
    for name, stem in TRENDS:
        cols = [stem, f"{stem}_lo", f"{stem}_hi"]
        if not set(cols) <= set(models.columns):
            continue
        outcome, evidence = trend(*(models[c].to_numpy(dtype=float) for c in cols))
        out.append({"quantity": name, "outcome": outcome, "evidence": evidence})
    for stat in ("mean_r", "pooled_r"):
        v, lo, hi = (models[f"a_{stat}{end}"].to_numpy(dtype=float) for end in ("", "_lo", "_hi"))
        dist = np.abs(v - PAPER_R)
        outcome, evidence = trend(-dist, -dist - (v - lo), -dist + (hi - v))
        toward = {RISES: "approaches 0.959", FALLS: "moves away from 0.959"}.get(outcome, FLAT)
        name = f"Method A {stat.replace('_r', '')} r toward {PAPER_R}"
        out.append({"quantity": name, "outcome": toward, "evidence": f"minus |r - {PAPER_R}|: {evidence}"})
    return pd.DataFrame(out)


def verdict_rows(summary: pd.DataFrame, bands: dict, perturb: dict, caps: dict) -> pd.DataFrame:
    """Every first-paper claim's verdict for each model alone (posgen.llm.verdicts on its rows only)."""
    out = []
    for model in sorted(summary["model"].unique(), key=size_of):
        mine = summary[summary["model"] == model]
        for claim, verdict, _ in verdicts(
            mine, {model: bands.get(model, {})}, {model: perturb.get(model, {})}, {model: caps.get(model, {})}
        ):
            out.append({"model": model, "claim": claim.name, "paper": claim.paper, "verdict": verdict})
    return pd.DataFrame(out)


def _millions(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.0f} M"


def _ci(row, stem: str, fmt: str = ".3f") -> str:
    v, lo, hi = row[stem], row[f"{stem}_lo"], row[f"{stem}_hi"]
    if not np.isfinite(v):
        return "-"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{v:{fmt}}"
    return f"{v:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def scale_markdown(models: pd.DataFrame, trends: pd.DataFrame, claims: pd.DataFrame, provenance: str = "") -> str:
    """The study's table: per model, the trends, and every verdict per model."""
    lines = [
        "# The scale study",
        "",
        f"Models in size order ({SIZE}); sink '{SINK}', every RoPE layer; intervals: 95 % bootstrap over windows "
        "(r, spread), t over random-init seeds (gaps, low-frequency share learned). The Qwen2.5-Coder models are "
        "code-specialised instruct fine-tunes de-quantised from 4-bit (Q4_K_M) weights, not bf16 base models. "
        + provenance,
        "",
        "| model | parameters (non-embedding) | weights | windows x seeds | A mean r | A pooled r | B mean r "
        "| B pooled r | A row-centred mean / pooled r | B row-centred mean / pooled r | gap under A | gap under B | "
        "low-freq. share k / q (trained; random) | k: trained - random | D sweep spread | k smooth share (trained; "
        "random) | gap origin |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in models.iterrows():
        lines.append(
            f"| {r['model']} | {_millions(r['parameters'])} ({_millions(r['non_embedding'])}) | {r['weights']} | "
            f"{r['n_samples']} x {r['seeds']} | {_ci(r, 'a_mean_r')} | {_ci(r, 'a_pooled_r')} | "
            f"{_ci(r, 'b_mean_r')} | {_ci(r, 'b_pooled_r')} | {_ci(r, 'a_mean_rc')} / {_ci(r, 'a_pooled_rc')} | "
            f"{_ci(r, 'b_mean_rc')} / {_ci(r, 'b_pooled_rc')} | {_ci(r, 'a_gap', '+.3f')} | "
            f"{_ci(r, 'b_gap', '+.3f')} | {r['low_k']:.3f} / {r['low_q']:.3f}; {r['low_k_random']:.3f} / "
            f"{r['low_q_random']:.3f} | {_ci(r, 'low_k_learned', '+.3f')} | {_ci(r, 'sweep_spread')} | "
            f"{r['k_smooth_share']:.3f}; {r['k_smooth_share_random']:.3f} | {r['gap_origin']} |"
        )
    lines += [
        "",
        f"## Trends with size (rules: SCALE_RHO {RHO}, SCALE_DIFF {DIFF})",
        "",
        "| quantity | outcome | evidence |",
        "|---|---|---|",
    ]
    lines += [f"| {r.quantity} | **{r.outcome}** | {r.evidence} |" for r in trends.itertuples()]
    if len(claims):
        table = claims.pivot(index="claim", columns="model", values="verdict")[list(models["model"])]
        order = list(dict.fromkeys(claims["claim"]))
        lines += ["", "## Every first-paper verdict per model", "", "| claim | " + " | ".join(table.columns) + " |"]
        lines.append("|---|" + "---|" * len(table.columns))
        papers = dict(zip(claims["claim"], claims["paper"]))
        lines += [f"| {papers[c]} | " + " | ".join(table.loc[c]) + " |" for c in order]
    return "\n".join(lines) + "\n"


def write_scale(summary_csv, csv, md, trends_csv, bands: dict, perturb: dict, caps: dict, provenance: str = ""):
    """results/scale.csv (per model), results/scale_trends.csv and results/scale.md."""
    summary = pd.read_csv(summary_csv)
    models = model_rows(summary, bands)
    trends = trend_rows(models)
    claims = verdict_rows(summary, bands, perturb, caps)
    with made_from([summary_csv]), atomic_path(csv) as tmp:
        models.to_csv(tmp, index=False, float_format="%.6g")
    with made_from([summary_csv]), atomic_path(trends_csv) as tmp:
        trends.to_csv(tmp, index=False)
    with atomic_path(md) as tmp:
        Path(tmp).write_text(scale_markdown(models, trends, claims, provenance))
    return models, trends, claims


def scale_step(job) -> None:
    """Rule scale_table's job (a :class:`posgen.workflow.job.StepJob`)."""
    from posgen.llm.readers import claim_tables

    i, o = job.input, job.output
    config_hash = job.params["config_hash"]
    write_scale(
        i["summary"], o["csv"], o["md"], o["trends"], *claim_tables(i), provenance=f"config_hash {config_hash}."
    )
