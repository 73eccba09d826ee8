"""The registry of rules (posgen.rules): append-only history, the code reads its values, every status from git's
times, and the command that prints it."""

from __future__ import annotations

import importlib

import pytest

from posgen import rules

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
    "GATE_CURVE": ["training accuracy", "held-out accuracy; 'did not fit' below FIT_FRACTION"],
    "LR_FLOOR": [0.1],
    "PLATEAU_WINDOW": [3],
    "MAX_SLOPE": [0.01],
    "HELDOUT_SE": [2],
    "FIT_FRACTION": [0.5],
    "LEARN_FRACTION": ["Bayes + FAIL_MARGIN", 0.5],
    "MIN_SEEDS": [2, 3],
    "MIN_PER_CLASS": [100],
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
    # known cases: the gate's constants came after the deposit study; the deposit criterion preceded the drops;
    # the held-out noise allowance judges numbers nobody has printed; the ALiBi control was read off the table
    assert rules.RULES["MAX_SLOPE"].post_hoc and rules.RULES["SWEEP"].post_hoc
    assert rules.RULES["CRITERION_TOP"].history[-1].status == "before"
    assert rules.RULES["HELDOUT_SE"].history[-1].status == "before"
    assert rules.RULES["LEARN_FRACTION"].history[0].status == "post hoc"


def test_the_rows_cite_their_rules_and_mark_the_post_hoc_ones():
    assert rules.cite(["NEAR", "HEAD_R"]) == "rules: NEAR 0.05 (post hoc), HEAD_R 0.8"
    with pytest.raises(KeyError, match="no rule 'NOPE'"):
        rules.value("NOPE")


def test_the_command_prints_one_row_per_entry(capsys):
    rules.main([])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| rule | paper | value | set | commit |")
    assert len(lines) == 2 + sum(len(v) for v in HISTORY.values())
    assert "| NEAR | first | 0.05 | 2026-11-25 14:19 | 25a4df1 | 1644730 2026-11-22 17:16" in "\n".join(lines)
