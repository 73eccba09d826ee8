"""The convergence gate of a classifier (docs/method.md section 8.3): a classifier whose training accuracy was
still rising while its learning rate was high has not converged, and its cell cannot decide a verdict.

Of the epochs that end with the learning rate at or above ``LR_FLOOR`` of its peak, the last ``WINDOW`` give
the least-squares slope of the training accuracy, expressed per tenth of the training budget (so that a
10-epoch and a 100-epoch run are judged alike). Converged: the slope is at most ``MAX_SLOPE``. A run with
fewer than ``WINDOW`` such epochs cannot be judged and counts as not converged.
"""

from __future__ import annotations

import numpy as np

from posgen.rules import value

LR_FLOOR = value("LR_FLOOR")  # epochs whose closing learning rate is at least a tenth of the peak
WINDOW = value("PLATEAU_WINDOW")  # the last three of them
MAX_SLOPE = value("MAX_SLOPE")  # at most 1 point of training accuracy per tenth of the budget
HELDOUT_SE = value("HELDOUT_SE")  # a held-out rise must also exceed this many binomial SE of the test set
FIT_FRACTION = value("FIT_FRACTION")  # fitted: training accuracy this share of the way from the floor to 100 %
LEARN_FRACTION = value("LEARN_FRACTION")  # learned: test accuracy this share of the way from the floor to 100 %


def plateau_slope(train_accuracy, lr_factor) -> float:
    """Slope of the training accuracy (per tenth of the budget) over the last ``WINDOW`` epochs whose closing
    learning-rate factor is >= ``LR_FLOOR``; NaN when there are fewer such epochs."""
    acc = np.asarray(train_accuracy, dtype=np.float64)  # (epoch,)
    lr = np.asarray(lr_factor, dtype=np.float64)  # (epoch,)
    valid = np.isfinite(acc) & np.isfinite(lr)
    acc, lr = acc[valid], lr[valid]
    high = np.flatnonzero(lr >= LR_FLOOR)[-WINDOW:]
    if len(high) < WINDOW:
        return np.nan
    per_epoch = np.polyfit(high.astype(np.float64), acc[high], 1)[0]
    return float(per_epoch * len(acc) / 10)


def converged(train_accuracy, lr_factor) -> bool:
    """The gate: a plateau before the learning rate decayed (:func:`plateau_slope` <= ``MAX_SLOPE``)."""
    slope = plateau_slope(train_accuracy, lr_factor)
    return bool(np.isfinite(slope) and slope <= MAX_SLOPE)
