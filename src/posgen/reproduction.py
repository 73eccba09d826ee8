"""Both papers' reproduction tables: their reported numbers beside ours.

The first paper (Han & Ji 2025): its 0.959 beside our mean and pooled r per model, variant, method and sink
(:func:`reproduction_table`, from ``results/summary.csv``), with a verdict per claim (posgen.llm.verdicts, from the
summary, the bands and the perturbation tables). The second paper (arXiv 2505.13027): its accuracies
and layer-0 deposit beside ours per experiment, task and PE (:func:`synthetic_reproduction_rows`, from
``results/synthetic/summary.csv``), with a verdict per claim (posgen.synthetic.verdicts).
:func:`write_reproduction` writes ``results/reproduction.csv``, ``reproduction_synthetic.csv`` and ``.md``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from posgen.config import VARIANT_TRAINED, init_seed
from posgen.integrity import made_from, shown
from posgen.llm.bands import band_shares
from posgen.llm.gap_origin import origin_markdown
from posgen.llm.readers import by_model_variant, cap_effects, perturbation_ratios
from posgen.llm.verdicts import PAPER_R, control_markdown, summary_regime, window_seeds
from posgen.llm.verdicts import verdict_markdown as paper_verdict_markdown
from posgen.llm.verdicts import verdict_table as paper_verdict_table
from posgen.llm.verdicts import verdicts as paper_verdicts
from posgen.parquet import write_table
from posgen.parts import WEIGHTS_NOTE
from posgen.store import atomic_path, open_dataset, stable_provenance
from posgen.synthetic.regime import size_and_budget
from posgen.synthetic.verdicts import verdicts, verdicts_markdown
from posgen.workflow.job import listed, resolve
from posgen.workflow.steps import STEPS

# Reported numbers of arXiv 2505.13027 (secondary notes, docs in /shared/notes/deconstructing-pe.md section 5):
# test accuracy in percent; None where only a qualitative statement is known.
PAPER_ACCURACY = {
    ("distance", "rope+sinusoidal"): (92.64, "best"),
    ("count", "rope+sinusoidal"): (69.43, ""),
    ("distance", "decoupled"): (88.34, ""),
    ("count", "decoupled"): (97.41, "best"),
    ("distance", "sinusoidal"): (None, "second best"),
    ("count", "sinusoidal"): (None, "moderate"),
    ("distance", "alibi"): (None, "fails"),
    ("count", "alibi"): (None, "worst"),
    ("distance", "nope"): (None, "fails"),
    ("count", "nope"): (77.69, ""),
}
PAPER_DEPOSIT = {  # (task, pe): layer-0 largest single-head drop in points, as reported
    ("distance", "rope+sinusoidal"): (60.0, "one layer-0 head, about 60 points; others barely matter"),
    ("distance", "nope"): (None, "absent"),
    ("count", "rope+sinusoidal"): (None, "absent"),
}


# ------------------------------------------------------------------------------------------ the first paper


TABLE_KEYS = ["model", "variant", "method", "sink"]
TYPE_ORDER = {"rope": 0, "global": 1, "sliding": 2, "nope": 3}  # summary.csv's layer_type values


def _distance_cell(value) -> str:
    """A dummy-distance cell of summary.csv as text: '1000', '511/1000' (several), '' (Method B, or none)."""
    if isinstance(value, str):
        return value
    if value is None or not np.isfinite(value):
        return ""
    return str(int(value))


def reproduction_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The paper's 0.959 beside our mean-over-heads and pooled r (95 % intervals) per model/variant/method/sink.

    With summary.csv's ``layer_type`` column: a model with several layer types gets one row per layer type
    (global, sliding, nope) instead of the row over every RoPE layer, and ``dummy_distance`` says which D
    Method A used on those layers.
    """
    cols = TABLE_KEYS + ["mean_r", "mean_r_lo", "mean_r_hi", "pooled_r", "pooled_r_lo", "pooled_r_hi"]
    missing = [c for c in cols if c not in summary.columns]
    if missing:
        raise KeyError(f"summary.csv: missing column(s) {', '.join(missing)}")
    typed = "layer_type" in summary.columns
    rc = [f"{n}{e}" for n in ("mean_rc", "pooled_rc") for e in ("", "_lo", "_hi")]  # the row-centred r's
    extra = [c for c in ("n_samples", "layer_type", "dummy_distance", *rc) if c in summary.columns]
    table = summary[cols + extra].copy()
    table.insert(len(TABLE_KEYS), "paper_r", PAPER_R)
    table["mean_r_minus_paper"] = table["mean_r"] - PAPER_R
    table["pooled_r_minus_paper"] = table["pooled_r"] - PAPER_R
    sort = ["model", "_order", "method", "sink"]
    if typed:
        # several layer types: their own rows replace the one over every RoPE layer
        split = table.groupby(["model", "variant"])["layer_type"].transform(lambda t: (t != "rope").any())
        table = table[~(split & (table["layer_type"] == "rope"))].copy()
        table["_type"] = table["layer_type"].map(TYPE_ORDER)
        sort = ["model", "_order", "_type", "method", "sink"]
    if "dummy_distance" in table.columns:
        table["dummy_distance"] = [_distance_cell(v) for v in table["dummy_distance"]]
    # trained first, then seeds in numeric order; layer types as in TYPE_ORDER; methods and sinks alphabetically
    order = table["variant"].map(init_seed)  # trained is -1
    table = table.assign(_order=order).sort_values(sort, kind="stable")
    return table.drop(columns=[c for c in ("_order", "_type") if c in table.columns]).reset_index(drop=True)


def reproduction_markdown(table: pd.DataFrame, provenance: dict | None = None) -> str:
    """A Markdown rendering of :func:`reproduction_table` with 'value [lo, hi]' cells."""

    def cell(row, stat):
        return f"{row[stat]:.3f} [{row[stat + '_lo']:.3f}, {row[stat + '_hi']:.3f}]"

    def rc_cell(row, stat):  # a summary from before the row-centred r: '-'
        value = row.get(stat, np.nan)
        return cell(row, stat) if isinstance(value, float) and np.isfinite(value) else "-"

    typed = "layer_type" in table.columns
    lines = [
        "# Reproduction of the 0.959 correlation (Han & Ji 2025)",
        "",
        "Pearson r between the true attention logits W and the approximation; 95 % bootstrap intervals "
        "over samples in brackets. 'mean r' averages per-(sample, layer, head) r over heads; 'pooled r' "
        "correlates all scored entries of all heads at once. Method A: mean-key f + g at the default "
        "dummy distance; Method B: least-squares a(i-j) + b(i) + c(j). Sink 'without' drops key column 0. "
        "'row-centred': the same after centring each query row of W and of the approximation over its scored keys "
        "(softmax ignores a row's constant, so this is the r attention sees, and the one the verdicts below decide "
        "on: posgen.verdict_rules R_STATISTIC); the raw r is the paper-comparable number, its pooled value dominated by "
        "each head's mean offset (docs/method.md section 4).",
    ]
    if typed:
        lines[-1] += (
            " 'layers': the layers a row covers: 'rope' every RoPE layer (global and sliding-window), or one "
            "layer type of a model with several: 'global', 'sliding' (sliding-window), 'nope' (no rotation; "
            "never part of the 'rope' rows). 'D': the dummy distance Method A used on those layers, min(D, "
            "window - 1) on a sliding-window layer, which never sees a longer distance."
        )
    header = (
        "| model | variant | method | sink | paper r | mean r [95 % CI] | pooled r [95 % CI] | mean r - paper "
        "| pooled r - paper | row-centred mean r | row-centred pooled r |"
    )
    rule = "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    if typed:
        header += " layers | D |"
        rule += "---|---:|"
    lines += ["", header, rule]
    for _, row in table.iterrows():
        line = (
            f"| {row['model']} | {row['variant']} | {row['method']} | {row['sink']} | {row['paper_r']:.3f} | "
            f"{cell(row, 'mean_r')} | {cell(row, 'pooled_r')} | {row['mean_r_minus_paper']:+.3f} | "
            f"{row['pooled_r_minus_paper']:+.3f} | {rc_cell(row, 'mean_rc')} | {rc_cell(row, 'pooled_rc')} |"
        )
        if typed:
            line += f" {row['layer_type']} | {row.get('dummy_distance', '')} |"
        lines.append(line)
    formats = [f"{m}: {WEIGHTS_NOTE[m]}" for m in dict.fromkeys(table["model"]) if m in WEIGHTS_NOTE]
    if formats:  # every "trained" number of an embedded model comes from de-quantised 4-bit weights
        lines += [
            "",
            "Weights: " + "; ".join(formats) + ". The 4-bit rounding moves the numbers the verdicts read on "
            'SmolLM2 by at most 0.0025 (within QUANT_R / QUANT_LOW: docs/results.md, "The 4-bit weights").',
        ]
    if provenance:
        lines += ["", "Provenance: " + ", ".join(f"{k}={v}" for k, v in sorted(provenance.items()))]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- the second paper


BASELINES = ("majority", "length", "bag", "bayes")  # summary.csv's baseline_<name> columns, in the table's order


def synthetic_reproduction_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The second paper's reported numbers beside ours, one row per (experiment, task, pe) of ``summary.csv``,
    with the position-free baselines of the task."""
    rows = []
    for index, row in summary.iterrows():
        key = (row["task"], row["pe"])
        paper_acc, paper_note = PAPER_ACCURACY.get(key, (None, ""))
        paper_drop, drop_note = PAPER_DEPOSIT.get(key, (None, ""))
        rows.append(
            {
                "experiment": row["experiment"],
                "task": row["task"],
                "pe": row["pe"],
                "paper_accuracy": np.nan if paper_acc is None else paper_acc,
                "paper_note": paper_note,
                "accuracy": 100 * row["test_accuracy"],
                "accuracy_lo": 100 * row["test_accuracy_lo"],
                "accuracy_hi": 100 * row["test_accuracy_hi"],
                "accuracy_label0_masked": 100 * row["test_accuracy_label0_masked"],
                "mae": row["test_mae"],
                "within_one": 100 * row["test_within_one"],
                **{f"baseline_{b}": 100 * row[f"baseline_{b}"] for b in BASELINES},
                "n_seeds": row["n_seeds"],
                "converged_seeds": row["converged_seeds"],
                "regime": size_and_budget(summary.loc[[index]]),
                "paper_layer0_max_drop": np.nan if paper_drop is None else paper_drop,
                "paper_deposit_note": drop_note,
                "layer0_top_drop": 100 * row["layer0_top_drop"],
                "layer0_second_drop": 100 * row["layer0_second_drop"],
                "layer0_deposit_index": row["layer0_deposit_index"],
            }
        )
    return pd.DataFrame(rows)


def _num(value, fmt="{:.1f}"):
    return "-" if not np.isfinite(value) else fmt.format(value)


def _paper(value, note) -> str:
    return " ".join(x for x in [_num(value) if np.isfinite(value) else "", note] if x) or "-"


def synthetic_reproduction_markdown(rows: pd.DataFrame) -> str:
    """Markdown of :func:`synthetic_reproduction_rows` (accuracies and drops in percentage points)."""
    lines = [
        "# Reproduction of arXiv 2505.13027 (positional encodings on synthetic tasks)",
        "",
        "Test accuracy (%), mean absolute error (label units) and within-one accuracy (%), beside the task's "
        "position-free baselines (majority class, best length-only rule, best trigger-count rule, and the exact "
        "Bayes accuracy of a position-free classifier, its ceiling; docs/method.md section 8.2), and the layer-0 "
        "single-head ablation (top and second drop in points; deposit index = top / sum of positive drops, '-' "
        "when the top drop is under 5 points). 'conv.': seeds that fit their training data and whose held-out "
        "accuracy had stopped rising while the learning rate was high (the gate, docs/method.md section 8.3). Paper "
        "numbers from secondary notes, at 6x16, width 256, 13,700 steps, lr 1e-4, distance <= 71; their 'rope' "
        "is our rope+sinusoidal; our decoupled is the MLA-style PE on our backbone, not their MLA model. 'w/o 0': "
        "the accuracy over samples whose label is not 0, what the authors' evaluation reports (it differs on the "
        "count task only). Intervals: 95 % t over seeds.",
        "",
        "| experiment | task | PE | regime | paper acc. | ours acc. [95 % CI] | w/o 0 | conv. | MAE | within 1 | "
        "majority / length / bag / Bayes | paper layer-0 drop | ours top / second drop | deposit idx |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for _, r in rows.iterrows():
        ci = f" [{_num(r['accuracy_lo'])}, {_num(r['accuracy_hi'])}]" if np.isfinite(r["accuracy_lo"]) else ""
        base = " / ".join(_num(r[f"baseline_{b}"]) for b in BASELINES)
        conv = f"{int(r['converged_seeds'])}/{int(r['n_seeds'])}"
        lines.append(
            f"| {r['experiment']} | {r['task']} | {r['pe']} | {r['regime']} | "
            f"{_paper(r['paper_accuracy'], r['paper_note'])} | {_num(r['accuracy'])}{ci} | "
            f"{_num(r['accuracy_label0_masked'])} | {conv} | "
            f"{_num(r['mae'], '{:.2f}')} | {_num(r['within_one'])} | {base} | "
            f"{_paper(r['paper_layer0_max_drop'], r['paper_deposit_note'])} | "
            f"{_num(r['layer0_top_drop'])} / {_num(r['layer0_second_drop'])} | "
            f"{_num(r['layer0_deposit_index'], '{:.2f}')} |"
        )
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------- writing


def windows_in_words(path) -> str:
    """A perturb.nc's or cap.nc's windows in words: "<samples> windows x <tokens> tokens"."""
    ds = open_dataset(path, lazy=False)
    tokens = ds.sizes["token"] if "token" in ds.sizes else ds.attrs["n_tokens"]  # perturb.nc / cap.nc
    text = f"{ds.sizes['sample']} windows x {tokens} tokens"
    ds.close()
    return text


def _file_regimes(paths) -> dict[str, str]:
    """{model: its trained model's windows in words} over perturb.nc / cap.nc files, the regime the claims read."""
    by_model = by_model_variant(paths, windows_in_words)
    return {model: by[VARIANT_TRAINED] for model, by in by_model.items() if VARIANT_TRAINED in by}


def write_reproduction(
    summary_csv: str | Path,
    csv: str | Path,
    md: str | Path,
    synthetic_summary_csv: str | Path | None = None,
    synthetic_csv: str | Path | None = None,
    study_summary_csv: str | Path | None = None,
    synthetic_classifiers_csv: str | Path | None = None,
    study_classifiers_csv: str | Path | None = None,
    bands_paths=(),
    perturb_paths=(),
    cap_paths=(),
    sections=(),
    verdicts_csv: str | Path | None = None,
    verdicts_table: str | Path | None = None,
    **attrs,
) -> pd.DataFrame:
    """results/reproduction.csv and .md from results/summary.csv, with a verdict per claim of the first paper
    (posgen.llm.verdicts) from the summary and the bands and perturbation tables of every model variant; with the
    second family's summary, its rows (the second paper's numbers beside ours) go to ``synthetic_csv`` and a
    second section of the Markdown, with a verdict per claim (posgen.synthetic.verdicts) from the deposit study's
    per-classifier table when given, else from the run's. ``sections``: the statistics' own sections (Markdown,
    posgen.workflow.steps: a step's ``section``), after the gap origin's. ``verdicts_csv``, ``verdicts_table``: both
    papers' verdicts as one table (results/verdicts.csv, and the digested verdicts.parquet the readers read), from
    which their sections of the Markdown are rendered."""
    optional = (synthetic_summary_csv, study_summary_csv, synthetic_classifiers_csv, study_classifiers_csv)
    paths = [Path(p) for p in (summary_csv, *optional) if p is not None]
    inputs = (bands_paths, perturb_paths, cap_paths)
    for path in [*paths, *(Path(p) for group in inputs for p in group)]:
        if not path.exists():
            raise FileNotFoundError(f"{shown(path)}: no such file")
    summary = pd.read_csv(summary_csv)
    table = reproduction_table(summary)
    prov = stable_provenance(**attrs)
    keep = {k: prov[k] for k in ("config_hash", "posgen_version") if k in prov}
    with made_from([summary_csv]), atomic_path(csv) as tmp:
        table.assign(**keep).to_csv(tmp, index=False, float_format="%.6g")
    text = reproduction_markdown(table, provenance=keep)
    bands = by_model_variant(bands_paths, band_shares)
    ratios = by_model_variant(perturb_paths, perturbation_ratios)
    caps = by_model_variant(cap_paths, cap_effects)
    text += "\n" + control_markdown(summary)
    text += "\n" + origin_markdown(summary)
    for section in sections:
        text += "\n" + section
    regimes = {
        "summary": summary_regime(summary),
        "perturb": _file_regimes(perturb_paths),
        "caps": _file_regimes(cap_paths),
    }
    results = paper_verdicts(summary, bands, ratios, caps)
    first = paper_verdict_table(results, str(summary_csv), regimes, window_seeds(summary))
    text += "\n" + paper_verdict_markdown(first)
    tables = [first]
    if synthetic_summary_csv is not None:
        summaries = [pd.read_csv(p) for p in (synthetic_summary_csv, study_summary_csv) if p is not None]
        rows = synthetic_reproduction_rows(pd.concat(summaries, ignore_index=True))
        with made_from([synthetic_summary_csv, study_summary_csv]), atomic_path(synthetic_csv) as tmp:
            rows.assign(**keep).to_csv(tmp, index=False, float_format="%.6g")
        text += "\n" + synthetic_reproduction_markdown(rows)
        source = study_classifiers_csv or synthetic_classifiers_csv
        if source is not None:
            classifiers = pd.read_csv(source)
            tables.append(verdicts(classifiers, str(source)))
            text += "\n" + verdicts_markdown(tables[-1], classifiers)
    if (
        verdicts_csv is not None and verdicts_table is not None
    ):  # both papers' verdicts as one table (posgen.claims.VERDICT_COLUMNS)
        both = pd.concat(tables, ignore_index=True).assign(**keep)
        with atomic_path(verdicts_csv) as tmp:
            both.to_csv(tmp, index=False)
        write_table(both, verdicts_table, **keep)
    with atomic_path(md) as tmp:
        Path(tmp).write_text(text)
    return table


def reproduction_step(job) -> None:
    """Rule reproduction's job (a :class:`posgen.workflow.job.StepJob`); the deposit study's summary and
    per-classifier table where a run has built them."""
    i, o = job.input, job.output
    study = listed(i.get("study_summary", []))
    write_reproduction(
        i["summary"],
        o["csv"],
        o["md"],
        i["synthetic_summary"],
        o["synthetic_csv"],
        study_summary_csv=study[0] if study else None,
        synthetic_classifiers_csv=i["synthetic_classifiers"],
        study_classifiers_csv=study[1] if study else None,
        bands_paths=listed(i["bands"]),
        perturb_paths=listed(i["perturb"]),
        cap_paths=listed(i["cap"]),
        sections=[resolve(step.section)(listed(i[name])) for name, step in STEPS.items() if step.section and name in i],
        verdicts_csv=o["verdicts"],
        verdicts_table=o["verdicts_table"],
        config_hash=job.params["config_hash"],
    )
