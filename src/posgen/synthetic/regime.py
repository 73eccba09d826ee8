"""The regime of an experiment of the second paper, in words, and what a regime can test (docs/method.md 8.9).

A regime is one experiment of a collection: depth, heads, width, optimiser steps and learning rate, training
sequences (and sequences per class on the distance task), longest distance, seeds, mode, and the gate's count of
converged / did-not-fit / still-learning classifiers (``posgen.synthetic.convergence``). A distance cell whose
training set holds fewer than ``MIN_PER_CLASS`` sequences per class measures sample efficiency, not the
encoding, where it matters (PER_CLASS_BEARS): a claim that a PE fails, and a claim whose seeds did not learn, is
"not testable here (data per class)"; a seed that learned the task decides at any data size, with the data per
class in its regime.
"""

from __future__ import annotations

import pandas as pd

from posgen.synthetic.convergence import CONVERGED, LEARNING, NO_FIT, gate, learned
from posgen.verdict_rules import value

MIN_PER_CLASS = value("MIN_PER_CLASS")  # training sequences per class below which a distance cell is not testable


def per_class(rows: pd.DataFrame) -> float:
    """Training sequences per class of the distance task: n_train over its longest_distance - 1 classes (labels
    2..longest, uniform), i.e. at the longest distance too; NaN without a distance cell."""
    cells = rows[rows["task"] == "distance"]
    if cells.empty:
        return float("nan")
    return float(cells["n_train"].max()) / (int(cells["longest_distance"].max()) - 1)


def size_and_budget(rows: pd.DataFrame) -> str:
    """Model size, optimiser budget, train sequences (per class on distance) and longest distance of rows of one
    experiment (a summary's or a per-classifier table's), in words."""
    first = rows.iloc[0]
    longest = rows.loc[rows["task"] == "distance", "longest_distance"]
    sequences = f"{int(rows['n_train'].max())} train sequences"
    if len(longest):
        sequences += f" ({per_class(rows):.0f} per class)"
    parts = [
        f"{first['n_layers']} x {first['n_heads']} heads, width {first['d_model']}",
        f"{int(rows['train_steps'].max())} steps at lr {float(first['lr']):g}",
        sequences,
    ]
    if len(longest):
        parts.append(f"distance <= {int(longest.max())}")
    return ", ".join(parts)


def with_states(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with each classifier's gate ``state`` and whether it ``learned`` its task (convergence.gate,
    convergence.learned), computed from its own columns, so that a table written before the gate works too."""
    return rows.assign(
        state=[gate(row) for _, row in rows.iterrows()],
        learned=[learned(row) for _, row in rows.iterrows()],
    )


def regime(rows: pd.DataFrame) -> str:
    """The regime an experiment's per-classifier rows were decided in, in words."""
    first = rows.iloc[0]
    seeds = rows["seed"].nunique()
    states = with_states(rows)["state"].value_counts()
    gated = ", ".join(f"{int(states.get(s, 0))} {s}" for s in (CONVERGED, NO_FIT, LEARNING))
    parts = [
        size_and_budget(rows),
        f"{seeds} seed{'s' if seeds > 1 else ''}",
        "faithful" if first["faithful"] else "clean",
        f"gate: {gated} of {len(rows)} classifiers",
    ]
    if "heldout_rising" not in rows.columns:
        parts.append("held-out curve not recorded (gated on fit and the training slope)")
    else:
        parts.append("gated on each held-out curve")
    return ", ".join(parts)


def too_little_data(rows: pd.DataFrame) -> str:
    """The reason a regime's distance cells are not testable, "" where they are: fewer than MIN_PER_CLASS
    training sequences per class."""
    n = per_class(rows)
    if n == n and n < MIN_PER_CLASS:
        return f"{n:.0f} training sequences per class, fewer than {MIN_PER_CLASS}: a test of sample efficiency"
    return ""
