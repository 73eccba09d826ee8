"""Every rule of both papers' verdicts, declared once with its history (``python -m posgen.verdict_rules`` prints it).

A rule is a threshold, a gate or a control a verdict depends on. Each value it ever had is an :class:`Entry`: the
commit (and its time) at which the rule took that value, and the first printing of the numbers it judges (in
docs/results.md, a commit message or a committed table), both found with ``git log -S`` / ``git log -G`` on this
repository. The entry's status follows from the two times: **before** (set before that printing), **same commit**
(set in the commit that first printed them), or **post hoc** (set after, or in the same commit whose own text says
the numbers were read first). The verdict modules read their values from here (:func:`value`), the verdict tables
mark the post-hoc rules of every claim (:func:`cite`), and ``tests/unit/test_verdict_rules.py`` keeps the history
append-only: a value changed here without a new entry fails it.

Entries of issue 50 were committed before any run printed numbers with them; those whose numbers (the H200 regime
table, the default run) had been printed under the old rules are post hoc all the same, and say so.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One value of a rule: ``set_at`` and ``printed`` are ``"<commit> <YYYY-MM-DD HH:MM>"`` (``printed`` empty:
    nothing it judges has been printed yet); ``read_first``: the setting commit says the numbers were read first."""

    value: object
    set_at: str
    printed: str
    where: str
    note: str = ""
    read_first: bool = False

    @property
    def commit(self) -> str:
        return self.set_at.split(" ", 1)[0]

    @property
    def when(self) -> str:
        return self.set_at.split(" ", 1)[1]

    @property
    def status(self) -> str:
        if not self.printed:
            return "before"  # nothing it judges was printed yet
        commit, when = self.printed.split(" ", 1)
        if self.read_first:
            return "post hoc"
        if commit == self.commit:
            return "same commit"
        if not self.when < when:
            return "post hoc"
        return "same stretch" if _hours(self.when, when) < value("SAME_STRETCH") else "before"

    @property
    def post_hoc(self) -> bool:
        """Set after the numbers it judges, or too close before them to show it preceded them (SAME_STRETCH)."""
        return self.status in ("post hoc", "same stretch")


def _hours(earlier: str, later: str) -> float:
    """Hours from one ``YYYY-MM-DD HH:MM`` to another."""
    from datetime import datetime

    def parse(text: str) -> datetime:
        return datetime.strptime(text, "%Y-%m-%d %H:%M")

    return (parse(later) - parse(earlier)).total_seconds() / 3600


@dataclass(frozen=True)
class Rule:
    name: str
    paper: str  # "first" (Han & Ji 2025), "second" (arXiv 2505.13027)
    judges: str  # what the rule decides, in words
    history: tuple[Entry, ...]

    @property
    def value(self):
        return self.history[-1].value

    @property
    def post_hoc(self) -> bool:
        return self.history[-1].post_hoc


# the first printings the rules judge (docs/results.md unless the text says otherwise)
FIRST_RUN = "1644730 2026-11-22 17:16"  # SmolLM2 default run: mean/pooled r, random-init gap, perturb, sweep, caps
GEMMA_LAYERS = "af4140f 2026-11-23 15:49"  # Gemma's per-layer r (0.838-0.986)
TRAJECTORY = "a77796c 2026-11-23 16:17"  # the low-frequency variance share (trajectory table)
ISSUE_24 = "2cf4a56 2026-11-25 15:41"  # queries' low share, A-drift's gap beside A's
VERDICT_ROWS = "f47f6c8 2026-11-27 04:01"  # heads below 0.8, kept-target ratios, A-shared, first-token control
SECOND_RUN = "6e59f89 2026-11-23 14:07"  # the second paper's accuracies and layer-0 drops, default size
DEPOSIT_STUDY = "a628d3c 2026-11-25 16:10"  # the deposit study: per-seed accuracies, drops, probe R^2
H200_TABLE = "e8b0d76 2026-11-27 05:51"  # docs/gpu/regime_study-classifiers.csv and its section
PER_CLASS = "03175e1 2026-11-28 00:22"  # "30 sequences per class" at distance 71
ISSUE_50 = "b5a90ba 2026-11-28 06:39"  # the commit that registered issue 50's rules
PREFIX_STUDY = "29b2f9c 2026-11-28 07:25"  # the commit that registered the prefix study (issue 50 item 9)
SCALE_STUDY = "ef1000a 2026-11-28 10:03"  # the commit that registered the scale study (issue 54)
SCALE_RUN = "4abd9c4 2026-11-28 11:57"  # the scale study's first numbers (Qwen2.5-Coder's among them)
ISSUE_60_TEXT = (
    "issue-60 2026-11-29 03:17"  # issue 60's text (outside git; at the latest when this work began): row-centred r
)
ISSUE_60 = "56d206a 2026-11-29 03:22"  # the commit that registered issue 60's rules
ISSUE_61_TEXT = (
    "issue-61 2026-11-29 03:17"  # issue 61's text (outside git): NoPE's training slope 0.0102 in a default run
)
CONFIRM_RUN = "confirm-run 2026-11-29 04:35"  # the replication's first numbers (its own tree; printed in results.md)
ISSUE_61 = "5558a2e 2026-11-29 04:04"  # the commit that registered issue 61's rules
ISSUE_61_PILOT = "995db22 2026-11-29 05:02"  # the commit that registered the faithful arm after its CPU pilot
ISSUE_65 = "c1af28a 2026-11-29 07:28"  # the commit that registered issue 65's predictions (band interventions)


# The registry, one rule a "RULE NAME (paper): what it decides" line, then one "- value | set at | the numbers it
# judges, first printed | what they are [| note [| read first]]" line per value it has had, oldest first ("set at"
# and "first printed": a commit and its time, or a name above; "-": nothing printed yet). A line that starts with
# two spaces continues the one before. Kept as text, one line an entry, so that the history reads as a table.
REGISTRY = """
RULE SINK (first): which entries the first paper's correlations count: 'with' = every causal entry, as the paper
- 'with' | 25a4df1 2026-11-25 14:19 | FIRST_RUN | SmolLM2 r, sink 'without' | 'with' counts every causal entry, as
  the paper
RULE CONSTRUCTIONS (first): the constructions of f + g that decide a verdict; the others are diagnostics
- ('A', 'B', 'A-drift') | 25a4df1 2026-11-25 14:19 | FIRST_RUN | Method A and B r
- ('A', 'B') | d2e398c 2026-11-26 20:50 | ISSUE_24 | A-drift's gap beside A's | A-drift demoted to a diagnostic
  after its gap was printed
RULE DECISION (first): what a claim on the trained model is decided on
- 'point estimate' | 25a4df1 2026-11-25 14:19 | FIRST_RUN | every number the claims judge
- '95 % window-bootstrap interval' | ISSUE_50 | FIRST_RUN | every number the claims judge | inconclusive when the
  interval straddles the threshold
RULE NEAR (first): 'r near 0.959': mean and pooled r within this of it
- 0.05 | 25a4df1 2026-11-25 14:19 | FIRST_RUN | mean r 0.928, pooled 0.972
RULE LACK (first): 'random-init models lack the split': trained minus random-init mean r above this
- 0.05 | 25a4df1 2026-11-25 14:19 | FIRST_RUN | trained minus random +0.144
RULE LEARNED (first): 'the low-frequency pattern is learned': trained low-frequency share this far above random init
- 0.1 | 25a4df1 2026-11-25 14:19 | TRAJECTORY | the low-frequency share | keys only
- 0.1 | 63288ee 2026-11-27 02:32 | ISSUE_24 | queries 0.60 / 0.57 vs 0.50 | queries added
RULE SEEDS_FIRST (first): claims against random-init controls: decided over seeds, one seed is inconclusive
- 'every seed, point' | 25a4df1 2026-11-25 14:19 | FIRST_RUN | the random-init gap, one seed
- "t interval over seeds, 'learned' only" | 81c6afc 2026-11-27 08:23 | FIRST_RUN | the random-init gap
- 't interval over seeds, every such claim' | ISSUE_50 | FIRST_RUN | the random-init gap | the low-frequency claim
  too
RULE RATES (first): the perturbation rates of 'up to 5 % tolerated, more than 10 % degrade'
- (0.05, 0.2) | 25a4df1 2026-11-25 14:19 | FIRST_RUN | ratios at 5 % and 20 %
RULE MINIMAL (first): 'minimal effect' at 5 %: perplexity ratio at most this
- 1.1 | 25a4df1 2026-11-25 14:19 | FIRST_RUN | every-target ratio 1.467 at 5 % | on every target
- 1.1 | 63288ee 2026-11-27 02:32 | FIRST_RUN | every-target ratios | moved to kept targets after the every-target
  ratio failed it
RULE CLEAR (first): 'degrades clearly' at 20 %: perplexity ratio at least this
- 1.2 | 25a4df1 2026-11-25 14:19 | FIRST_RUN | every-target ratio 4.698 at 20 % | on every target
- 1.2 | 63288ee 2026-11-27 02:32 | FIRST_RUN | every-target ratios | moved to kept targets after the every-target
  ratio failed it
RULE SWEEP (first): 'D barely matters': Method A's mean r moves by at most this over the dummy-distance sweep
- 0.02 | 63288ee 2026-11-27 02:32 | FIRST_RUN | sweep 0.884-0.946 (spread 0.062)
RULE SWEEP_SLIDING (first): the dummy distances of the sweep on a sliding-window layer
- 'D as given' | 800bbbc 2026-11-23 15:19 | GEMMA_LAYERS | Gemma's raw sweep, 0.612 at D = 1000
- 'min(D, window - 1)' | 570828a 2026-11-28 06:39 | GEMMA_LAYERS | Gemma's raw sweep, 0.612 at D = 1000 | as the
  split row
RULE LAYER_MIN (first): 'across layers': every layer's mean r at least this
- 0.85 | 63288ee 2026-11-27 02:32 | GEMMA_LAYERS | Gemma per-layer 0.838-0.986
RULE HEAD_R (first): '... and heads': a head counts as below when its mean r over windows is under this
- 0.8 | 63288ee 2026-11-27 02:32 | VERDICT_ROWS | heads below 0.8 | same session, 1.5 h before the first printing
RULE HEADS_BELOW (first): '... and heads': at most this share of heads below HEAD_R
- 0.1 | 63288ee 2026-11-27 02:32 | VERDICT_ROWS | heads below 0.8 | same session, 1.5 h before the first printing
RULE G_KEPT (first): 'a cap changes f only': g's r between capped and uncapped passes at least this
- 0.95 | 63288ee 2026-11-27 02:32 | FIRST_RUN | g 0.92 / 0.99 / 1.00 at C = 8 / 32 / 128
RULE FIRST_TOKEN (first): the first-token control: what replaces the input embedding at position 0
- 'mean-embedding' | 63288ee 2026-11-27 02:32 | VERDICT_ROWS | the first-token control's shares | kept in issue 50:
  docs/method.md 3C says why
RULE HALF (first): gap origin: a construction explains the gap when it closes at least this share of it
- 0.5 | 3b9f4a0 2026-11-27 02:14 | ISSUE_24 | A-drift's closure of the gap | A-shared's closure was not yet printed
RULE GAP_SHARED (first): gap origin: the quantity that decides 'absolute position'
- "A-shared's closure" | 3b9f4a0 2026-11-27 02:14 | ISSUE_24 | A-drift's closure
- 'noise-corrected shared share' | ISSUE_50 | VERDICT_ROWS | the shared shares | the shared share less its held-out
  floor
RULE FLOOR_K (first): gap origin's power: inconclusive (held-out floor) when the corrected shared share is within
  this many floors of its decision line
- 1.0 | ISSUE_50 | VERDICT_ROWS | the shared floors, -0.02 (study)
RULE LEVEL (both): the confidence level of every t interval over seeds (posgen.claims)
- 0.95 | 35e5564 2026-11-26 20:48 | DEPOSIT_STUDY | the deposit study's seeds
RULE CRITERION_TOP (second): the deposit criterion: layer-0 top single-head drop at least this
- 0.3 | d1642c3 2026-11-23 13:10 | SECOND_RUN | the first layer-0 drops | the reproduction notes' criterion
RULE CRITERION_SECOND (second): the deposit criterion: the second largest layer-0 drop at most this
- 0.05 | d1642c3 2026-11-23 13:10 | SECOND_RUN | the first layer-0 drops | the reproduction notes' criterion
RULE FAIL_MARGIN (second): 'fails': at most this above the position-free floor
- 0.05 | b8ea546 2026-11-25 04:20 | SECOND_RUN | NoPE 19.3 % on distance
RULE SUFFICE (second): 'one or two RoPE heads suffice': within this of full RoPE
- 0.05 | b8ea546 2026-11-25 04:20 | SECOND_RUN | partial-rope 67.6 % vs rope 80.3 %
RULE DISPLACED (second): 'additive directions displaced': the input probe's R^2 after layer 2 below this share of
  its input R^2
- 0.5 | b8ea546 2026-11-25 04:20 | DEPOSIT_STUDY | the probes' R^2
RULE TIE_SE (second): the tie margin: at least this many binomial standard errors of the test set
- 2 | 35e5564 2026-11-26 20:48 | SECOND_RUN | accuracies of every PE
RULE LEAK_SE (second): NoPE's sanity check: a leak when above its Bayes ceiling by more than this many SE in every
  seed
- 2 | 35e5564 2026-11-26 20:48 | SECOND_RUN | NoPE 19.3 % on distance
RULE GATE_CURVE (second): the convergence gate's curve
- 'training accuracy' | 35e5564 2026-11-26 20:48 | DEPOSIT_STUDY | the deposit study's cells
- "held-out accuracy; 'did not fit' below FIT_FRACTION" | ISSUE_50 | H200_TABLE | the H200 regime table | the
  training slope selected for failure
- 'held-out accuracy for every classifier with a held-out curve, fitted or not; the training slope only without one' |
  ISSUE_61 | ISSUE_61_TEXT | NoPE's training slope 0.0102 in a default run | an unfit memorising seed with a flat
  held-out curve is 'did not fit', not 'still learning' (issue 61 item 4)
RULE LR_FLOOR (second): the gate reads the epochs whose closing learning rate is at least this share of the peak
- 0.1 | 35e5564 2026-11-26 20:48 | DEPOSIT_STUDY | the deposit study's cells
RULE PLATEAU_WINDOW (second): the gate reads the last this-many such epochs
- 3 | 35e5564 2026-11-26 20:48 | DEPOSIT_STUDY | the deposit study's cells
RULE MAX_SLOPE (second): the gate: a plateau rises by at most this per tenth of the budget
- 0.01 | 35e5564 2026-11-26 20:48 | DEPOSIT_STUDY | the deposit study's cells
RULE HELDOUT_SE (second): the held-out gate: still learning only when the rise over the window also exceeds this
  many binomial SE of the test set (the test curve's noise)
- 2 | ISSUE_50 | - | - | no held-out slope has been printed
RULE FIT_FRACTION (second): 'did not fit': final training accuracy below the floor plus this share of the way to 100
  %
- 0.5 | ISSUE_50 | H200_TABLE | training accuracies of the H200 table
RULE LEARN_FRACTION (second): a positive control (and a deposit seed) learned the task: test accuracy at least the
  floor plus this share of the way to 100 % (midpoint of the Bayes ceiling and 100 % on distance)
- 'Bayes + FAIL_MARGIN' | e8b0d76 2026-11-27 05:51 | H200_TABLE | the ALiBi control's accuracies | - | read first
- 0.5 | ISSUE_50 | H200_TABLE | the ALiBi control's accuracies | 13.7 / 15.7 % no longer count
RULE MIN_SEEDS (second): seeds that must decide before a regime's verdict is reproduced or not reproduced
- 2 | 35e5564 2026-11-26 20:48 | DEPOSIT_STUDY | the deposit study's seeds | claims.exceeds: one seed is
  inconclusive
- 3 | ISSUE_50 | H200_TABLE | the H200 table's seeds | two gated seeds ask for a second run or more
RULE MIN_PER_CLASS (second): training sequences per class (distance task, at the longest distance) below which a
  regime is not testable (data per class)
- 100 | ISSUE_50 | PER_CLASS | 30 per class at distance 71 | a tenth of the paper's 1,000 per class
RULE PER_CLASS_BEARS (second): the claims MIN_PER_CLASS makes 'not testable here (data per class)'
- 'every distance claim' | ISSUE_50 | PER_CLASS | size-d36/d71 cells | -
- "claims that a PE fails (and 'RoPE best'), and claims whose seeds did not learn; a learned seed decides at any data
  size" | ISSUE_61 | PER_CLASS | rope+sinusoidal 100 % at 60 and 30 per class, the deposit criterion in 0 of 6 |
  issue 61 item 5: data per class bears on sample efficiency, not on how a model that generalised computes
RULE PAPER_LONGEST_DISTANCE (second): 'ALiBi fails' testable only at the paper's longest distance
- 71 | 35e5564 2026-11-26 20:48 | SECOND_RUN | ALiBi 94.7 % at the default distance
- None | ISSUE_50 | H200_TABLE | ALiBi at distances 17-71 | retired: ALIBI_HIDES decides by the bias
RULE ALIBI_HIDES (second): 'ALiBi fails' testable where the shallowest head's bias at the longest distance is at
  most minus this (ln 100: a far trigger weighted a hundredfold below a near one)
- 4.6 | ISSUE_50 | H200_TABLE | biases -0.28 clean, -27.9 faithful at 71
RULE PC_SHUFFLE (first): prefix study: shuffling each window's tokens 'keeps' the random-init keys' smooth share
  when the paired difference's 95 % interval over windows lies within plus or minus this (a running-average
  convergence); below minus this the order of the content drives the drift
- 0.1 | PREFIX_STUDY | - | - | registered before the prefix study ran
RULE PC_RISE (first): prefix study: windows sharing their first N tokens 'raise' the shared share (s(j) as it is)
  over the tokens after the prefix when the paired difference's interval over windows lies above this (prefix
  content); below it, no rise
- 0.1 | PREFIX_STUDY | - | - | registered before the prefix study ran
RULE PC_SIZE (first): prefix study: the corpus windows' key trajectories share a size profile when the mean
  pairwise correlation of their sizes over the window is at least this
- 0.5 | PREFIX_STUDY | - | - | registered before the prefix study ran
RULE PC_DIRECTION (first): prefix study: ... and do not share a direction when the mean pairwise cosine of their
  directions at the same token is at most this (above 0.5: a shared trajectory)
- 0.2 | PREFIX_STUDY | - | - | registered before the prefix study ran
RULE SCALE_SIZE (first): scale study: what orders the models by size (posgen.llm.scale)
- 'published total parameters' | SCALE_STUDY | - | - | registered before the scale study ran; non-embedding
  counts reported beside, not deciding
RULE SCALE_RHO (first): scale study: a quantity rises (falls) with size when Spearman's rho of its values over the
  models in size order is at least this (at most minus this); with four models rho = 1 has a one-sided exact p of
  1/24
- 1.0 | SCALE_STUDY | - | - | registered before the scale study ran; the 135 M and 270 M models' numbers at other
  window counts had been printed, the Qwen models' had not
RULE SCALE_DIFF (first): scale study: ... and the largest model's value less the smallest's has a 95 % interval
  wholly above (below) 0, formed from each model's own interval thus
- 'normal, half widths in quadrature' | SCALE_STUDY | - | - | registered before the scale study ran
RULE R_STATISTIC (first): the r that decides the first paper's r claims ('r near 0.959', 'random-init lacks the
  split', 'D barely matters', 'across layers and heads'); the other is shown beside it
- 'raw' | 25a4df1 2026-11-25 14:19 | FIRST_RUN | mean and pooled r over the raw logits | the paper's statistic
- 'row-centred' | ISSUE_60 | ISSUE_60_TEXT | SmolLM2's row-centred r (mean 0.913, pooled 0.919), Qwen2's near 0.96 |
  softmax ignores a constant added to a query row: each row of W and of the construction centred over its scored
  keys; raw r kept as paper-comparable
RULE SEEDS_MIN_FIRST (first): random-init seeds that must decide before a first-paper claim against random init is
  reproduced or not reproduced (fewer: inconclusive)
- 2 | de5f739 2026-11-28 06:43 | FIRST_RUN | the random-init gap | a literal default of claims.exceeds
- 3 | ISSUE_60 | FIRST_RUN | the random-init gap | as the second paper's MIN_SEEDS; two seeds give a t interval
  with 1 degree of freedom
RULE SAME_STRETCH (both): an entry set less than this many hours before the first printing of the numbers it judges
  counts as post hoc ('same stretch'): within one stretch of work git cannot show that the rule preceded them
- 6 | ISSUE_60 | VERDICT_ROWS | HEAD_R and HEADS_BELOW, set 1.5 h before their numbers' first printing | issue 60
RULE QUANT_NOISE (first): the quantisation bound: what is added to the de-quantised weights of the trained model
- 'Gaussian, per block the rounding variance step^2 / 12 of the source format; W_q and W_k, then every weight' |
  ISSUE_60 | - | - | registered before any run
RULE QUANT_R (first): a first-paper r (row-centred mean and pooled, Method A and B) is insensitive to the 4-bit
  rounding when its change under QUANT_NOISE is at most this
- 0.01 | ISSUE_60 | - | - | registered before any run
RULE QUANT_LOW (first): ... and the low-frequency share (keys and queries) when its change is at most this
- 0.02 | ISSUE_60 | - | - | registered before any run
RULE RA_R2 (first): the running-average mechanism: the random-init keys' drift size ||d_j|| follows the profile
  sqrt(1/j - 1/T) of a running mean of independent contributions (one fitted amplitude) when the fit's R^2 over
  tokens is at least this
- 0.9 | ISSUE_60 | - | - | registered before any fit
RULE RA_SHARE (first): ... in at least this share of the (layer, KV head) of every random-init seed
- 0.8 | ISSUE_60 | - | - | registered before any fit
RULE DEPOSIT_COUNT (second): the deposit's 'only' half on the decisive GPU experiment: its count control
- 'rope+sinusoidal trained on count beside distance: the same seeds, size, steps and mode' | ISSUE_61 | - | - |
  registered before any decisive_gpu output (issue 61 item 2)
RULE FAITHFUL_LR (second): the decisive GPU experiment's faithful arm: its learning rate and seeds, chosen by the CPU
  pilot (config.pilot.yaml) before any decisive_gpu output
- '6e-3, betas (0.98, 0.9), 3 seeds' | ISSUE_61_PILOT | - | - | the faithful rope+sinusoidal learned distance 71 on the
  experiment's 30,000 sequences in the pilot (test 39.4 % -> 95.0 % in 2 epochs, 1 seed), where at 2,100 it learned
  in 1 of 3 H200 seeds; lr 1e-3's pilot was stopped unfinished
RULE DEPOSIT_RULE (second): how the deposit claim is decided
- 'every converged seed; none of the controls' | 35e5564 2026-11-26 20:48 | DEPOSIT_STUDY | the drops
- 'measured half first, learned seeds only; open stays inconclusive' | ISSUE_50 | H200_TABLE | the drops
RULE BAND_LOW_LOSS (first): band interventions (p-RoPE at inference, issue 65): stopping the lowest quarter of a
  layer's rotating bands (their angles 0) changes the trained model's next-token loss on the analysis windows (nats
  per token, mean over windows, paired with the unmodified model) by at most this: predicted to hold, its 95 %
  window-bootstrap interval inside [-0.1, 0.1]
- 0.1 | ISSUE_65 | - | - | registered before the band-intervention step existed
RULE BAND_HIGH_LOSS (first): ... stopping the highest quarter raises the loss by more than this: predicted to hold,
  its interval above 0.5
- 0.5 | ISSUE_65 | - | - | registered before the band-intervention step existed
RULE BAND_LOW_RHO (first): the sign of the Spearman correlation over the trained model's heads (every RoPE layer)
  between the keys' low-frequency share and the KL divergence of the head's attention rows (modified from unmodified,
  mean over rows and windows) under the lowest quarter stopped; predicted as registered when the 95 % window-bootstrap
  interval of rho lies on that side of 0
- 'negative' | ISSUE_65 | - | - | registered before the band-intervention step existed: heads whose keys live in
  the low bands are least disturbed when those bands stop rotating
RULE BAND_HIGH_RHO (first): ... between Method A's f share (sink 'without') and that KL under the highest quarter
  stopped
- 'positive' | ISSUE_65 | - | - | registered before the band-intervention step existed: positional heads are the
  most disturbed when the fast bands stop rotating
RULE BAND_CONTROL (first): the random-init control of every band prediction: the same interventions on each
  random-init seed, beside the trained model's; a loss prediction that every seed's control meets too is 'not
  discriminative' (the control meets it too)
- 'every random-init seed, the same grid and windows' | ISSUE_65 | - | - | registered before the band-intervention
  step existed
"""


def _parse(text: str) -> dict[str, Rule]:
    """:data:`RULES` from :data:`REGISTRY`."""
    lines: list[str] = []
    for line in text.strip().splitlines():
        if line.startswith("  "):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    rules: dict[str, tuple] = {}
    for line in lines:
        if line.startswith("RULE "):
            head, judges = line[len("RULE ") :].split(": ", 1)
            name, paper = head.rstrip(")").split(" (")
            rules[name] = (paper, judges, [])
            continue
        value, set_at, printed, where, *rest = (part.strip() for part in line[2:].split("|"))
        note = rest[0] if rest and rest[0] != "-" else ""
        read_first = len(rest) > 1 and rest[1] == "read first"
        names = globals()
        printed = "" if printed == "-" else names.get(printed, printed)
        entry = Entry(ast.literal_eval(value), names.get(set_at, set_at), printed, where, note, read_first)
        list(rules.values())[-1][2].append(entry)
    return {name: Rule(name, paper, judges, tuple(history)) for name, (paper, judges, history) in rules.items()}


RULES = _parse(REGISTRY)


def version(rules: dict[str, Rule] | None = None) -> str:
    """The registry's version: a digest of every rule's current value (its name and value's repr), so that any
    change of a value, and only that, makes a new version; printed in every verdict table."""
    rules = RULES if rules is None else rules
    text = "".join(f"{name}={rule.value!r}\n" for name, rule in sorted(rules.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def frozen_at(rules: dict[str, Rule] | None = None) -> str:
    """When the current version's last value was set (``YYYY-MM-DD HH:MM``): data first printed after it met every
    rule as it is now."""
    return max(rule.history[-1].when for rule in (RULES if rules is None else rules).values())


# The data sets the verdicts of this repository have judged, each a model (its config name) on the windows of one
# window seed of the embedded corpus: the first printing of its numbers, and the commit whose code (and registry)
# made them where that data was new to every rule ("" for data printed before its rules). Any other data set (a new
# window seed, a user's model) meets the rules first when its verdicts are made: confirmatory under the registry.
DATA_SETS = {
    ("smollm2-135m", 0): (FIRST_RUN, ""),
    ("gemma3-270m", 0): (GEMMA_LAYERS, ""),
    ("smollm2-135m-first", 0): (VERDICT_ROWS, ""),
    ("gemma3-270m-first", 0): (VERDICT_ROWS, ""),
    ("qwen2.5-coder-0.5b", 0): (SCALE_RUN, ""),
    ("qwen2.5-coder-1.5b", 0): (SCALE_RUN, ""),
    ("tiny-rope", 0): (TRAJECTORY, ""),
    # the confirmatory replication's fresh windows (config.confirm.yaml), made by 7eb79dc under registry f9850b5bea27
    ("smollm2-135m-fresh", 1): (CONFIRM_RUN, "7eb79dc 2026-11-29 03:59"),
}


def data_status(names, model: str, window_seed) -> str:
    """Whether the verdict of a claim citing rules ``names`` on ``model``'s windows of ``window_seed`` is
    exploratory or confirmatory under the registry version in force.

    Data printed before its rules: exploratory where a rule was set after, or within SAME_STRETCH hours before, the
    data's first printing. Data made new by a run of this repository's code (the confirmatory replication):
    exploratory only where a rule changed after the commit that made it, whose registry the data met first (its
    outputs record that commit's config hash and version). Any other data set: confirmatory."""
    if window_seed is None or int(window_seed) < 0:
        return "status unknown: the summary records no window seed (made before posgen.verdict_rules.data_status)"
    known = DATA_SETS.get((model, int(window_seed)))
    if known is None:
        return f"confirmatory under registry {version()} (a data set first met under it)"
    printed, made_under = known
    if made_under:
        late = [n for n in names if RULES[n].history[-1].when > made_under.split(" ", 1)[1]]
        if late:
            return f"exploratory: {', '.join(late)} changed after the run that made it ({made_under})"
        return f"confirmatory under registry {version()} (made by {made_under.split(' ', 1)[0]})"
    when = printed.split(" ", 1)[1]
    late = [n for n in names if not _before(RULES[n].history[-1].when, when)]
    if late:
        return f"exploratory: {', '.join(late)} set after its numbers were first printed ({printed})"
    return f"confirmatory under registry {version()}"


def _before(set_at: str, printed: str) -> bool:
    """A value set at ``set_at`` precedes numbers first printed at ``printed``: earlier, and by SAME_STRETCH hours."""
    return set_at < printed and _hours(set_at, printed) >= value("SAME_STRETCH")


def unverified(rules: dict[str, Rule] | None = None, git_dir: str | None = None) -> list[str]:
    """The entries whose cited commit (set at, or first printed) is not in this repository's history, or whose
    time differs from the commit's own (to the minute): ``"RULE: <ref> (why)"``. References that are not commits
    (a text outside git, such as ``issue-60``) are not checked. Needs git and the repository's history."""
    import re
    import subprocess

    out, seen = [], {}
    for rule in (RULES if rules is None else rules).values():
        for entry in rule.history:
            for ref in (entry.set_at, entry.printed):
                commit, _, when = ref.partition(" ")
                if not ref or not re.fullmatch(r"[0-9a-f]{7,40}", commit):
                    continue
                if commit not in seen:
                    cmd = ["git", *(["--git-dir", git_dir] if git_dir else []), "show", "-s", "--format=%ci", commit]
                    done = subprocess.run(cmd, capture_output=True, text=True)
                    seen[commit] = done.stdout.strip() if done.returncode == 0 else ""
                if not seen[commit]:
                    out.append(f"{rule.name}: {ref} (no such commit)")
                elif not seen[commit].startswith(when):
                    out.append(f"{rule.name}: {ref} (the commit's time is {seen[commit][:16]})")
    return out


def value(name: str):
    """The current value of rule ``name``."""
    if name not in RULES:
        raise KeyError(f"posgen.verdict_rules: no rule {name!r}")
    return RULES[name].value


def cite(names) -> str:
    """The rules of a claim for its verdict row: ``NEAR 0.05 (post hoc), HEAD_R 0.8``."""
    marks = {"post hoc": " (post hoc)", "same stretch": " (post hoc: same stretch)"}
    parts = [f"{n} {_text(RULES[n].value)}{marks.get(RULES[n].history[-1].status, '')}" for n in names]
    return "rules: " + ", ".join(parts)


def _text(v) -> str:
    return "/".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def table() -> str:
    """The registry as a Markdown table, one row per entry (rule, value, date, commit, status, what it judges)."""
    lines = [
        "| rule | paper | value | set | commit | the numbers it judges, first printed | status | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rule in RULES.values():
        for e in rule.history:
            printed = f"{e.printed}: {e.where}" if e.printed else "-"
            lines.append(
                f"| {rule.name} | {rule.paper} | {_text(e.value)} | {e.when} | {e.commit} | {printed} | "
                f"{e.status} | {e.note} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    """``python -m posgen.verdict_rules``: the registry's version, then every rule's history (value, date, commit, before /
    after the numbers)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m posgen.verdict_rules", description=main.__doc__)
    parser.parse_args(argv)
    print(f"registry {version()}, frozen at {frozen_at()} (the latest value's time)\n")
    print(table(), end="")


if __name__ == "__main__":
    main()
