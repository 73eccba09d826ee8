"""A verdict per claim of the first paper (Han & Ji 2025) from a run's summary, bands and perturbation tables.

Every claim is tested per model (and per construction of the split where it depends on one: the paper's
Method A and B, docs/method.md sections 3A-3B) against a threshold fixed here, in advance, and printed beside
the verdict. Method A-drift (section 3C) is a diagnostic (``DIAGNOSTICS``): its findings are shown, labelled, and
never count toward a verdict; the thresholds are never tuned to a result. Across models and constructions a claim

* ``holds``: in every model and construction that tests it;
* ``holds only under <constructions>`` / ``holds only for <models>``: in some;
* ``does not hold at this size``: in none;
* ``not tested``: no input tests it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from posgen.config import VARIANT_TRAINED

PAPER_R = 0.959  # Han & Ji 2025: Pearson r between true logits and f + g
CONSTRUCTIONS = ("A", "B")  # the paper's constructions of f + g: only these decide a verdict
# diagnostics shown beside them, never counted: what each can and cannot show
DIAGNOSTICS = {
    "A-drift": "a mean key that follows each window's own smooth key trajectory (docs/method.md section 3C): how "
    "much of Method A's random-init gap a per-window drift closes. Its f depends on absolute position j, so it "
    "is not the paper's positional term f(q, i - j), and a per-window fit cannot tell absolute position from "
    "prefix content",
    "A-shared": "Method A-drift with a mean key that follows a function of absolute position shared by every "
    "window, estimated from held-out windows (docs/method.md section 3C): how much of Method A's random-init gap "
    "absolute position closes, as against a window's own prefix content. Its f also depends on absolute position j",
}
SINK = "with"  # every causal entry, as the paper's correlation
NEAR = 0.05  # "r near 0.959": mean and pooled r both within 0.05 of it
LACK = 0.05  # "random-init models lack the split": mean r below the trained model's by more than 0.05 (CI < 0)
LEARNED = 0.10  # "the pattern is learned": key token variance in the low-frequency half 10 points above random init
MINIMAL = 1.10  # "minimal effect" of a 5 % perturbation: perplexity at most 1.10 x unperturbed
CLEAR = 1.20  # "degrades clearly" at 20 %: perplexity at least 1.20 x unperturbed
RATES = (0.05, 0.2)  # the rates of the perturbation claim


@dataclass(frozen=True)
class Finding:
    """One (model, construction) test of a claim: whether it held and the numbers behind it."""

    model: str
    construction: str  # "" where the claim does not depend on the construction
    held: bool
    evidence: str
    diagnostic: bool = False  # a diagnostic's finding (DIAGNOSTICS): shown, never counted


def _rope_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The rows over every RoPE layer, sink ``SINK``."""
    rows = summary[summary["sink"] == SINK]
    return rows[rows["layer_type"] == "rope"] if "layer_type" in rows.columns else rows


def r_near_paper(summary: pd.DataFrame, bands: dict, perturb: dict) -> list[Finding]:
    rows = _rope_rows(summary)
    out = []
    for _, row in rows[rows["variant"] == VARIANT_TRAINED].iterrows():
        if row["method"] not in (*CONSTRUCTIONS, *DIAGNOSTICS):
            continue
        held = abs(row["mean_r"] - PAPER_R) <= NEAR and abs(row["pooled_r"] - PAPER_R) <= NEAR
        evidence = f"mean {row['mean_r']:.3f}, pooled {row['pooled_r']:.3f}"
        out.append(Finding(row["model"], row["method"], bool(held), evidence, row["method"] in DIAGNOSTICS))
    return out


def random_init_lacks_split(summary: pd.DataFrame, bands: dict, perturb: dict) -> list[Finding]:
    rows = _rope_rows(summary)
    out = []
    for (model, method), group in rows.groupby(["model", "method"], sort=False):
        if method not in (*CONSTRUCTIONS, *DIAGNOSTICS):
            continue
        trained = group[group["variant"] == VARIANT_TRAINED]
        random = group[group["variant"].str.startswith("random-seed")]
        if trained.empty or random.empty:
            continue
        held = bool(((random["diff_vs_trained"] < -LACK) & (random["diff_hi"] < 0)).all())
        diffs = ", ".join(
            f"{r.variant} {r.mean_r:.3f} (diff {r.diff_vs_trained:+.3f} [{r.diff_lo:+.3f}, {r.diff_hi:+.3f}])"
            for r in random.itertuples()
        )
        evidence = f"trained {trained['mean_r'].iloc[0]:.3f}; {diffs}"
        out.append(Finding(model, method, held, evidence, method in DIAGNOSTICS))
    return out


def low_frequency_pattern_learned(summary: pd.DataFrame, bands: dict, perturb: dict) -> list[Finding]:
    out = []
    for model, by_variant in bands.items():
        if VARIANT_TRAINED not in by_variant:
            continue
        trained = by_variant[VARIANT_TRAINED]
        random = {v: s for v, s in by_variant.items() if v.startswith("random-seed")}
        if not random:
            continue
        held = all(trained["low_share_k"] - s["low_share_k"] >= LEARNED for s in random.values())
        evidence = (
            f"keys: trained {trained['low_share_k']:.2f}, "
            + ", ".join(f"{v} {s['low_share_k']:.2f}" for v, s in random.items())
            + f"; queries: trained {trained['low_share_q']:.2f}, "
            + ", ".join(f"{v} {s['low_share_q']:.2f}" for v, s in random.items())
        )
        out.append(Finding(model, "", held, evidence))
    return out


def perturbations_tolerated(summary: pd.DataFrame, bands: dict, perturb: dict) -> list[Finding]:
    out = []
    for model, by_variant in perturb.items():
        ratio = by_variant.get(VARIANT_TRAINED)  # {(kind, rate): mean ppl ratio}
        if ratio is None or not all((kind, rate) in ratio for kind in _kinds(ratio) for rate in RATES):
            continue
        low, high = RATES
        held = all(ratio[kind, low] <= MINIMAL and ratio[kind, high] >= CLEAR for kind in _kinds(ratio))
        evidence = "; ".join(f"{kind} {ratio[kind, low]:.2f} / {ratio[kind, high]:.2f}" for kind in _kinds(ratio))
        out.append(Finding(model, "", held, f"perplexity ratio at {low:.0%} / {high:.0%}: {evidence}"))
    return out


def _kinds(ratio: dict) -> list[str]:
    return list(dict.fromkeys(kind for kind, _ in ratio))


@dataclass(frozen=True)
class Claim:
    paper: str
    test: str
    check: object


CLAIMS = [
    Claim(
        "attention logits ~ f(q, i - j) + g(q, k) with r = 0.959",
        f"trained model, sink '{SINK}': mean and pooled r both within {NEAR} of {PAPER_R}",
        r_near_paper,
    ),
    Claim(
        "random-init models lack the split (it is learned)",
        f"every random-init seed's mean r below the trained model's by more than {LACK}, 95 % CI of the "
        "difference below 0",
        random_init_lacks_split,
    ),
    Claim(
        "the low-frequency feature pattern is learned",
        f"share of the key token variance in the low-frequency half of the bands: trained at least {LEARNED:.2f} "
        "above every random-init seed",
        low_frequency_pattern_learned,
    ),
    Claim(
        "position perturbations up to about 5 % are tolerated, more than 10 % degrade clearly",
        f"trained model, every perturbation kind: perplexity ratio at most {MINIMAL} at {RATES[0]:.0%} and at "
        f"least {CLEAR} at {RATES[1]:.0%}",
        perturbations_tolerated,
    ),
]


def verdict(findings: list[Finding]) -> str:
    """The verdict of a claim across its findings (module docstring); diagnostics' findings do not count."""
    findings = [f for f in findings if not f.diagnostic]
    if not findings:
        return "not tested"
    if all(f.held for f in findings):
        return "holds"
    if not any(f.held for f in findings):
        return "does not hold at this size"
    constructions = sorted({f.construction for f in findings if f.construction})
    if constructions:
        by = {c: [f.held for f in findings if f.construction == c] for c in constructions}
        if all(all(v) or not any(v) for v in by.values()):  # each construction holds in every model or in none
            return "holds only under " + ", ".join(f"Method {c}" for c in constructions if all(by[c]))
    models = sorted({f.model for f in findings})
    by_model = {m: [f.held for f in findings if f.model == m] for m in models}
    if all(all(v) or not any(v) for v in by_model.values()):
        return "holds only for " + ", ".join(m for m in models if all(by_model[m]))
    parts = [f"{f.model}/{f.construction}" if f.construction else f.model for f in findings if f.held]
    return "holds only in " + ", ".join(parts)


def verdicts(summary: pd.DataFrame, bands: dict, perturb: dict) -> list[tuple[Claim, str, list[Finding]]]:
    """(claim, verdict, findings) for every claim of :data:`CLAIMS`.

    ``bands``: {model: {variant: {"low_share_q": .., "low_share_k": ..}}} (posgen.bands.band_shares);
    ``perturb``: {model: {variant: {(kind, rate): mean perplexity ratio over samples}}}."""
    out = []
    for claim in CLAIMS:
        findings = claim.check(summary, bands, perturb)
        out.append((claim, verdict(findings), findings))
    return out


def control_markdown(summary: pd.DataFrame) -> str:
    """The random-init control under each construction, side by side: random-init minus trained mean r with its
    95 % interval (paired over samples), per model, seed and sink."""
    shown = (*CONSTRUCTIONS, *DIAGNOSTICS)
    rows = summary[summary["variant"].str.startswith("random-seed") & summary["method"].isin(shown)]
    if "layer_type" in rows.columns:
        rows = rows[rows["layer_type"] == "rope"]
    methods = [m for m in shown if m in set(rows["method"])]
    names = [f"Method {m}" + (" (diagnostic)" if m in DIAGNOSTICS else "") for m in methods]
    lines = [
        "## The random-init control under each construction",
        "",
        "Random-init minus trained mean r over every RoPE layer [95 % bootstrap interval, paired over samples]. "
        "Method A and B are the paper's constructions; a diagnostic is shown beside them and decides nothing.",
        "",
        "| model | variant | sink | " + " | ".join(names) + " |",
        "|---|---|---|" + "---:|" * len(methods),
    ]
    for (model, variant, sink), group in rows.groupby(["model", "variant", "sink"], sort=False):
        by = group.set_index("method")
        cells = [
            f"{by.loc[m, 'diff_vs_trained']:+.3f} [{by.loc[m, 'diff_lo']:+.3f}, {by.loc[m, 'diff_hi']:+.3f}]"
            for m in methods
        ]
        lines.append(f"| {model} | {variant} | {sink} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def verdict_markdown(results, source: str) -> str:
    """The verdict table of the first paper's claims."""
    lines = [
        "## Verdict per claim (Han & Ji 2025)",
        "",
        f"From `{source}`, the bands and the perturbation tables of the same run. The paper's constructions, "
        "which alone decide a verdict: Method A (mean key) and B (least-squares a(i-j) + b(i) + c(j)). "
        + " ".join(f"Diagnostic, shown and not counted: Method {name}, {text}." for name, text in DIAGNOSTICS.items())
        + " Thresholds are fixed in `posgen.verdicts`, not tuned.",
        "",
        "| claim (paper) | test | verdict | evidence (model / construction: numbers; * = holds) |",
        "|---|---|---|---|",
    ]
    for claim, text, findings in results:
        evidence = "; ".join(
            f"{f.model}{' / ' + f.construction if f.construction else ''}{' (diagnostic)' if f.diagnostic else ''}: "
            f"{f.evidence}{' *' if f.held else ''}"
            for f in findings
        )
        lines.append(f"| {claim.paper} | {claim.test} | **{text}** | {evidence or '-'} |")
    return "\n".join(lines) + "\n"
