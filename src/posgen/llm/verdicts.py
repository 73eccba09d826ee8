"""A verdict per claim of the first paper (Han & Ji 2025) from a run's summary, bands and perturbation tables.

Every claim is tested per model (and per construction of the split where it depends on one: the paper's
Method A and B, docs/method.md sections 3A-3B) against the rules of ``posgen.verdict_rules``, each cited in its row and
marked where it was set after the numbers it judges were first printed (post hoc). Methods A-drift and A-shared
(section 3C) are diagnostics (``DIAGNOSTICS``): their findings are shown, labelled "diagnostic", and never count.

A claim on the trained model is decided on its 95 % bootstrap interval over windows (``posgen.claims.against``):
reproduced when the interval clears the threshold, not reproduced when it lies wholly on the other side,
inconclusive when it straddles it; each finding prints the threshold at which it would flip. A claim against the
random-init control is decided over seeds with the t interval (``posgen.claims.exceeds``): one seed is
inconclusive. Across models and constructions a claim's verdict is the common outcome, or "depends on the
construction / model" with each outcome and where it came from; every verdict is followed by the regime its test
read (:func:`summary_regime`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from posgen.claims import WHY, Claim, Outcome, against, combine, exceeds, label, row_label, verdict_frame
from posgen.claims import verdict_markdown as claims_markdown
from posgen.config import VARIANT_TRAINED
from posgen.llm.summary import HEAD_R
from posgen.verdict_rules import cite, data_status, frozen_at, value, version

PAPER_R = 0.959  # Han & Ji 2025: Pearson r between true logits and f + g
CONSTRUCTIONS = value("CONSTRUCTIONS")  # the paper's constructions of f + g: only these decide a verdict
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
SINK = value("SINK")  # every causal entry, as the paper's correlation
R_STATISTIC = value("R_STATISTIC")  # the r the r claims are decided on; the other is shown beside it
SEEDS_MIN = value("SEEDS_MIN_FIRST")  # seeds a claim against random init needs before it is decided
# summary.csv's column of each raw-r quantity under the deciding statistic (the row-centred r: summary's "_rc")
DECIDING = {
    name: (rc if R_STATISTIC == "row-centred" else name)
    for name, rc in {
        "mean_r": "mean_rc",
        "pooled_r": "pooled_rc",
        "diff_vs_trained": "diff_rc",
        "diff_lo": "diff_rc_lo",
        "diff_hi": "diff_rc_hi",
        "min_layer_r": "min_layer_rc",
        "heads_below": "heads_below_rc",
        "sweep_spread": "sweep_spread_rc",
        "r_sweep": "r_sweep_rc",
    }.items()
}
SHOWN = {v: k for k, v in DECIDING.items() if k != v}  # the deciding column's raw twin, shown beside it
WORD = {"mean_rc": "row-centred mean", "pooled_rc": "row-centred pooled", "mean_r": "mean", "pooled_r": "pooled"}
NEAR = value("NEAR")  # "r near 0.959": mean and pooled r both within this of it
LACK = value("LACK")  # "random-init models lack the split": mean r below the trained model's by more than this
LEARNED = value("LEARNED")  # "the pattern is learned": low-frequency share this far above random init
# perplexity on the kept targets (token and position id unchanged: only their context moved), as the moved
# tokens are unpredictable by construction and would dominate the ratio over every target
MINIMAL = value("MINIMAL")  # "minimal effect" of a 5 % perturbation: kept-target perplexity at most this ratio
CLEAR = value("CLEAR")  # "degrades clearly" at 20 %: kept-target perplexity at least this ratio
RATES = value("RATES")  # the rates of the perturbation claim
SWEEP = value("SWEEP")  # "D barely matters": Method A's mean r moves by at most this over the dummy-distance sweep
LAYER_MIN = value("LAYER_MIN")  # "consistent across layers": every layer's mean r at least this
HEADS_BELOW = value("HEADS_BELOW")  # "... and heads": at most this share of heads below HEAD_R
G_KEPT = value("G_KEPT")  # "a distance cap changes f only": g's r between capped and uncapped passes at least this
HOLDS = {Outcome.REPRODUCED: "holds, ", Outcome.NOT_REPRODUCED: "fails, "}  # one number's test, in any row
DIAGNOSTIC_WORDS = {  # a diagnostic's finding in words that never say "reproduced"
    Outcome.REPRODUCED: "meets the test",
    Outcome.NOT_REPRODUCED: "misses the test",
}


@dataclass(frozen=True)
class Finding:
    """One (model, construction) test of a claim: its outcome and the numbers behind it."""

    model: str
    construction: str  # "" where the claim does not depend on the construction
    outcome: Outcome
    evidence: str
    diagnostic: bool = False  # a diagnostic's finding (DIAGNOSTICS): shown, never counted
    why: str = ""  # the reason of a "not discriminative" (posgen.claims.WHY)

    @property
    def label(self) -> str:
        return label(self.outcome, self.why)


def _interval(row, column: str) -> tuple[float, float]:
    """(lo, hi) of ``column`` in a summary row; NaN where the summary has no interval for it."""
    return tuple(float(row.get(f"{column}_{end}", np.nan)) for end in ("lo", "hi"))


def _decide(name: str, point: float, lo: float, hi: float, threshold: float, above: bool) -> tuple[Outcome, str]:
    """One number against its threshold on its interval over windows, with the threshold at which it flips."""
    outcome, flip = against(lo, hi, threshold, above)
    sign = ">=" if above else "<="
    return outcome, f"{name} {point:.3f} [{lo:.3f}, {hi:.3f}] {sign} {threshold}: {HOLDS.get(outcome, '')}{flip}"


def _near(row, column: str) -> tuple[Outcome, str]:
    """|``column`` - 0.959| <= NEAR on the interval of the distance: [0 or the nearer end, the farther end]."""
    lo, hi = _interval(row, column)
    far = max(abs(lo - PAPER_R), abs(hi - PAPER_R))
    near = 0.0 if lo <= PAPER_R <= hi else min(abs(lo - PAPER_R), abs(hi - PAPER_R))
    outcome, flip = against(near, far, NEAR, above=False)
    text = f"{WORD.get(column, column)} r {row[column]:.3f} [{lo:.3f}, {hi:.3f}], {far:.3f} from {PAPER_R} at most"
    return outcome, f"{text}: {HOLDS.get(outcome, '')}NEAR {flip}"


def _rope_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The rows over every RoPE layer, sink ``SINK``."""
    rows = summary[summary["sink"] == SINK]
    return rows[rows["layer_type"] == "rope"] if "layer_type" in rows.columns else rows


def sweep_of(row, column: str = "r_sweep") -> dict[int, float]:
    """{D: Method A's mean r} from a summary row's ``r_sweep`` (or ``r_sweep_rc``: "0:0.883 250:0.947"); {}
    without one."""
    text = row.get(column, "")
    if not isinstance(text, str) or not text:
        return {}
    return {int(D): float(r) for D, r in (pair.split(":") for pair in text.split())}


def _random_rows(rows: pd.DataFrame, row) -> pd.DataFrame:
    """The random-init variants' rows of ``row``'s model and method."""
    same = rows[(rows["model"] == row["model"]) & (rows["method"] == row["method"])]
    return same[same["variant"].str.startswith("random-seed")]


def _raw(row) -> str:
    """The raw (paper-comparable) mean and pooled r of a row where the row-centred r decides: "; raw r (paper-
    comparable): mean 0.929, pooled 0.972"."""
    if R_STATISTIC != "row-centred":
        return ""
    return f"; raw r (paper-comparable, not deciding): mean {row['mean_r']:.3f}, pooled {row['pooled_r']:.3f}"


def _random_r(rows: pd.DataFrame, row, column: str = DECIDING["mean_r"]) -> str:
    """The random-init variants' ``column`` of ``row``'s model and method, for the same row of a verdict."""
    random = _random_rows(rows, row)
    return ", ".join(f"{variant} {value:.3f}" for variant, value in zip(random["variant"], random[column]))


def _trained_rows(rows: pd.DataFrame, column: str, methods) -> pd.DataFrame:
    """The trained model's rows of ``methods`` where ``column`` has a value (none where the summary lacks it)."""
    if column not in rows.columns:
        return rows.iloc[:0]
    return rows[(rows["variant"] == VARIANT_TRAINED) & rows["method"].isin(methods) & rows[column].notna()]


def _in_band(row) -> Outcome:
    """(a)'s test of one row: mean and pooled r both within ``NEAR`` of the paper's r, on their intervals."""
    return combine([_near(row, DECIDING["mean_r"])[0], _near(row, DECIDING["pooled_r"])[0]])


def r_near_paper(summary: pd.DataFrame, bands: dict, perturb: dict, caps: dict) -> list[Finding]:
    rows = _rope_rows(summary)
    out = []
    for _, row in rows[rows["variant"] == VARIANT_TRAINED].iterrows():
        if row["method"] not in (*CONSTRUCTIONS, *DIAGNOSTICS):
            continue
        outcome, why = _in_band(row), ""
        random_rows = _random_rows(rows, row)
        within = [_in_band(r) == Outcome.REPRODUCED for _, r in random_rows.iterrows()]
        if outcome == Outcome.REPRODUCED and within and all(within):
            outcome, why = Outcome.NOT_DISCRIMINATIVE, "control meets it"  # the untrained control meets it too
        evidence = "; ".join(_near(row, DECIDING[column])[1] for column in ("mean_r", "pooled_r")) + _raw(row)
        sweep = sweep_of(row, DECIDING["r_sweep"])
        if sweep:  # Method A depends on D: its mean r at every D of the sweep
            evidence += " (over D: " + ", ".join(f"{D} {r:.3f}" for D, r in sweep.items()) + ")"
        random = _random_r(rows, row)
        if random:  # the control in the same row: a band every random-init model also meets decides nothing
            evidence += f"; random-init {random}"
        out.append(Finding(row["model"], row["method"], outcome, evidence, row["method"] in DIAGNOSTICS, why))
    return out


def insensitive_to_dummy_distance(summary: pd.DataFrame, bands: dict, perturb: dict, caps: dict) -> list[Finding]:
    rows = _rope_rows(summary)
    out = []
    for _, row in rows[(rows["variant"] == VARIANT_TRAINED) & (rows["method"] == "A")].iterrows():
        sweep = sweep_of(row, DECIDING["r_sweep"])
        if len(sweep) < 2:
            continue
        column = DECIDING["sweep_spread"]
        spread = row.get(column, max(sweep.values()) - min(sweep.values()))
        outcome, text = _decide("spread", spread, *_interval(row, column), SWEEP, above=False)
        evidence = f"{text}; over D = " + ", ".join(f"{D}: {r:.3f}" for D, r in sweep.items())
        if "/" in str(row.get("dummy_distance", "")):  # several D used: a model with sliding-window layers
            evidence += " (sliding-window layers at min(D, window - 1))"
        out.append(Finding(row["model"], "A", outcome, evidence))
    return out


def consistent_across_layers_and_heads(summary: pd.DataFrame, bands: dict, perturb: dict, caps: dict) -> list[Finding]:
    out = []
    lowest, below = DECIDING["min_layer_r"], DECIDING["heads_below"]
    for _, row in _trained_rows(_rope_rows(summary), lowest, (*CONSTRUCTIONS, *DIAGNOSTICS)).iterrows():
        layers = _decide("lowest layer mean r", row[lowest], *_interval(row, lowest), LAYER_MIN, True)
        heads = _decide(f"heads below {HEAD_R}", row[below], *_interval(row, below), HEADS_BELOW, False)
        outcome = combine([layers[0], heads[0]])
        out.append(
            Finding(row["model"], row["method"], outcome, f"{layers[1]}; {heads[1]}", row["method"] in DIAGNOSTICS)
        )
    return out


def random_init_lacks_split(summary: pd.DataFrame, bands: dict, perturb: dict, caps: dict) -> list[Finding]:
    rows = _rope_rows(summary)
    out = []
    for (model, method), group in rows.groupby(["model", "method"], sort=False):
        if method not in (*CONSTRUCTIONS, *DIAGNOSTICS):
            continue
        trained = group[group["variant"] == VARIANT_TRAINED]
        random = group[group["variant"].str.startswith("random-seed")]
        if trained.empty or random.empty:
            continue
        # per seed: trained minus random-init mean r above LACK, and the seed's interval over windows above 0;
        # over seeds, the t interval of the gap (claims.exceeds: one seed is inconclusive)
        mean, diff, lo, hi = (DECIDING[c] for c in ("mean_r", "diff_vs_trained", "diff_lo", "diff_hi"))
        outcome, over_seeds = exceeds(-random[diff].to_numpy(), LACK, points=False, min_seeds=SEEDS_MIN)
        if outcome == Outcome.REPRODUCED and not (random[hi] < 0).all():
            outcome = Outcome.INCONCLUSIVE  # a seed whose own interval reaches 0
        diffs = ", ".join(
            f"{r[0]} {r[1]:.3f} (diff {r[2]:+.3f} [{r[3]:+.3f}, {r[4]:+.3f}])"
            for r in random[["variant", mean, diff, lo, hi]].itertuples(index=False)
        )
        word = WORD.get(mean, "mean")
        evidence = f"trained minus random-init {word} r {over_seeds}; trained {trained[mean].iloc[0]:.3f}; {diffs}"
        out.append(Finding(model, method, outcome, evidence, method in DIAGNOSTICS))
    return out


def low_frequency_pattern_learned(summary: pd.DataFrame, bands: dict, perturb: dict, caps: dict) -> list[Finding]:
    """A finding per model for the keys and one for the queries (``<model> (keys)``, ``<model> (queries)``),
    decided over random-init seeds like the split's control (one seed is inconclusive)."""
    out = []
    for model, by_variant in bands.items():
        if VARIANT_TRAINED not in by_variant:
            continue
        trained = by_variant[VARIANT_TRAINED]
        random = {v: s for v, s in by_variant.items() if v.startswith("random-seed")}
        if not random:
            continue
        for vector, name in (("k", "keys"), ("q", "queries")):
            column = f"low_share_{vector}"
            diffs = [trained[column] - s[column] for s in random.values()]
            outcome, over_seeds = exceeds(diffs, LEARNED, False, min_seeds=SEEDS_MIN)
            shares = ", ".join(f"{v} {s[column]:.3f}" for v, s in random.items())
            evidence = f"trained minus random-init {over_seeds}; trained {trained[column]:.3f}, {shares}"
            out.append(Finding(f"{model} ({name})", "", outcome, evidence))
    return out


def perturbations_tolerated(summary: pd.DataFrame, bands: dict, perturb: dict, caps: dict) -> list[Finding]:
    out = []
    for model, by_variant in perturb.items():
        at = by_variant.get(VARIANT_TRAINED)  # {(kind, rate): Perturbation}
        if at is None or not all((kind, rate) in at for kind in _kinds(at) for rate in RATES):
            continue
        low, high = RATES
        parts, texts = [], []
        for kind in _kinds(at):
            a, b = at[kind, low], at[kind, high]
            mild = _decide(f"{low:.0%}", a.kept, a.kept_lo, a.kept_hi, MINIMAL, above=False)
            clear = _decide(f"{high:.0%}", b.kept, b.kept_lo, b.kept_hi, CLEAR, above=True)
            parts += [mild[0], clear[0]]
            texts.append(
                f"{kind}: {mild[1]}; {clear[1]} (every target {a.ratio:.2f} / {b.ratio:.2f}; moved {a.moved:.0%} / "
                f"{b.moved:.0%})"
            )
        evidence = f"kept-target perplexity ratio at rate {low:.0%} / {high:.0%}: " + "; ".join(texts)
        out.append(Finding(model, "", combine(parts), evidence))
    return out


def cap_changes_only_f(summary: pd.DataFrame, bands: dict, perturb: dict, caps: dict) -> list[Finding]:
    out = []
    for model, by_variant in caps.items():
        at = by_variant.get(VARIANT_TRAINED)  # {cap: CapEffect}
        if not at:
            continue
        parts, texts = [], []
        for cap, e in at.items():
            kept = _decide("g", e.g_corr, e.g_lo, e.g_hi, G_KEPT, above=True)
            below = _decide("g - f", e.g_corr - e.f_corr, e.gap_lo, e.gap_hi, 0.0, above=True)
            parts += [kept[0], below[0]]
            texts.append(f"C = {cap}: f {e.f_corr:.3f}, {kept[1]}; {below[1]}; perplexity ratio {e.ratio:.2f}")
        out.append(Finding(model, "A", combine(parts), "r(capped, uncapped) of the terms: " + "; ".join(texts)))
    return out


def error_within_bound(summary: pd.DataFrame, bands: dict, perturb: dict, caps: dict) -> list[Finding]:
    rows = _rope_rows(summary)
    out = []
    for _, row in _trained_rows(rows, "err_over_bound", ("A",)).iterrows():
        random = _random_r(rows, row, "err_over_bound") or "-"
        evidence = f"mean abs(W - A) / mean bound {row['err_over_bound']:.3f}; random-init {random}"
        out.append(Finding(row["model"], "A", Outcome.NOT_DISCRIMINATIVE, evidence, why="tautology"))
    return out


def _kinds(ratio: dict) -> list[str]:
    return list(dict.fromkeys(kind for kind, _ in ratio))


def summary_regime(summary: pd.DataFrame) -> dict[str, str]:
    """{model: the regime its summary rows were decided in}: windows x tokens (and held-out windows), random-init
    seeds, layers x heads."""
    out = {}
    for model, rows in summary.groupby("model", sort=False):
        first = rows.iloc[0]
        windows = f"{int(first['n_samples'])} windows"
        tokens = int(first.get("n_tokens", 0) or 0)
        windows += f" x {tokens} tokens" if tokens else ""
        heldout = int(first.get("heldout_windows", 0) or 0)
        windows += f" (+{heldout} held-out)" if heldout else ""
        seeds = rows.loc[rows["variant"].str.startswith("random-seed"), "variant"].nunique()
        out[str(model)] = (
            f"{windows}, {seeds} random-init seed{'' if seeds == 1 else 's'}, "
            f"{int(first['n_layers'])} layers x {int(first['n_heads'])} heads"
        )
    return out


# the atlas' head statistic of the deciding r (posgen.atlas.page.statistics), what the r claims are decided on
R_HEADS = "r_rc_A" if R_STATISTIC == "row-centred" else "r_A"
ON_INTERVAL = "decided on its 95 % bootstrap interval over windows (inconclusive when it straddles)"
R_WORDS = (
    "row-centred (each query row less its mean over its scored keys: what softmax sees)"
    if R_STATISTIC == ("row-centred")
    else "raw"
)
CLAIMS = [
    Claim(
        "split",
        "attention logits ~ f(q, i - j) + g(q, k) with r = 0.959",
        f"trained model, sink '{SINK}', {R_WORDS} r: mean and pooled r both within {NEAR} of {PAPER_R}, "
        f"{ON_INTERVAL}; not discriminative where every random-init seed meets the band too",
        r_near_paper,
        rules=("NEAR", "R_STATISTIC", "SINK", "CONSTRUCTIONS", "DECISION"),
        decided_on=(R_HEADS,),
    ),
    Claim(
        "learned",
        "random-init models lack the split (it is learned)",
        f"{R_WORDS} r, per seed: random-init mean r below the trained model's by more than {LACK}, the seed's 95 % "
        f"interval over windows below 0; over seeds, the t interval of the gap above it (fewer than {SEEDS_MIN} "
        "seeds are inconclusive)",
        random_init_lacks_split,
        rules=("LACK", "R_STATISTIC", "SINK", "CONSTRUCTIONS", "SEEDS_FIRST", "SEEDS_MIN_FIRST"),
        decided_on=(R_HEADS,),
    ),
    Claim(
        "dummy distance",
        "the semantic term barely depends on the dummy distance D",
        f"trained model, Method A, sink '{SINK}', {R_WORDS} r: mean r moves by at most {SWEEP} over the "
        "dummy-distance sweep "
        f"(a sliding-window layer's sweep at min(D, window - 1), as its own D), {ON_INTERVAL}",
        insensitive_to_dummy_distance,
        rules=("SWEEP", "R_STATISTIC", "SWEEP_SLIDING", "SINK", "DECISION"),
        decided_on=("r_sweep_spread",),
    ),
    Claim(
        "layers and heads",
        "the split holds across layers and heads",
        f"trained model, sink '{SINK}', {R_WORDS} r: every layer's mean r at least {LAYER_MIN}, and at most "
        f"{HEADS_BELOW:.0%} of "
        f"the heads (mean r over windows) below {HEAD_R}, each {ON_INTERVAL}",
        consistent_across_layers_and_heads,
        rules=("LAYER_MIN", "HEADS_BELOW", "HEAD_R", "R_STATISTIC", "SINK", "CONSTRUCTIONS", "DECISION"),
        decided_on=(R_HEADS,),
    ),
    Claim(
        "distance cap",
        "capping the relative distance (LM-Infinite) changes the positional term f, not the semantic term g",
        f"trained model, Method A, every cap C: g of the capped pass against the uncapped one r >= {G_KEPT}, and "
        f"f's r below g's, each {ON_INTERVAL}; the perplexity ratio beside it",
        cap_changes_only_f,
        reads="caps",
        rules=("G_KEPT", "DECISION"),
        decided_on=("f_share",),
    ),
    Claim(
        "error bound",
        "Method A's error is bounded by the key's token-specific variation in each band (section 5 bound)",
        "the bound holds at every entry of the bound windows; the mean error over the mean bound says how tight",
        error_within_bound,
        fixed="a theorem: every job checks it entry by entry and stops on a violation, so a finished run cannot "
        "fail it",
        decided_on=(R_HEADS,),
    ),
    Claim(
        "low frequency",
        "the low-frequency feature pattern is learned",
        f"share of the token variance in the low-frequency half of the bands, keys and queries each: trained "
        f"minus random-init above {LEARNED:.2f} in every seed and its t interval over seeds above it (fewer than "
        f"{SEEDS_MIN} seeds are inconclusive). The control sits near 0.5 by symmetry (random weights give every band the same variance "
        "in expectation), so this asks for a trained share above about 0.6",
        low_frequency_pattern_learned,
        rules=("LEARNED", "SEEDS_FIRST", "SEEDS_MIN_FIRST"),
        decided_on=("low_share_k",),
    ),
    Claim(
        "perturbations",
        "position perturbations up to about 5 % are tolerated, more than 10 % degrade clearly",
        f"trained model, every perturbation kind: perplexity ratio on the kept targets (token and position id "
        f"unchanged) at most {MINIMAL} at rate {RATES[0]:.0%} and at least {CLEAR} at {RATES[1]:.0%}, each "
        f"{ON_INTERVAL}; the share of tokens each kind actually moves at that rate beside it",
        perturbations_tolerated,
        reads="perturb",
        rules=("MINIMAL", "CLEAR", "RATES", "DECISION"),
        decided_on=("loss_increase",),
    ),
]


def _where(finding: Finding) -> str:
    return f"{finding.model}/{finding.construction}" if finding.construction else finding.model


def verdict(findings: list[Finding]) -> str:
    """The verdict of a claim across its findings (module docstring); diagnostics' findings do not count."""
    findings = [f for f in findings if not f.diagnostic]
    outcomes = list(dict.fromkeys(f.label for f in findings))
    if not outcomes:
        return Outcome.NOT_TESTED.value
    if len(outcomes) == 1:
        return outcomes[0]
    for name, key, named in (
        ("construction", lambda f: f.construction, lambda c: f"Method {c}"),
        ("model", lambda f: f.model, str),
    ):
        groups = {key(f): {g.label for g in findings if key(g) == key(f)} for f in findings}
        if all(groups) and all(len(v) == 1 for v in groups.values()):  # each group decided one way
            parts = [f"{o} for " + ", ".join(named(g) for g, v in groups.items() if o in v) for o in outcomes]
            return f"depends on the {name}: " + "; ".join(parts)
    parts = [f"{o} in " + ", ".join(_where(f) for f in findings if f.label == o) for o in outcomes]
    return "depends: " + "; ".join(parts)


def verdicts(
    summary: pd.DataFrame, bands: dict, perturb: dict, caps: dict | None = None
) -> list[tuple[Claim, str, list[Finding]]]:
    """(claim, verdict, findings) for every claim of :data:`CLAIMS`.

    ``bands``: {model: {variant: {"low_share_q": .., "low_share_k": ..}}} (posgen.llm.bands.band_shares);
    ``perturb``: {model: {variant: {(kind, rate): Perturbation}}} (posgen.llm.readers.perturbation_ratios);
    ``caps``: {model: {variant: {cap: CapEffect}}} (posgen.llm.readers.cap_effects)."""
    missing = [f"{c}{end}" for c in set(DECIDING.values()) for end in ("", "_lo", "_hi")]
    missing = [c for c in missing if c not in summary.columns]
    if missing:  # a summary from before the deciding statistic's columns: its claims have no interval
        summary = summary.assign(**{c: "" if c.startswith("r_sweep") else np.nan for c in missing})
    out = []
    for claim in CLAIMS:
        findings = claim.check(summary, bands, perturb, caps or {})
        fixed = f"{Outcome.NOT_DISCRIMINATIVE.value} ({WHY['tautology']}: {claim.fixed})"
        out.append((claim, fixed if claim.fixed and findings else verdict(findings), findings))
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
    columns = ("diff_vs_trained", "diff_lo", "diff_hi")
    deciding = all(DECIDING[c] in rows.columns for c in columns)  # else a summary from before the row-centred r
    diff, lo, hi = (DECIDING[c] if deciding else c for c in columns)
    lines = [
        "## The random-init control under each construction",
        "",
        f"Random-init minus trained mean r ({R_STATISTIC if deciding else 'raw'}) over every RoPE layer [95 % "
        "bootstrap interval, paired over samples]. "
        "Method A and B are the paper's constructions; a diagnostic is shown beside them and decides nothing.",
        "",
        "| model | variant | sink | " + " | ".join(names) + " |",
        "|---|---|---|" + "---:|" * len(methods),
    ]
    for (model, variant, sink), group in rows.groupby(["model", "variant", "sink"], sort=False):
        by = group.set_index("method")
        cells = [f"{by.loc[m, diff]:+.3f} [{by.loc[m, lo]:+.3f}, {by.loc[m, hi]:+.3f}]" for m in methods]
        lines.append(f"| {model} | {variant} | {sink} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def window_seeds(summary: pd.DataFrame) -> dict[str, int]:
    """{model: the window seed of its windows} from summary.csv's ``window_seed`` (-1 where not recorded)."""
    if "window_seed" not in summary.columns:
        return {}
    return {str(m): int(s) for m, s in summary.groupby("model", sort=False)["window_seed"].first().items()}


def verdict_table(
    results, source: str, regimes: dict[str, dict[str, str]] | None = None, seeds: dict[str, int] | None = None
) -> pd.DataFrame:
    """The first paper's rows of results/verdicts.csv (posgen.claims.VERDICT_COLUMNS) from :func:`verdicts`'
    ``results``: one per finding, with the regime of its model that the claim's test read
    (``regimes[claim.reads or "summary"][model]``) and its status under the registry; one row without a scope for a
    claim nothing tested."""
    registry = f"{version()} (frozen at {frozen_at()})"
    rows = []
    for claim, text, findings in results:
        regime = (regimes or {}).get(claim.reads or "summary", {})
        common = {
            "paper": 1,
            "claim": claim.name,
            "statement": claim.paper,
            "test": claim.test,
            "rules": cite(claim.rules) if claim.rules else "",
            "verdict": text,
            "decided_on": "; ".join(claim.decided_on),
            "registry": registry,
            "source": source,
        }
        for f in findings:
            model = f.model.split(" (")[0]
            status = data_status(claim.rules, model, (seeds or {}).get(model)) if model in regime else ""
            rows.append(
                {
                    **common,
                    "scope": f"{f.model}{' / ' + f.construction if f.construction else ''}",
                    "model": model,
                    "outcome": f.outcome.value,
                    "reason": WHY.get(f.why, f.why),
                    "diagnostic": f.diagnostic,
                    "evidence": f.evidence,
                    "regime": regime.get(model, ""),
                    "status": status,
                }
            )
        if not findings:
            rows.append({**common, "outcome": text, "diagnostic": False})
    return verdict_frame(rows)


def _line(row) -> str:
    """A finding's line in its verdict cell: "**<outcome>**, evidence", or for a diagnostic "**diagnostic** (meets
    the test), evidence"."""
    if row["diagnostic"]:
        words = DIAGNOSTIC_WORDS.get(Outcome(row["outcome"]), "undecided")
        return f"{row['scope']}: **diagnostic** ({words}), {row['evidence']}"
    return f"{row['scope']}: **{row_label(row)}**, {row['evidence']}"


def claim_cells(table: pd.DataFrame) -> list[dict]:
    """Per claim of the first paper's rows of a verdicts table, its verdict row's cells (``paper``, ``test``,
    ``verdict``, ``evidence``: lines): the regime and status of each model its test read, then each finding."""
    cells = []
    for _, part in table[table["paper"] == 1].groupby("claim", sort=False):
        first, scoped = part.iloc[0], part[part["scope"] != ""]
        read = scoped[scoped["regime"] != ""].drop_duplicates("model")
        lines = [f"regime, {r.model}: {r.regime}" for r in read.itertuples()]
        lines += [f"status, {r.model}: {r.status}" for r in read.itertuples()]
        lines += [_line(row) for _, row in scoped.iterrows()]
        test = f"{first['test']}; {first['rules']}" if first["rules"] else first["test"]
        cells.append({"paper": first["statement"], "test": test, "verdict": first["verdict"], "evidence": lines})
    return cells


def verdict_markdown(table: pd.DataFrame) -> str:
    """The verdict section of the first paper's claims (posgen.claims' table), rendered from its rows of a
    verdicts table (:func:`verdict_table`)."""
    first = table[table["paper"] == 1].iloc[0]
    preamble = (
        f"From `{first['source']}`, the bands and the perturbation tables of the same run. The paper's constructions, "
        "which alone decide a verdict: Method A (mean key) and B (least-squares a(i-j) + b(i) + c(j)). "
        + " ".join(f"Diagnostic, shown and not counted: Method {name}, {text}." for name, text in DIAGNOSTICS.items())
        + " Rules: `posgen.verdict_rules` (`python -m posgen.verdict_rules` prints each with the commit that set it); a rule set "
        "after the numbers it judges were first printed is marked post hoc in its row. A claim on the trained model "
        "is decided on its 95 % bootstrap interval over windows and prints the threshold at which it would flip. "
        "Outcomes: reproduced / not reproduced / inconclusive / not discriminative (with its reason) / not tested "
        "(docs/method.md section 8.9); a diagnostic's finding says whether it meets the test, never 'reproduced'. "
        f"Registry {first['registry']}; each verdict's status per model: exploratory where a rule "
        "it cites was set after (or within SAME_STRETCH hours before) that model's data were first printed, else "
        "confirmatory under this version (posgen.verdict_rules.data_status)."
    )
    evidence = "regime; per model / construction: outcome, evidence"
    return claims_markdown("Verdict per claim (Han & Ji 2025)", preamble, claim_cells(table), evidence)
