"""Named experiments of the second paper's family: one results dimension ``experiment``.

The ``synthetic`` config section holds the base settings (data, model, training, PEs, seeds); each entry of
``synthetic.experiments`` overrides some of them (``model`` and ``train`` key by key, the rest whole). Four
collections: ``synthetic.run`` (the experiments of ``make run``, gathered under ``results/synthetic/``) and three
named targets, each gathered under ``results/synthetic/<target>/``: ``deposit_study``, ``regime_study`` (brackets
toward the paper's budget and task size on a CPU) and ``decisive_study`` (the decisive subset at the authors'
size, for GPU nodes). Every classifier lives at
``results/synthetic/<experiment>/<task>/<pe>/seed<S>/``, so clean and faithful results of one configuration sit
side by side, and adding an experiment trains only its own classifiers.

An experiment may set its own task sizes (``distance``, ``count``, key by key): it then trains on a data set of
its own, ``results/synthetic/tasks/<task>-<key><value>....nc`` (:func:`dataset`), named by the sizes that
differ from the base section's; experiments with the base sizes share ``<task>.nc``.

PE labels: ``partial-rope`` expands to one label per entry of ``rope_heads`` (``partial-rope-1``,
``partial-rope-2``, ``partial-rope-all``). Standard library only: the Snakefile imports this module.
"""

from __future__ import annotations

import copy
import re

# keys an experiment may override: merged key by key (dicts) or replaced (the rest)
MERGED_KEYS = ("model", "train", "distance", "count")
TASK_SIZE_KEYS = ("distance", "count")  # a task's generator sizes: an experiment's own sizes make its own data set
REPLACED_KEYS = ("faithful", "rope_heads", "pes", "seeds", "tasks", "ablation_samples", "toeplitz_samples", "jobs")
# the options a training job reads (its params and its config hash)
TRAIN_KEYS = ("model", "train", "faithful", "rope_base")
COLLECTIONS = {
    "run": "results/synthetic",
    "deposit_study": "results/synthetic/deposit_study",
    "regime_study": "results/synthetic/regime_study",
    "decisive_study": "results/synthetic/decisive_study",
}
_PARTIAL = re.compile(r"partial-rope-(\d+|all)$")


class ExperimentError(ValueError):
    """A config error naming the ``synthetic`` key at fault (one line)."""


def resolve(synthetic: dict, name: str) -> dict:
    """The full options of experiment ``name``: the base ``synthetic`` section with its overrides applied."""
    experiments = synthetic["experiments"]
    if name not in experiments:
        raise ExperimentError(f"config.synthetic.experiments: no experiment named {name!r}")
    overrides = experiments[name]
    options = {
        key: copy.deepcopy(value)
        for key, value in synthetic.items()
        if key not in ("experiments",) + tuple(COLLECTIONS)
    }
    for key, value in overrides.items():
        if key in MERGED_KEYS:
            options[key] = {**options[key], **value}
        elif key in REPLACED_KEYS:
            options[key] = copy.deepcopy(value)
        else:
            raise ExperimentError(f"config.synthetic.experiments.{name}.{key}: not an experiment setting")
    return options


def pe_labels(options: dict) -> list[str]:
    """The experiment's PE labels: ``partial-rope`` once per ``rope_heads`` entry."""
    labels = []
    for pe in options["pes"]:
        if pe == "partial-rope":
            labels += [f"partial-rope-{k}" for k in options["rope_heads"]]
        else:
            labels.append(pe)
    return labels


def parse_pe(label: str, n_heads: int) -> tuple[str, int]:
    """(registry name, heads with RoPE) of a PE label; ``rope_heads`` is n_heads for every other PE."""
    match = _PARTIAL.match(label)
    if match is None:
        return label, n_heads
    k = match.group(1)
    return "partial-rope", n_heads if k == "all" else int(k)


def classifiers(options: dict) -> list[tuple[str, str, int]]:
    """Every (task, pe label, seed) of an experiment, in the order of its gathered files."""
    return [(task, pe, seed) for task in options["tasks"] for pe in pe_labels(options) for seed in options["seeds"]]


def dataset(synthetic: dict, options: dict, task: str) -> str:
    """The data set an experiment's ``task`` trains on: ``task`` with the base section's sizes, else the task
    followed by each size that differs, e.g. ``distance-max_middle70-max_side25``."""
    base, own = synthetic[task], options[task]
    changed = sorted(key for key in own if own[key] != base.get(key))
    return task + "".join(f"-{key}{own[key]}" for key in changed)


def collection(synthetic: dict, which: str) -> list[str]:
    """The experiment names of collection ``which`` (a key of ``COLLECTIONS``)."""
    return list(synthetic[which])


def train_options(options: dict) -> dict:
    """The options a training job reads, keys sorted (Snakemake compares params as text)."""
    picked = {key: options[key] for key in TRAIN_KEYS}
    return _sorted(picked)


def _sorted(value):
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def check(synthetic: dict) -> None:
    """Cross-key rules of the ``synthetic`` section (one-line ExperimentError)."""
    for which in COLLECTIONS:
        for name in synthetic[which]:
            if name not in synthetic["experiments"]:
                raise ExperimentError(f"config.synthetic.{which}: {name!r} is not in synthetic.experiments")
    for name in synthetic["experiments"]:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in ("tasks", "figures", *COLLECTIONS):
            raise ExperimentError(
                f"config.synthetic.experiments.{name}: a name of letters, digits, '.', '_', '-' "
                f"(not tasks, figures or a collection: {', '.join(COLLECTIONS)})"
            )
        options = resolve(synthetic, name)
        model = options["model"]
        if model["d_model"] % model["n_heads"]:
            raise ExperimentError(
                f"config.synthetic.experiments.{name}.model.d_model: {model['d_model']} is not a multiple of "
                f"n_heads {model['n_heads']}"
            )
        for k in options["rope_heads"]:
            if k != "all" and not 0 <= k <= model["n_heads"]:
                raise ExperimentError(
                    f"config.synthetic.experiments.{name}.rope_heads: {k} not in 0..{model['n_heads']} (n_heads)"
                )
