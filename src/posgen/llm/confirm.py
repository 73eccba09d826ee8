"""The confirmatory replication (docs/method.md section 6.2; target ``confirmatory``, config.confirm.yaml): every
first-paper verdict on data made after the registry was frozen (a models entry with ``fresh_windows``) beside the
same verdict on the data the rules were chosen on (its exploratory twin: the same model on windows earlier runs
printed), at the same size and seeds, under the same registry version; and every outcome that differs.

``python -m posgen.llm.confirm --table results/confirmatory.csv --check docs/results.md`` exits non-zero, naming
them, when a claim whose outcome differs is not listed in the Markdown file (a line holding the claim's words and
"differs").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from posgen.integrity import made_from, shown
from posgen.llm.verdicts import verdicts, window_seeds
from posgen.store import atomic_path
from posgen.verdict_rules import data_status, version

COLUMNS = ["claim", "paper", "exploratory", "confirmatory", "exploratory_verdict", "confirmatory_verdict"]
COLUMNS += ["differs", "exploratory_status", "confirmatory_status", "registry"]


def model_verdicts(summary: pd.DataFrame, model: str, bands: dict, perturb: dict, caps: dict) -> dict:
    """{claim name: (claim, verdict text)} of every first-paper claim decided on ``model``'s rows alone."""
    rows = summary[summary["model"] == model]
    if rows.empty:
        raise KeyError(f"confirmatory.pairs: no model {model!r} in the summary")
    one = verdicts(rows, {model: bands.get(model, {})}, {model: perturb.get(model, {})}, {model: caps.get(model, {})})
    return {claim.name: (claim, text) for claim, text, _ in one}


def comparison(summary: pd.DataFrame, bands: dict, perturb: dict, caps: dict, pairs) -> pd.DataFrame:
    """One row per (pair, claim): the exploratory and the confirmatory model's verdicts, whether they differ, and
    each one's status under the registry (posgen.verdict_rules.data_status)."""
    seeds = window_seeds(summary)
    out = []
    for exploratory, confirmatory in pairs:
        before = model_verdicts(summary, exploratory, bands, perturb, caps)
        after = model_verdicts(summary, confirmatory, bands, perturb, caps)
        for name, (claim, old) in before.items():
            new = after[name][1]
            out.append(
                {
                    "claim": name,
                    "paper": claim.paper,
                    "exploratory": exploratory,
                    "confirmatory": confirmatory,
                    "exploratory_verdict": old,
                    "confirmatory_verdict": new,
                    "differs": old != new,
                    "exploratory_status": data_status(claim.rules, exploratory, seeds.get(exploratory)),
                    "confirmatory_status": data_status(claim.rules, confirmatory, seeds.get(confirmatory)),
                    "registry": version(),
                }
            )
    return pd.DataFrame(out, columns=COLUMNS)


def confirm_markdown(table: pd.DataFrame, provenance: str = "") -> str:
    """The replication's table and the list of every outcome that differs."""
    lines = [
        "# The confirmatory replication",
        "",
        f"Every first-paper claim decided under registry {version()} on fresh windows (confirmatory) beside the same "
        "claim on the windows the rules were chosen on (exploratory), same sizes and seeds. " + provenance,
        "",
        "| claim (paper) | exploratory | confirmatory | differs | status (exploratory; confirmatory) |",
        "|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.paper} | {r.exploratory}: **{r.exploratory_verdict}** | {r.confirmatory}: "
            f"**{r.confirmatory_verdict}** | {'**differs**' if r.differs else 'same'} | {r.exploratory_status}; "
            f"{r.confirmatory_status} |"
        )
    lines += ["", "## Outcomes that differ", ""]
    differs = table[table["differs"]]
    lines += [
        f"- {r.paper}: differs ({r.exploratory_verdict} -> {r.confirmatory_verdict})" for r in differs.itertuples()
    ]
    if differs.empty:
        lines.append("None: every outcome is the same.")
    return "\n".join(lines) + "\n"


def unlisted(table: pd.DataFrame, text: str) -> list[str]:
    """The differing claims (their paper words) that no line of ``text`` lists with the word "differs"."""
    listed = [line for line in text.splitlines() if "differs" in line]
    return [r.paper for r in table[table["differs"]].itertuples() if not any(r.paper in line for line in listed)]


def write_confirmatory(summary_csv, csv, md, bands: dict, perturb: dict, caps: dict, pairs, provenance: str = ""):
    """results/confirmatory.csv and results/confirmatory.md."""
    summary = pd.read_csv(summary_csv)
    table = comparison(summary, bands, perturb, caps, pairs)
    with made_from([summary_csv]), atomic_path(csv) as tmp:
        table.to_csv(tmp, index=False)
    with atomic_path(md) as tmp:
        Path(tmp).write_text(confirm_markdown(table, provenance))
    return table


def confirm_step(job) -> None:
    """Rule confirmatory_table's job (a :class:`posgen.workflow.job.StepJob`)."""
    from posgen.llm.readers import claim_tables

    i, o, p = job.input, job.output, job.params
    provenance = f"config_hash {p['config_hash']}."
    write_confirmatory(i["summary"], o["csv"], o["md"], *claim_tables(i), p["pairs"], provenance=provenance)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posgen.llm.confirm", description=__doc__.splitlines()[0])
    parser.add_argument("--table", required=True, help="results/confirmatory.csv")
    parser.add_argument("--check", required=True, help="a Markdown file that must list every outcome that differs")
    args = parser.parse_args(argv)
    for path in (args.table, args.check):
        if not Path(path).is_file():
            print(f"posgen.llm.confirm: {shown(path)}: no such file", file=sys.stderr)
            return 2
    table = pd.read_csv(args.table)
    missing = unlisted(table, Path(args.check).read_text(encoding="utf-8", errors="replace"))
    if missing:
        print(f"posgen.llm.confirm: {args.check} does not list these differing outcomes: {'; '.join(missing)}")
        return 1
    print(f"posgen.llm.confirm: {int(table['differs'].sum())} differing outcome(s), each listed in {args.check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
