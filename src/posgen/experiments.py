"""Named experiments of the second paper's family: one results dimension ``experiment``.

The ``synthetic`` config section holds the base settings (data, model, training, PEs, seeds); each entry of
``synthetic.experiments`` overrides some of them (``model`` and ``train`` key by key, the rest whole). Four
collections: ``synthetic.run`` (the experiments of ``make run``, gathered under ``results/synthetic/``) and three
named targets, each gathered under ``results/synthetic/<target>/``: ``deposit_study``, ``regime_study`` (brackets
toward the paper's budget and task size on a CPU), ``decisive_study`` (the decisive subset at the authors'
size, for GPU nodes) and ``decisive_gpu`` (the regime study's distance-71 arms with enough data per class, for one
GPU call). Every classifier lives at
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
import dataclasses
import re

# keys an experiment may override: merged key by key (dicts) or replaced (the rest)
MERGED_KEYS = ("model", "train", "distance", "count")
UNUSED = "unused"  # an experiment no collection trains, kept on purpose
REPLACED_KEYS = ("faithful", "rope_heads", "pes", "seeds", "tasks", "ablation_samples", "toeplitz_samples", "jobs")
# the collections: `run` (make run) and the named targets' studies (their folders: posgen.paths)
COLLECTIONS = ("run", "deposit_study", "regime_study", "decisive_study", "decisive_gpu")
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
        if key == UNUSED:  # says only that no collection trains it (posgen.config.check_overlays)
            continue
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


def _sorted(value):
    """``value`` with every dict's keys sorted (Snakemake compares params as text)."""
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, (list, tuple)):
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


# ------------------------------------------------------------------------------------------- job options
# What a task's data job (TaskOptions), a training job (TrainOptions) and an analysis job (AnalysisOptions) read,
# as frozen values built in one place from an experiment's resolved settings. A rule passes each option as a param
# of its own (``params()``, plain values, as the first paper's rules pass config leaves); the job rebuilds the
# value with ``of_params``. ``hashed()``: the nested form a job's config hash covers (posgen.workflow.synthetic).

# an experiment's settings a training job reads (its config hash covers exactly these)
MODEL_KEYS = ("n_layers", "n_heads", "d_model", "d_ff", "dropout")
SCHEDULE_KEYS = (
    "epochs",
    "batch_size",
    "lr",
    "weight_decay",
    "warmup_fraction",
    "betas",
    "ignore_index",
    "snapshots",
    "snapshot_samples",
    "precision",
    "ensemble",
)
SIZE_KEYS = {
    "distance": ("n_samples", "max_side", "max_middle"),
    "count": ("n_samples", "seq_len", "n_triggers", "max_count"),
}
DATA_KEYS = ("data_seed", "vocab_size", "test_fraction")
# a data job's params: the task, the data settings and the sizes of both tasks (those the task lacks: None)
TASK_PARAMS = ("task", *DATA_KEYS, *sorted({key for keys in SIZE_KEYS.values() for key in keys}))


@dataclasses.dataclass(frozen=True)
class ClassifierShape:
    """An encoder classifier's size (config ``synthetic.model``)."""

    n_layers: int
    n_heads: int
    d_model: int
    d_ff: int
    dropout: float


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How a classifier trains (config ``synthetic.train``): AdamW with warm-up then cosine decay
    (docs/method.md section 8.3)."""

    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_fraction: float
    betas: tuple[float, float]
    ignore_index: int | None
    snapshots: tuple[float, ...]
    snapshot_samples: int
    precision: str
    ensemble: bool

    def __post_init__(self):
        # config lists become tuples (hashable); the values stay as written, which the config hash reads
        object.__setattr__(self, "betas", tuple(self.betas))
        object.__setattr__(self, "snapshots", tuple(self.snapshots))

    @property
    def loss_ignore_index(self) -> int:
        """The label left out of the loss: -100 (none) unless ``ignore_index`` names one."""
        return -100 if self.ignore_index is None else int(self.ignore_index)


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """What one training job reads: the classifier's size, its schedule, faithful mode and the RoPE base."""

    model: ClassifierShape
    train: Schedule
    faithful: bool
    rope_base: float

    @classmethod
    def of_experiment(cls, options: dict) -> TrainOptions:
        """From an experiment's resolved settings (posgen.experiments.resolve)."""
        return cls(
            model=ClassifierShape(**{key: options["model"][key] for key in MODEL_KEYS}),
            train=Schedule(**{key: options["train"][key] for key in SCHEDULE_KEYS}),
            faithful=bool(options["faithful"]),
            rope_base=options["rope_base"],
        )

    def hashed(self) -> dict:
        """The nested form, keys sorted, the job's config hash covers."""
        return _sorted(
            {
                "model": dataclasses.asdict(self.model),
                "train": dataclasses.asdict(self.train),
                "faithful": self.faithful,
                "rope_base": self.rope_base,
            }
        )

    def params(self) -> dict:
        """Every option as a param of its own (the model's and the schedule's keys do not overlap)."""
        nested = self.hashed()
        return {**nested["model"], **nested["train"], "faithful": self.faithful, "rope_base": self.rope_base}

    @classmethod
    def of_params(cls, params) -> TrainOptions:
        """From a rule's params (a mapping holding every key of :meth:`params`)."""
        return cls(
            model=ClassifierShape(**{key: params[key] for key in MODEL_KEYS}),
            train=Schedule(**{key: params[key] for key in SCHEDULE_KEYS}),
            faithful=bool(params["faithful"]),
            rope_base=params["rope_base"],
        )


@dataclasses.dataclass(frozen=True)
class AnalysisOptions:
    """What one analysis job reads: the test samples of the single-head ablation (None: every one) and of the
    Toeplitz view of the logits."""

    ablation_samples: int | None
    toeplitz_samples: int

    @classmethod
    def of_experiment(cls, options: dict) -> AnalysisOptions:
        return cls(ablation_samples=options["ablation_samples"], toeplitz_samples=options["toeplitz_samples"])

    of_params = of_experiment

    def hashed(self) -> dict:
        return _sorted(dataclasses.asdict(self))

    params = hashed


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """What one task data job reads: the task, its generator sizes, the vocabulary, the test share and the seed."""

    task: str
    data_seed: int
    vocab_size: int
    test_fraction: float
    sizes: tuple[tuple[str, int], ...]  # (key, value) of SIZE_KEYS[task], keys sorted

    @classmethod
    def of_experiment(cls, options: dict, task: str) -> TaskOptions:
        """Task ``task`` of an experiment's resolved settings (its own sizes, where it sets them)."""
        if task not in SIZE_KEYS:
            raise ValueError(f"task {task!r}: not one of {', '.join(SIZE_KEYS)}")
        sizes = tuple((key, options[task][key]) for key in sorted(SIZE_KEYS[task]))
        return cls(task, *(options[key] for key in DATA_KEYS), sizes=sizes)

    @property
    def size(self) -> dict:
        return dict(self.sizes)

    def section(self) -> dict:
        """The settings as the ``synthetic`` section holds them, what :func:`posgen.synthetic.tasks.make_task`
        reads."""
        return {"vocab_size": self.vocab_size, "test_fraction": self.test_fraction, self.task: self.size}

    def params(self) -> dict:
        """Every option as a param of its own: the task, the data settings and the sizes of both tasks (None for
        the keys this task lacks), so that every data job's rule has the same params."""
        return {
            **dict.fromkeys(TASK_PARAMS),
            "task": self.task,
            **{key: getattr(self, key) for key in DATA_KEYS},
            **self.size,
        }

    @classmethod
    def of_params(cls, params) -> TaskOptions:
        task = params["task"]
        sizes = tuple((key, params[key]) for key in sorted(SIZE_KEYS[task]))
        return cls(task, *(params[key] for key in DATA_KEYS), sizes=sizes)
