"""The second paper's jobs as the workflow sees them (rules/synthetic.smk): every experiment of the config's
collections with its resolved settings (posgen.experiments), the task data sets, the job unit of each experiment
and the files, params and config hashes of its jobs.

Job units (config ``synthetic.jobs`` and ``train.ensemble``): ``classifier``, one training and one analysis job per
(experiment, task, pe, seed); ``ensemble``, one training job per (experiment, task, pe) trains every seed as one
batched ensemble (analysis per classifier); ``task``, one training and one analysis job per (experiment, task)
runs every PE and seed in turn. Standard library only.
"""

from __future__ import annotations

import json

from posgen import paths
from posgen.config import config_hash
from posgen.experiments import (
    COLLECTIONS,
    TASK_PARAMS,
    AnalysisOptions,
    TaskOptions,
    TrainOptions,
    classifiers,
    dataset,
    pe_labels,
    resolve,
)

DATA_KEYS = ("data_seed", "vocab_size", "test_fraction", "distance", "count")
UNITS = ("classifier", "ensemble", "task")


def _canonical(value):
    return json.loads(json.dumps(value, sort_keys=True))


class SyntheticPlan:
    """The second paper's jobs of one validated config."""

    def __init__(self, config: dict):
        self.section = config["synthetic"]
        self.device = config["device"]
        # the family's data settings (a data job's hash: these, with its own task's sizes)
        self.data = _canonical({key: self.section[key] for key in DATA_KEYS})
        self.experiments = {name: resolve(self.section, name) for which in COLLECTIONS for name in self.section[which]}
        self.tasks = sorted({task for options in self.experiments.values() for task in options["tasks"]})
        self.pes = sorted({pe for options in self.experiments.values() for pe in pe_labels(options)})
        # data set name -> (task, its data settings)
        self.datasets = {
            dataset(self.section, options, task): (task, _canonical({**self.data, task: options[task]}))
            for options in self.experiments.values()
            for task in options["tasks"]
        }

    # ------------------------------------------------------------------------------------------------ units

    def unit(self, experiment: str) -> str:
        """The job unit of ``experiment`` (one of UNITS)."""
        options = self.experiments[experiment]
        if options["jobs"] == "task":
            return "task"
        return "ensemble" if options["train"]["ensemble"] else "classifier"

    def with_unit(self, *units: str) -> list[str]:
        """The experiments whose job unit is one of ``units``."""
        return [name for name in self.experiments if self.unit(name) in units]

    def unit_classifiers(self, experiment: str) -> list[list]:
        """[pe, seed] of every classifier one job of ``experiment``'s unit trains beyond the wildcards it keeps:
        every (pe, seed) of a task, or every seed of a (task, pe) with ``{pe}`` left as it is."""
        options = self.experiments[experiment]
        if self.unit(experiment) == "task":
            return [[pe, seed] for pe in pe_labels(options) for seed in options["seeds"]]
        return [["{pe}", seed] for seed in options["seeds"]]

    def unit_files(self, experiment: str, template: str) -> list[str]:
        """``template`` (a paths.CLASSIFIER_DIR file) of every classifier of one job of ``experiment``'s unit, its
        ``{task}`` (and for an ensemble ``{pe}``) left as wildcards, in the order of :meth:`unit_classifiers`."""
        return [
            template.replace("{experiment}", experiment).replace("{pe}", pe).replace("{seed}", str(seed))
            for pe, seed in self.unit_classifiers(experiment)
        ]

    # ----------------------------------------------------------------------------------------------- files

    def dataset_of(self, experiment: str, task: str) -> str:
        return dataset(self.section, self.experiments[experiment], task)

    def task_data(self, experiment: str, task: str) -> str:
        """The data set file the classifiers of (experiment, task) train on."""
        return paths.TASK_DATA.format(dataset=self.dataset_of(experiment, task))

    def collection_keys(self, which: str) -> list[list]:
        """[experiment, task, pe, seed] of every classifier of collection ``which``."""
        return [[name, *key] for name in self.section[which] for key in classifiers(self.experiments[name])]

    def collection_files(self, which: str, template: str) -> list[str]:
        """``template`` (a paths.CLASSIFIER_DIR file) of every classifier of collection ``which``."""
        return [paths.classifier_file(template, *key) for key in self.collection_keys(which)]

    def collection_tasks(self, which: str) -> tuple[list[list[str]], list[str]]:
        """Every [experiment, task] of collection ``which`` and the data set file of each."""
        pairs = [[name, task] for name in self.section[which] for task in self.experiments[name]["tasks"]]
        return pairs, [self.task_data(*pair) for pair in pairs]

    # --------------------------------------------------------------------------------------- options, params

    def train_options(self, experiment: str) -> TrainOptions:
        return TrainOptions.of_experiment(self.experiments[experiment])

    def analysis_options(self, experiment: str) -> AnalysisOptions:
        return AnalysisOptions.of_experiment(self.experiments[experiment])

    def task_options(self, name: str) -> TaskOptions:
        task, settings = self.datasets[name]
        return TaskOptions.of_experiment(settings, task)

    def job_hash(self, experiment: str, task: str, *parts: str) -> str:
        """A training (``parts`` train) or analysis (train, analysis) job's config hash: its data set's settings,
        the device and the experiment's options it reads."""
        picked = {"data": self.datasets[self.dataset_of(experiment, task)][1], "device": self.device}
        if "train" in parts:
            picked["syn_train_options"] = self.train_options(experiment).hashed()
        if "analysis" in parts:
            picked["syn_analysis_options"] = self.analysis_options(experiment).hashed()
        return config_hash(picked)

    def params(self, step: str, experiment: str | None = None) -> dict:
        """The params of ``step``'s rule (posgen.workflow.steps.params_of): fixed to ``experiment`` for a unit rule
        of its own, else functions of the job's wildcards."""
        if step == "synthetic_tasks":
            return self._task_params()
        if step in ("synthetic_train", "synthetic_analyse"):
            return self._classifier_params(step, experiment)
        if step == "synthetic_gather":
            return {
                "classifiers": lambda w: self.collection_keys(paths.collection_name(w.collection)),
                "tasks": lambda w: self.collection_tasks(paths.collection_name(w.collection))[0],
                "config_hash": lambda w: config_hash(
                    {"data": self.data, "keys": self.collection_keys(paths.collection_name(w.collection))}
                ),
            }
        if step == "synthetic_summary":
            return {"config_hash": config_hash({})}
        if step == "synthetic_verdicts":
            return {"title": lambda w: f"Verdicts of the collection {paths.collection_name(w.collection)}"}
        raise KeyError(f"step {step!r}: not a step of the second paper")

    def _task_params(self) -> dict:
        out = {key: (lambda w, key=key: self.task_options(w.dataset).params()[key]) for key in TASK_PARAMS}
        out["config_hash"] = lambda w: config_hash(self.datasets[w.dataset][1])
        return out

    def _classifier_params(self, step: str, experiment: str | None) -> dict:
        """A training or analysis rule's params: the experiment, its classifiers in output order, its options (one
        param each), the device and the config hash. ``experiment`` None: the per-classifier rule."""

        def name(w):
            return experiment or w.experiment

        if experiment is None:
            chosen = lambda w: [[w.pe, int(w.seed)]]  # noqa: E731
        elif self.unit(experiment) == "task":
            chosen = self.unit_classifiers(experiment)
        else:
            chosen = lambda w: [[w.pe, seed] for _, seed in self.unit_classifiers(experiment)]  # noqa: E731
        parts = ("train",) if step == "synthetic_train" else ("train", "analysis")
        kind = TrainOptions if step == "synthetic_train" else AnalysisOptions

        def options(of: str) -> dict:  # the experiment ``of``'s options, one param each
            return kind.of_experiment(self.experiments[of]).params()

        keys = options(next(iter(self.experiments))) if self.experiments else {}
        out = {
            "experiment": experiment if experiment else (lambda w: w.experiment),
            "classifiers": chosen,
            **{key: (lambda w, key=key: options(name(w))[key]) for key in keys},
            "device": self.device,
            "config_hash": lambda w: self.job_hash(name(w), w.task, *parts),
        }
        return out


def unit_resources(plan: SyntheticPlan, experiment: str, step: str) -> dict:
    """Memory (MB) and runtime (minutes) a unit job asks for: per classifier it trains or analyses."""
    n = len(plan.unit_classifiers(experiment))
    if step == "synthetic_train":
        ensemble = plan.unit(experiment) == "ensemble"
        return {"mem_mb": 2000 + 500 * n if ensemble else 2000, "runtime": 60 * n}
    return {"mem_mb": 2000, "runtime": 30 * n}


def rule_name(step: str, experiment: str, plan: SyntheticPlan) -> str:
    """The name of ``experiment``'s own unit rule of ``step``, e.g. ``synthetic_train_task_clean``."""
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in experiment)
    return f"{step}_{plan.unit(experiment)}_{safe}"
