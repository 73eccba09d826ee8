"""The exact Bayes accuracy of a position-free classifier on the synthetic tasks (docs/method.md section 8.2).

A classifier without position (NoPE with mean pooling: a function of the sequence's multiset of tokens) sees,
of a distance sample, the two triggers once each and ``length - 2`` fillers drawn iid from the filler ids:
given the length, the multiset says nothing about the label. So its best accuracy is that of the best rule of
the length alone, computed here from the generator's distributions (not from a finite sample):

    P(label = m + 1, length = n) = P(middle = m) * P(left + right = n - m - 2)
    bayes = sum_n max_m P(label = m + 1, length = n)

with left, right ~ U{1..max_side} (their sum triangular) and middle ~ U{1..max_middle}. On the count task the
multiset holds the count itself: a position-free classifier can be exact (1.0).
"""

from __future__ import annotations

import numpy as np


def side_sum_pmf(max_side: int) -> np.ndarray:
    """P(left + right = s) for s = 0 .. 2 max_side (zero below 2)."""
    one = np.r_[0.0, np.full(max_side, 1.0 / max_side)]  # P(left = s), s = 0 .. max_side
    return np.convolve(one, one)  # (2 max_side + 1,)


def distance_joint(max_side: int, max_middle: int) -> np.ndarray:
    """P(middle = m, length = n) as an array (middle - 1, length): rows m = 1 .. max_middle, columns
    n = 0 .. 2 max_side + max_middle + 2."""
    sides = side_sum_pmf(max_side)  # (2S + 1,)
    n_lengths = 2 * max_side + max_middle + 3
    joint = np.zeros((max_middle, n_lengths))  # (middle, length)
    for m in range(1, max_middle + 1):
        joint[m - 1, m + 2 : m + 2 + len(sides)] = sides / max_middle  # length = m + 2 + (left + right)
    return joint


def distance_bayes_accuracy(max_side: int, max_middle: int) -> float:
    """Exact accuracy of the best position-free classifier on the distance task (the best rule of the length)."""
    return float(distance_joint(max_side, max_middle).max(0).sum())


def position_free_bayes(task: str, sizes: dict) -> float:
    """The position-free Bayes accuracy of ``task`` with the generator's ``sizes`` (the config section)."""
    if task == "distance":
        return distance_bayes_accuracy(int(sizes["max_side"]), int(sizes["max_middle"]))
    if task == "count":
        return 1.0
    raise ValueError(f"synthetic.tasks: unknown task {task!r} (expected distance or count)")


def longest_distance(task: str, sizes: dict) -> int:
    """The longest trigger distance of the distance task (``max_middle + 1``); 0 for the count task."""
    return int(sizes["max_middle"]) + 1 if task == "distance" else 0
