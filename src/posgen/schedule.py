"""The learning-rate schedule both papers' trainers use (the second paper's classifiers, the trajectory's tiny
Llama; docs/method.md section 8.3): linear warm-up, then cosine decay to 0."""

from __future__ import annotations

import math


def warmup_cosine(step: int, total: int, warmup: int) -> float:
    """The learning rate over its peak at optimiser step ``step`` (0-based) of ``total``: ``(step + 1) / warmup``
    over the first ``warmup`` steps, then ``(1 + cos(pi p)) / 2`` with p the share of the remaining steps taken."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(step - warmup, span) / span))  # 0 from the end on
