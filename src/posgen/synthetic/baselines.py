"""Rules that need no position, fitted on the train split and scored on the test split: the floor every
classifier's accuracy is read against (docs/method.md section 8.2).

* ``majority``: the train split's most frequent label, for every sample;
* ``length``: the most frequent train label of each sequence length (the majority for a length never seen).
  In the distance task the length leaks part of the distance, and a model without position (NoPE, pooling
  real tokens only) can still read the length from the pooled average, so this, not the majority class, is the
  floor a positional encoding must beat;
* ``bag``: the most frequent train label of each trigger-token count (how many tokens of the sample are
  triggers, whatever their positions): a position-agnostic rule; it solves the count task exactly and says
  nothing about the distance task, whose samples all hold two triggers.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from posgen.synthetic.tasks import n_trigger_ids

BASELINES = ("majority", "length", "bag")


def lookup_rule(train_key: np.ndarray, train_label: np.ndarray, test_key: np.ndarray) -> np.ndarray:
    """Predictions for ``test_key``: the most frequent train label of each key (smallest label on ties), the
    train split's most frequent label for a key never seen in training."""
    fallback = np.bincount(train_label).argmax()
    best = {}
    for key in np.unique(train_key):
        best[key] = np.bincount(train_label[train_key == key]).argmax()
    return np.array([best.get(key, fallback) for key in test_key])


def baselines(data: xr.Dataset, train: int, test: int) -> dict[str, float]:
    """Test accuracy of each rule of ``BASELINES`` on a task's data set."""
    split = np.asarray(data["split"].values)
    label = np.asarray(data["label"].values)
    tokens = np.asarray(data["tokens"].values)
    keys = {
        "majority": np.zeros(len(label), dtype=np.int64),
        "length": np.asarray(data["length"].values),
        "bag": ((tokens >= 1) & (tokens <= n_trigger_ids(data))).sum(1),
    }
    is_train, is_test = split == train, split == test
    return {
        name: float((lookup_rule(key[is_train], label[is_train], key[is_test]) == label[is_test]).mean())
        for name, key in keys.items()
    }
