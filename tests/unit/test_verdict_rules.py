"""The registry of rules (posgen.verdict_rules): append-only history, the code reads its values, every status from git's
times, and the command that prints it."""

from __future__ import annotations

import importlib
import json
import subprocess
from pathlib import Path

import pytest

from posgen import verdict_rules as rules

# Every value each rule has had, in order. Changing a rule means appending its new value here and an Entry there;
# a value edited in place, or an entry dropped, fails test_the_history_is_append_only.
HISTORY = {
    "SINK": ["with"],
    "CONSTRUCTIONS": [("A", "B", "A-drift"), ("A", "B")],
    "DECISION": ["point estimate", "95 % window-bootstrap interval"],
    "NEAR": [0.05],
    "LACK": [0.05],
    "LEARNED": [0.10, 0.10],
    "SEEDS_FIRST": [
        "every seed, point",
        "t interval over seeds, 'learned' only",
        "t interval over seeds, every such claim",
    ],
    "RATES": [(0.05, 0.2)],
    "MINIMAL": [1.10, 1.10],
    "CLEAR": [1.20, 1.20],
    "SWEEP": [0.02],
    "SWEEP_SLIDING": ["D as given", "min(D, window - 1)"],
    "LAYER_MIN": [0.85],
    "HEAD_R": [0.8],
    "HEADS_BELOW": [0.10],
    "G_KEPT": [0.95],
    "FIRST_TOKEN": ["mean-embedding"],
    "HALF": [0.5],
    "GAP_SHARED": ["A-shared's closure", "noise-corrected shared share"],
    "FLOOR_K": [1.0],
    "LEVEL": [0.95],
    "CRITERION_TOP": [0.30],
    "CRITERION_SECOND": [0.05],
    "FAIL_MARGIN": [0.05],
    "SUFFICE": [0.05],
    "DISPLACED": [0.5],
    "TIE_SE": [2],
    "LEAK_SE": [2],
    "GATE_CURVE": [
        "training accuracy",
        "held-out accuracy; 'did not fit' below FIT_FRACTION",
        "held-out accuracy for every classifier with a held-out curve, fitted or not; the training slope only "
        "without one",
    ],
    "LR_FLOOR": [0.1],
    "PLATEAU_WINDOW": [3],
    "MAX_SLOPE": [0.01],
    "HELDOUT_SE": [2],
    "FIT_FRACTION": [0.5],
    "LEARN_FRACTION": ["Bayes + FAIL_MARGIN", 0.5],
    "MIN_SEEDS": [2, 3],
    "MIN_PER_CLASS": [100],
    "PER_CLASS_BEARS": [
        "every distance claim",
        "claims that a PE fails (and 'RoPE best'), and claims whose seeds did not learn; a learned seed decides at any "
        "data size",
    ],
    "FAITHFUL_LR": ["6e-3, betas (0.98, 0.9), 3 seeds"],
    "DEPOSIT_COUNT": ["rope+sinusoidal trained on count beside distance: the same seeds, size, steps and mode"],
    "BAND_LOW_LOSS": [0.1],
    "BAND_HIGH_LOSS": [0.5],
    "BAND_LOW_RHO": ["negative"],
    "BAND_HIGH_RHO": ["positive"],
    "BAND_CONTROL": ["every random-init seed, the same grid and windows"],
    "PAPER_LONGEST_DISTANCE": [71, None],
    "ALIBI_HIDES": [4.6],
    "PC_SHUFFLE": [0.1],
    "PC_RISE": [0.1],
    "PC_SIZE": [0.5],
    "PC_DIRECTION": [0.2],
    "SCALE_SIZE": ["published total parameters"],
    "SCALE_RHO": [1.0],
    "SCALE_DIFF": ["normal, half widths in quadrature"],
    "R_STATISTIC": ["raw", "row-centred"],
    "SEEDS_MIN_FIRST": [2, 3],
    "SAME_STRETCH": [6],
    "QUANT_NOISE": [
        "Gaussian, per block the rounding variance step^2 / 12 of the source format; W_q and W_k, then every weight"
    ],
    "QUANT_R": [0.01],
    "QUANT_LOW": [0.02],
    "RA_R2": [0.9],
    "RA_SHARE": [0.8],
    "DEPOSIT_RULE": [
        "every converged seed; none of the controls",
        "measured half first, learned seeds only; open stays inconclusive",
    ],
}

# (module, attribute, rule): the code's constants, each read from the registry
READ = [
    ("posgen.llm.verdicts", "NEAR", "NEAR"),
    ("posgen.llm.verdicts", "LACK", "LACK"),
    ("posgen.llm.verdicts", "LEARNED", "LEARNED"),
    ("posgen.llm.verdicts", "MINIMAL", "MINIMAL"),
    ("posgen.llm.verdicts", "CLEAR", "CLEAR"),
    ("posgen.llm.verdicts", "RATES", "RATES"),
    ("posgen.llm.verdicts", "SWEEP", "SWEEP"),
    ("posgen.llm.verdicts", "LAYER_MIN", "LAYER_MIN"),
    ("posgen.llm.verdicts", "HEADS_BELOW", "HEADS_BELOW"),
    ("posgen.llm.verdicts", "G_KEPT", "G_KEPT"),
    ("posgen.llm.verdicts", "SINK", "SINK"),
    ("posgen.llm.verdicts", "CONSTRUCTIONS", "CONSTRUCTIONS"),
    ("posgen.llm.summary", "HEAD_R", "HEAD_R"),
    ("posgen.llm.gap_origin", "HALF", "HALF"),
    ("posgen.llm.gap_origin", "FLOOR_K", "FLOOR_K"),
    ("posgen.llm.prefix_content", "SHUFFLE", "PC_SHUFFLE"),
    ("posgen.llm.prefix_content", "RISE", "PC_RISE"),
    ("posgen.llm.prefix_content", "SIZE", "PC_SIZE"),
    ("posgen.llm.prefix_content", "DIRECTION", "PC_DIRECTION"),
    ("posgen.llm.scale", "SIZE", "SCALE_SIZE"),
    ("posgen.llm.scale", "RHO", "SCALE_RHO"),
    ("posgen.llm.scale", "DIFF", "SCALE_DIFF"),
    ("posgen.llm.gap_origin", "SINK", "SINK"),
    ("posgen.llm.first_token", "CONTROL", "FIRST_TOKEN"),
    ("posgen.claims", "LEVEL", "LEVEL"),
    ("posgen.stats", "CRITERION_TOP", "CRITERION_TOP"),
    ("posgen.stats", "CRITERION_SECOND", "CRITERION_SECOND"),
    ("posgen.synthetic.convergence", "LR_FLOOR", "LR_FLOOR"),
    ("posgen.synthetic.convergence", "WINDOW", "PLATEAU_WINDOW"),
    ("posgen.synthetic.convergence", "MAX_SLOPE", "MAX_SLOPE"),
    ("posgen.synthetic.convergence", "HELDOUT_SE", "HELDOUT_SE"),
    ("posgen.synthetic.convergence", "FIT_FRACTION", "FIT_FRACTION"),
    ("posgen.synthetic.convergence", "LEARN_FRACTION", "LEARN_FRACTION"),
    ("posgen.synthetic.verdicts", "FAIL_MARGIN", "FAIL_MARGIN"),
    ("posgen.synthetic.verdicts", "SUFFICE", "SUFFICE"),
    ("posgen.synthetic.verdicts", "DISPLACED", "DISPLACED"),
    ("posgen.synthetic.verdicts", "TIE_SE", "TIE_SE"),
    ("posgen.synthetic.verdicts", "LEAK_SE", "LEAK_SE"),
    ("posgen.synthetic.verdicts", "MIN_SEEDS", "MIN_SEEDS"),
    ("posgen.synthetic.regime", "MIN_PER_CLASS", "MIN_PER_CLASS"),
    ("posgen.synthetic.verdicts", "ALIBI_HIDES", "ALIBI_HIDES"),
]


def unregistered(registry: dict) -> list[str]:
    """The rules whose history differs from HISTORY: a value edited in place, an entry dropped, a rule added."""
    names = sorted(set(registry) | set(HISTORY))
    return [n for n in names if n not in registry or [e.value for e in registry[n].history] != HISTORY.get(n)]


def test_the_history_is_append_only():
    assert unregistered(rules.RULES) == [], "a value changed without a new entry (or a rule not in HISTORY)"


def test_the_guard_fails_on_a_value_edited_in_place():
    """NEAR's 0.05 edited to 0.06 in the registry text, without a new entry: the guard names it; the same value
    appended as a new entry (and to HISTORY) passes."""
    line = "- 0.05 | 25a4df1 2026-11-25 14:19 | FIRST_RUN | mean r 0.928, pooled 0.972"
    assert line in rules.REGISTRY
    assert unregistered(rules._parse(rules.REGISTRY.replace(line, line.replace("0.05", "0.06", 1)))) == ["NEAR"]
    appended = rules._parse(rules.REGISTRY.replace(line, f"{line}\n- 0.06 | ISSUE_50 | FIRST_RUN | mean r"))
    assert appended["NEAR"].value == 0.06 and appended["NEAR"].post_hoc
    HISTORY["NEAR"].append(0.06)
    try:
        assert unregistered(appended) == []
    finally:
        HISTORY["NEAR"].pop()


@pytest.mark.parametrize("module, attribute, name", READ)
def test_the_code_reads_its_values_from_the_registry(module, attribute, name):
    assert getattr(importlib.import_module(module), attribute) == rules.value(name)


def test_every_status_follows_from_the_commit_times():
    for rule in rules.RULES.values():
        times = [entry.when for entry in rule.history]
        assert times == sorted(times), f"{rule.name}: entries out of order"
    # known cases: the gate's constants came after the deposit study; the deposit criterion preceded the drops by
    # 57 minutes (same stretch: SAME_STRETCH); the held-out noise allowance judges numbers nobody has printed; the
    # ALiBi control was read off the table
    assert rules.RULES["MAX_SLOPE"].post_hoc and rules.RULES["SWEEP"].post_hoc
    assert rules.RULES["CRITERION_TOP"].history[-1].status == "same stretch"
    assert rules.RULES["HELDOUT_SE"].history[-1].status == "before"
    assert rules.RULES["LEARN_FRACTION"].history[0].status == "post hoc"


def test_the_rows_cite_their_rules_and_mark_the_post_hoc_ones():
    assert rules.cite(["NEAR", "HEAD_R"]) == "rules: NEAR 0.05 (post hoc), HEAD_R 0.8 (post hoc: same stretch)"
    assert rules.cite(["QUANT_R"]) == "rules: QUANT_R 0.01"
    with pytest.raises(KeyError, match="no rule 'NOPE'"):
        rules.value("NOPE")


def test_the_command_prints_one_row_per_entry(capsys):
    rules.main([])
    lines = capsys.readouterr().out.splitlines()[2:]  # after the version and a blank line
    assert lines[0].startswith("| rule | paper | value | set | commit |")
    assert len(lines) == 2 + sum(len(v) for v in HISTORY.values())
    assert "| NEAR | first | 0.05 | 2026-11-25 14:19 | 25a4df1 | 1644730 2026-11-22 17:16" in "\n".join(lines)


# The values of every registry version, committed as they were frozen: a value changed in place in the registry and
# in HISTORY together still differs from the version it was frozen under. A new version (any value appended) adds
# its snapshot here (tests/unit/verdict_rules_snapshot.json; its values as the registry's reprs).
SNAPSHOT = Path(__file__).with_name("verdict_rules_snapshot.json")


def off_snapshot(registry: dict, snapshot: dict) -> list[str]:
    """What a registry does not keep of the frozen versions: the current version missing from the snapshot or
    with other values, and every frozen value that is no longer in its rule's history."""
    version = rules.version(registry)
    current = {name: repr(rule.value) for name, rule in sorted(registry.items())}
    out = [] if snapshot.get(version, {}).get("values") == current else [f"version {version}: not in the snapshot"]
    for frozen, entry in snapshot.items():
        for name, text in entry["values"].items():
            if name not in registry or text not in [repr(e.value) for e in registry[name].history]:
                out.append(f"version {frozen}: {name} {text} is no longer in its history")
    return out


def test_the_registry_keeps_every_frozen_version():
    assert off_snapshot(rules.RULES, json.loads(SNAPSHOT.read_text())) == []


def test_a_value_changed_in_place_in_both_places_is_caught():
    """Issue 60's battery: SCALE_RHO 1.0 -> 0.8 edited in the registry and in HISTORY together passes the
    append-only guard, not the snapshot."""
    line = "- 1.0 | SCALE_STUDY | - | - | registered before the scale study ran;"
    assert line in rules.REGISTRY
    edited = rules._parse(rules.REGISTRY.replace(line, line.replace("1.0", "0.8", 1)))
    HISTORY["SCALE_RHO"][0] = 0.8
    try:
        assert unregistered(edited) == []  # both places agree
    finally:
        HISTORY["SCALE_RHO"][0] = 1.0
    problems = off_snapshot(edited, json.loads(SNAPSHOT.read_text()))
    assert any("SCALE_RHO 1.0 is no longer in its history" in p for p in problems), problems


def _has_history() -> bool:
    done = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == "false" and rules.version() is not None


@pytest.mark.skipif(not _has_history(), reason="needs this repository's git history")
def test_every_cited_commit_exists_at_its_time():
    assert rules.unverified() == []
    bad = rules.REGISTRY.replace(
        "- 0.05 | 25a4df1 2026-11-25 14:19 | FIRST_RUN | mean r 0.928, pooled 0.972",
        "- 0.05 | 0000000 2026-11-25 14:19 | FIRST_RUN | mean r 0.928, pooled 0.972",
    ).replace("- 0.02 | 63288ee 2026-11-27 02:32 |", "- 0.02 | 63288ee 2026-11-20 02:32 |")
    found = rules.unverified(rules._parse(bad))
    assert "NEAR: 0000000 2026-11-25 14:19 (no such commit)" in found
    assert "SWEEP: 63288ee 2026-11-20 02:32 (the commit's time is 2026-11-27 02:32)" in found


def test_same_stretch_counts_as_post_hoc_and_the_version_follows_the_values():
    """HEAD_R and HEADS_BELOW were set 1.5 h before the first printing of their numbers: 'same stretch', which
    counts as post hoc (SAME_STRETCH 6 h); the version changes with any value and only with a value."""
    for name in ("HEAD_R", "HEADS_BELOW"):
        assert rules.RULES[name].history[-1].status == "same stretch" and rules.RULES[name].post_hoc
    assert rules.RULES["NEAR"].history[-1].status == "post hoc"
    assert rules.RULES["QUANT_R"].history[-1].status == "before"
    noted = rules._parse(rules.REGISTRY.replace("| a literal default of claims.exceeds", "| another note"))
    assert rules.version(noted) == rules.version()
    line = "- 0.01 | ISSUE_60 | - | - | registered before any run"
    changed = rules._parse(rules.REGISTRY.replace(line, line.replace("0.01", "0.02")))
    assert rules.version(changed) != rules.version()


def test_a_verdict_is_exploratory_or_confirmatory_per_data_set():
    """SmolLM2's default windows (seed 0) were printed before most rules: exploratory, naming them; a window seed
    no run of this repository has printed meets every rule as it is: confirmatory under the current version."""
    assert rules.data_status(("NEAR", "SINK"), "smollm2-135m", 0).startswith("exploratory: NEAR, SINK set after")
    fresh = rules.data_status(("NEAR", "SINK"), "smollm2-135m", 4242)
    assert fresh == f"confirmatory under registry {rules.version()} (a data set first met under it)"
    # the Qwen models' data came after NEAR and SINK: confirmatory for rules set before, not for R_STATISTIC
    assert rules.data_status(("NEAR",), "qwen2.5-coder-0.5b", 0).startswith("confirmatory")
    assert rules.data_status(("NEAR", "R_STATISTIC"), "qwen2.5-coder-0.5b", 0).startswith("exploratory: R_STATISTIC")
    assert rules.data_status(("NEAR",), "smollm2-135m", -1).startswith("status unknown")
    # the confirmatory replication's fresh windows, made by 7eb79dc: confirmatory under every rule set before that
    # commit, exploratory for one changed after it (GATE_CURVE's issue 61 entry)
    assert rules.data_status(("NEAR", "R_STATISTIC"), "smollm2-135m-fresh", 1).startswith("confirmatory under")
    late = rules.data_status(("NEAR", "GATE_CURVE"), "smollm2-135m-fresh", 1)
    assert late == "exploratory: GATE_CURVE changed after the run that made it (7eb79dc 2026-11-29 03:59)"


def test_the_command_prints_the_version_first(capsys):
    rules.main([])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"registry {rules.version()}, frozen at {rules.frozen_at()}")
