"""The two synthetic classification tasks as integer token ids (0 = pad), one label per sequence.

* ``distance`` (position-sensitive): fillers, trigger 1, fillers, trigger 2, fillers; left and right filler runs
  ~ U{1..max_side}, middle ~ U{1..max_middle}; label = position of trigger 2 - position of trigger 1
  (= middle + 1). Sequences are right-padded to ``2 * max_side + max_middle + 2`` tokens.
* ``count`` (position-agnostic): n ~ U{0..max_count} trigger tokens (drawn with replacement from ids
  1..n_triggers) at random positions among fillers, ``seq_len`` tokens, label = n.

Fillers are drawn uniformly from the ids above the triggers, up to ``vocab_size - 1``. A seeded permutation puts
``test_fraction`` of the samples in the test split. Everything follows from the seed.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from posgen.experiments import TaskOptions
from posgen.store import provenance, write_netcdf

PAD = 0
TRAIN, TEST = 0, 1  # values of the ``split`` variable


def _fillers(rng: np.random.Generator, first_filler: int, vocab_size: int, shape) -> np.ndarray:
    if vocab_size <= first_filler:
        raise ValueError(
            f"synthetic.vocab_size: {vocab_size} leaves no filler token (triggers use ids < {first_filler})"
        )
    return rng.integers(first_filler, vocab_size, size=shape)


def distance_task(rng: np.random.Generator, n_samples: int, max_side: int, max_middle: int, vocab_size: int) -> dict:
    """Tokens (sample, token), labels, lengths and trigger positions of the distance task."""
    n_tokens = 2 * max_side + max_middle + 2
    left = rng.integers(1, max_side + 1, n_samples)  # (sample,)
    middle = rng.integers(1, max_middle + 1, n_samples)
    right = rng.integers(1, max_side + 1, n_samples)
    first = left  # filler tokens 0 .. left - 1 come before trigger 1
    second = left + middle + 1
    length = second + right + 1
    tokens = _fillers(rng, 3, vocab_size, (n_samples, n_tokens))  # ids 1 and 2 are the triggers
    rows = np.arange(n_samples)
    tokens[rows, first] = 1
    tokens[rows, second] = 2
    tokens[np.arange(n_tokens)[None, :] >= length[:, None]] = PAD
    return {
        "tokens": tokens,
        "label": second - first,
        "length": length,
        "first": first,
        "second": second,
        "n_classes": max_middle + 2,
    }


def count_task(
    rng: np.random.Generator, n_samples: int, seq_len: int, n_triggers: int, max_count: int, vocab_size: int
) -> dict:
    """Tokens (sample, token), labels and lengths of the count task."""
    if max_count > seq_len:
        raise ValueError(f"synthetic.count.max_count: {max_count} exceeds synthetic.count.seq_len {seq_len}")
    count = rng.integers(0, max_count + 1, n_samples)  # (sample,)
    tokens = _fillers(rng, n_triggers + 1, vocab_size, (n_samples, seq_len))
    # a uniformly random set of `count` positions per row: the ranks of iid uniforms below `count`
    rank = np.argsort(np.argsort(rng.random((n_samples, seq_len)), axis=1), axis=1)
    is_trigger = rank < count[:, None]
    triggers = rng.integers(1, n_triggers + 1, (n_samples, seq_len))
    tokens = np.where(is_trigger, triggers, tokens)
    return {"tokens": tokens, "label": count, "length": np.full(n_samples, seq_len), "n_classes": max_count + 1}


def make_task(task: str, options: dict, seed: int) -> xr.Dataset:
    """The task's data set (dims ``sample, token``) from the ``synthetic`` config section and a seed."""
    rng = np.random.default_rng([seed, ("distance", "count").index(task)])
    vocab_size = options["vocab_size"]
    if task == "distance":
        sizes = options["distance"]
        data = distance_task(rng, sizes["n_samples"], sizes["max_side"], sizes["max_middle"], vocab_size)
    elif task == "count":
        sizes = options["count"]
        data = count_task(
            rng, sizes["n_samples"], sizes["seq_len"], sizes["n_triggers"], sizes["max_count"], vocab_size
        )
    else:
        raise ValueError(f"synthetic.tasks: unknown task {task!r} (expected distance or count)")
    n_samples = len(data["label"])
    n_test = int(round(options["test_fraction"] * n_samples))
    split = np.full(n_samples, TRAIN, dtype=np.int8)
    split[rng.permutation(n_samples)[:n_test]] = TEST
    variables = {
        "tokens": (("sample", "token"), data["tokens"].astype(np.int32)),
        "label": ("sample", data["label"].astype(np.int32)),
        "length": ("sample", data["length"].astype(np.int32)),
        "split": ("sample", split, {"flag_values": [TRAIN, TEST], "flag_meanings": "train test"}),
    }
    for name in ("first", "second"):
        if name in data:
            variables[f"trigger_{name}"] = ("sample", data[name].astype(np.int32))
    attrs = provenance(
        task=task,
        data_seed=seed,
        n_classes=int(data["n_classes"]),
        vocab_size=vocab_size,
        pad_id=PAD,
        sizes=sizes,
        test_fraction=options["test_fraction"],
    )
    return xr.Dataset(variables, attrs=attrs)


def write_task(options: TaskOptions, path, config_hash: str = "") -> xr.Dataset:
    """Generate the task and write it to ``path`` (NetCDF), recording the job's config hash."""
    ds = make_task(options.task, options.section(), options.data_seed)
    ds.attrs["config_hash"] = config_hash
    write_netcdf(ds, path)
    return ds


def n_trigger_ids(data: xr.Dataset) -> int:
    """How many token ids (1..n) are triggers in a task's data set: 2 in the distance task, ``n_triggers`` in the
    count task."""
    if data.attrs["task"] == "distance":
        return 2
    return int(json.loads(data.attrs["sizes"])["n_triggers"])


def tasks_step(job) -> xr.Dataset:
    """Rule synthetic_tasks' job (a :class:`posgen.workflow.job.StepJob`)."""
    return write_task(TaskOptions.of_params(job.params), job.output["data"], job.params["config_hash"])
