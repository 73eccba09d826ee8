"""The verdict tables of results/reproduction.md (both papers' "Verdict per claim" sections) as rows, each with
what it was decided on: the first paper's on every head of each model (the statistic the claim reads), the
second paper's on the classifiers of the PEs, tasks and regimes it names."""

from __future__ import annotations

import dataclasses
import html
import re
from pathlib import Path

VERDICT_HEADING = "## Verdict per claim"
# claim words -> the head statistic (posgen.atlas.page.STATISTICS key) a first-paper verdict reads
CLAIM_STATISTIC = (
    ("low-frequency", "low_share_k"),
    ("capping", "f_share"),
    ("dummy distance", "r_sweep_spread"),
    ("perturbation", "loss_increase"),
)


@dataclasses.dataclass(frozen=True)
class VerdictRow:
    paper: int  # 1: Han & Ji 2025 (the LLMs), 2: arXiv 2505.13027 (the classifiers)
    cells: tuple[str, ...]  # claim, test, verdict, evidence: markdown text


def parse(path) -> list[VerdictRow]:
    """Every row of the verdict tables of ``path`` (reproduction.md), the first paper's first; one line naming the
    file where it has none."""
    text = Path(path).read_text()
    rows, paper, in_table = [], 0, False
    for line in text.splitlines():
        if line.startswith("# "):
            paper += 1
            in_table = False
        elif line.startswith("## "):
            in_table = line.startswith(VERDICT_HEADING)
        elif in_table and line.startswith("|") and not line.startswith("|---"):
            cells = tuple(cell.strip() for cell in line.strip().strip("|").split(" | "))
            if cells[0] != "claim (paper)":
                rows.append(VerdictRow(paper=paper, cells=cells))
    if not rows:
        raise ValueError(f"{path}: no '{VERDICT_HEADING}' table")
    return rows


def cell_html(markdown: str) -> str:
    """A table cell's markdown (bold, code, <br>) as HTML, everything else escaped."""
    parts = markdown.split("<br>")
    out = []
    for part in parts:
        part = html.escape(part, quote=False)
        part = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", part)
        out.append(re.sub(r"`(.+?)`", r"<code>\1</code>", part))
    return "<br>".join(out)


def statistic_of(claim: str) -> str:
    """The head statistic a first-paper claim reads (Method A's row-centred r, the deciding one, unless the claim names
    another)."""
    lowered = claim.lower()
    return next((stat for words, stat in CLAIM_STATISTIC if words in lowered), "r_rc_A")


def classifiers_of(row: VerdictRow, classifiers: list[dict]) -> list[dict]:
    """The classifiers (dicts with experiment, task, pe, seed) a second-paper verdict row was decided on: those of
    the regimes its evidence names, of the tasks its claim (else its test) names and of the PEs its test (else its
    claim) names; every one where none is named."""
    claim, test = (cell.lower() for cell in row.cells[:2])
    evidence = row.cells[-1]

    def named(values, *texts, pattern="{}"):
        """The values the first text that names any names (every one where none does)."""
        for text in texts:
            hits = {v for v in values if re.search(rf"(?<![\w+-]){re.escape(pattern.format(v))}(?![\w+-])", text)}
            if hits:
                return hits
        return set(values)

    experiments = named({c["experiment"] for c in classifiers}, evidence, pattern="{}:")
    tasks = named({c["task"] for c in classifiers}, claim, test)
    pes = named({c["pe"] for c in classifiers}, test, claim)  # the test names the PEs it decides on
    return [c for c in classifiers if c["experiment"] in experiments and c["task"] in tasks and c["pe"] in pes]
