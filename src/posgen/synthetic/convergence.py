"""The gate of a classifier (docs/method.md section 8.3): converged, did not fit, or still learning, from its
held-out curve and whether it fits its own training data, so that the gate cannot pick a verdict's outcome.

* **fit**: the final training accuracy reaches ``FIT_FRACTION`` of the way from the task's position-free floor
  (:func:`floor`) to 100 %. A classifier below it **did not fit**: a result of its budget, never "converged".
* **still learning**: the held-out (test) accuracy still rises: of the epochs that end with the learning rate at
  or above ``LR_FLOOR`` of its peak, the last ``WINDOW`` give its least-squares slope per tenth of the budget,
  above ``MAX_SLOPE``, and the rise over those epochs exceeds ``HELDOUT_SE`` binomial standard errors of the test
  set (the curve's own noise), for every classifier with a held-out curve, fitted or not (GATE_CURVE, issue 61):
  memorisation (training accuracy rising at a flat test accuracy) is never "still learning", and a model at 100 %
  is not "unconverged". Only a row without a held-out curve is still learning when it did not fit and its training
  accuracy rises by more than ``MAX_SLOPE``.
* **converged**: it fits and its held-out accuracy has reached its plateau.

Tables written before the held-out curve was recorded (no ``heldout_rising`` column, e.g. the committed H200
regime table) are gated on fit and the training slope alone; their regime says so.

A classifier **learned** the task (a positive control, a deposit seed) when its test accuracy reaches
``LEARN_FRACTION`` of the way from the floor to 100 % (the midpoint of the Bayes ceiling and 100 % on distance).
"""

from __future__ import annotations

import math

import numpy as np

from posgen.verdict_rules import value

LR_FLOOR = value("LR_FLOOR")  # epochs whose closing learning rate is at least a tenth of the peak
WINDOW = value("PLATEAU_WINDOW")  # the last three of them
MAX_SLOPE = value("MAX_SLOPE")  # at most 1 point of accuracy per tenth of the budget
HELDOUT_SE = value("HELDOUT_SE")  # a held-out rise must also exceed this many binomial SE of the test set
FIT_FRACTION = value("FIT_FRACTION")  # fitted: training accuracy this share of the way from the floor to 100 %
LEARN_FRACTION = value("LEARN_FRACTION")  # learned: test accuracy this share of the way from the floor to 100 %
CONVERGED, NO_FIT, LEARNING = "converged", "did not fit", "still learning"  # the gate's states


def plateau_slope(accuracy, lr_factor) -> float:
    """Slope of an accuracy curve (per tenth of the budget) over the last ``WINDOW`` epochs whose closing
    learning-rate factor is >= ``LR_FLOOR``; NaN when there are fewer such epochs."""
    acc = np.asarray(accuracy, dtype=np.float64)  # (epoch,)
    lr = np.asarray(lr_factor, dtype=np.float64)  # (epoch,)
    valid = np.isfinite(acc) & np.isfinite(lr)
    acc, lr = acc[valid], lr[valid]
    high = np.flatnonzero(lr >= LR_FLOOR)[-WINDOW:]
    if len(high) < WINDOW:
        return np.nan
    per_epoch = np.polyfit(high.astype(np.float64), acc[high], 1)[0]
    return float(per_epoch * len(acc) / 10)


def heldout_rising(test_accuracy, lr_factor, n_test: int) -> bool:
    """Whether the held-out accuracy still rises (module docstring): its plateau slope above ``MAX_SLOPE`` and its
    rise over the window above ``HELDOUT_SE`` binomial SE of ``n_test`` sequences; True where it cannot be judged
    (fewer than ``WINDOW`` epochs at a high rate)."""
    acc = np.asarray(test_accuracy, dtype=np.float64)
    slope = plateau_slope(acc, lr_factor)
    if not np.isfinite(slope):
        return True
    n_epochs = int(np.isfinite(acc).sum())
    rise = slope * 10 / n_epochs * (WINDOW - 1)  # per epoch, over the window's span
    p = float(np.clip(np.nanmean(acc[np.isfinite(acc)][-WINDOW:]), 0, 1))
    return bool(slope > MAX_SLOPE and rise > HELDOUT_SE * math.sqrt(p * (1 - p) / n_test))


def floor(row) -> float:
    """The task's position-free floor of a per-classifier row: the exact Bayes accuracy of a position-free
    classifier on distance (NoPE's ceiling), the majority class on count (whose Bayes accuracy is 100 %)."""
    return float(row["baseline_bayes"] if row["task"] == "distance" else row["baseline_majority"])


def line(row, fraction: float) -> float:
    """``fraction`` of the way from the row's :func:`floor` to 100 %."""
    base = floor(row)
    return base + fraction * (1 - base)


def gate(row) -> str:
    """The state of one classifier (a per-classifier row): :data:`CONVERGED`, :data:`NO_FIT` or :data:`LEARNING`.

    Still learning is read off the held-out curve wherever the row has one, fitted or not (GATE_CURVE): a
    classifier that memorises (its training accuracy rising while its held-out accuracy stays flat) did not fit
    or converged, never "still learning". Only a row without a held-out curve is gated on its training slope."""
    fit = row["final_train_accuracy"] >= line(row, FIT_FRACTION)
    rising = row.get("heldout_rising", float("nan"))
    if rising == rising:  # a held-out curve (NaN: none in this table)
        still = bool(rising)
    else:
        still = not fit and row["train_slope"] > MAX_SLOPE
    if still:
        return LEARNING
    return CONVERGED if fit else NO_FIT


def learned(row) -> bool:
    """Whether a classifier learned its task: test accuracy at least ``LEARN_FRACTION`` of the way from the floor."""
    return bool(row["test_accuracy"] >= line(row, LEARN_FRACTION))
