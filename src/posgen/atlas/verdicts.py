"""Both papers' verdict tables on the atlas page, from results/verdicts.csv (posgen.claims.VERDICT_COLUMNS), each
row linked to what it was decided on: the first paper's to the head statistic its claim reads (on every model), the
second paper's to the classifiers of the cells each regime read."""

from __future__ import annotations

import html
import re

import pandas as pd

from posgen.llm.verdicts import claim_cells as first_cells
from posgen.synthetic.verdicts import claim_cells as second_cells

PAPERS = (
    (1, "Han &amp; Ji 2025: attention logits in LLMs", first_cells),
    (2, "arXiv 2505.13027: classifiers", second_cells),
)
FALLBACK = "r_A"  # the statistic a first-paper row links to where the run's table has none it names


def cell_html(markdown: str) -> str:
    """A table cell's markdown (bold, code, <br>) as HTML, everything else escaped."""
    parts = markdown.split("<br>")
    out = []
    for part in parts:
        part = html.escape(part, quote=False)
        part = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", part)
        out.append(re.sub(r"`(.+?)`", r"<code>\1</code>", part))
    return "<br>".join(out)


def _statistic(decided_on: str, stats: dict) -> str:
    """The menu key of the head statistic a first-paper claim was decided on (the first of a prefix's keys)."""
    return decided_on if decided_on in stats else next((k for k in stats if k.startswith(decided_on)), FALLBACK)


def _decided(rows: pd.DataFrame, classifiers: list[dict]) -> list[dict]:
    """The classifiers (dicts with experiment, task, pe, seed, key) a second-paper claim's rows read: per row, those
    of its experiment in the cells it names."""
    read = {(r.scope, cell) for r in rows.itertuples() for cell in r.decided_on.split("; ") if cell}
    return [c for c in classifiers if (c["experiment"], f"{c['task']}/{c['pe']}") in read]


def _links(paper: int, rows: pd.DataFrame, models, classifiers, stats) -> list[tuple[str, str, str]]:
    """(kind, target, text) of each link of a claim's 'decided on' cell."""
    if paper == 1:
        stat = _statistic(rows["decided_on"].iloc[0], stats)
        return [("heads", f"{model}|{stat}", f"{model}: {stats[stat][0]}") for model in models]
    return [
        ("classifier", c["key"], f"{c['experiment']} / {c['task']} / {c['pe']} / seed {c['seed']}")
        for c in _decided(rows, classifiers)
    ]


def verdict_rows(table: pd.DataFrame | None, models: list[str], classifiers: list[dict], stats: dict) -> list[dict]:
    """Per paper, its title and its claims' rows: id, the cells as HTML (claim, test, verdict, evidence) and the
    links to what each was decided on (``models``: the atlas' models; ``classifiers``: its classifier keys;
    ``stats``: its menu, posgen.atlas.page.statistics)."""
    if table is None:
        return []
    papers = []
    for paper, title, cells_of in PAPERS:
        part = table[table["paper"] == paper]
        rows = []
        for i, ((_, claim_rows), cell) in enumerate(zip(part.groupby("claim", sort=False), cells_of(part))):
            markdown = [cell["paper"], cell["test"], f"**{cell['verdict']}**", "<br>".join(cell["evidence"]) or "-"]
            rows.append(
                {
                    "id": f"verdict-{paper}-{i}",
                    "claim": cell["paper"],
                    "cells": [cell_html(m) for m in markdown],
                    "links": _links(paper, claim_rows, models, classifiers, stats),
                }
            )
        papers.append({"paper": paper, "title": title, "rows": rows})
    return papers
