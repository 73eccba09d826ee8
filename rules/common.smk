import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

# The library lives beside the workflow; make it importable without an install.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from posgen.config import (  # noqa: E402
    ConfigError,
    job_hash,
    leaf,
    model_entry,
    trajectory_models,
    validate as validate_config,
    variants,
)
from posgen.figure_table import (  # noqa: E402
    FIGURES as FIGURE_TABLE,
    REGIME_FIGURES,
    STUDY_FIGURES,
    TRAJECTORY_FIGURES,
)
from posgen.trajectory import heatmap_variants  # noqa: E402

# The workflow's shape (posgen.workflow): path templates, model jobs, shards, what `all` builds.
from posgen.workflow import (  # noqa: E402
    BANDS,
    BLOCK_SWAP,
    CAP,
    DECOMPOSITION,
    EXAMPLES,
    FUSED_TABLES,
    GAP_ORIGIN,
    GATHERED,
    HEAD_ABLATION,
    INTERVALS,
    MANIFEST,
    MODEL_PRIORITY,
    MODEL_SUMMARY,
    MODEL_THREADS,
    MODELS_DIR,
    PERTURB,
    QK,
    REPRODUCTION,
    SHARD_TABLE,
    SUMMARY_TABLE,
    SYN_CLASSIFIER_DIR,
    SYN_DECISIVE,
    SYN_PARTS,
    SYN_REGIME,
    SYN_STUDY,
    TABLE,
    TRAINING_LOG,
    TRAJECTORY_TABLE,
    WINDOWS,
    figure_shard,
    figure_wildcards,
    is_fused,
    shard_table,
    shards_of,
    step_leaves,
    step_variants,
)

try:
    # paths only in the main process: a cluster job's node may not see the login node's local files
    validate_config(
        config, Path(workflow.basedir) / "schemas" / "config.schema.yaml", check_paths=workflow.is_main_process
    )
except ConfigError as err:
    # one line, not Snakemake's traceback of the Snakefile
    sys.exit(f"ConfigError: {err}")

MODELS = [m["name"] for m in config["models"]]
VARIANTS = variants(config)
# Checkpoint series (config `trajectory.models`): their variants are step<N> (variants(config, model)); they go
# through the same per-variant rules, but only the `trajectory` target (rules/trajectory.smk) asks for them.
TRAJECTORY_MODELS = trajectory_models(config)

# Shards (config `shards`, docs/slurm.md): each (model, variant)'s windows, and its perturbation windows, split into
# contiguous ranges `<start>-<stop>`, one job each; rule gather merges them along `sample`. The fused path
# (extract.analysis) computes decomposition.nc and bands.nc inside each extraction job.
FUSED = is_fused(config)
# the shard whose qk.h5 holds the example heads' window
FIGURE_SHARD = figure_shard(config)


wildcard_constraints:
    model="|".join(re.escape(m) for m in MODELS + TRAJECTORY_MODELS),
    variant=r"trained|random-seed\d+|step\d+",
    shard=r"\d+-\d+",


def over_variants(template):
    """An input function: ``template`` for every variant of the job's own model (variants(config, model))."""

    def paths(wildcards):
        return expand(template, model=wildcards.model, variant=variants(config, wildcards.model))

    return paths


def shard_files(wildcards):
    """The per-shard files of a gathered table: perturb and cap over the perturbation windows' shards."""
    return expand(SHARD_TABLE, shard=shards_of(GATHERED[wildcards.table], config), **wildcards)


def entry_key(key, default=""):
    """A params function: ``key`` of the job's own `models` entry (e.g. device_map)."""

    def value(wildcards):
        return model_entry(config, wildcards.model).get(key, default)

    return value


def hash_of(leaves, per_model=True):
    """A params function: the job's config hash over ``leaves`` plus (``per_model``) its model's entry."""

    def job_config_hash(wildcards):
        return job_hash(config, leaves, wildcards.model if per_model else None)

    return job_config_hash


def params_of(step, per_model=True):
    """A rule's params: every config leaf ``step`` reads (posgen.workflow.STEP_LEAVES) under its param name, and
    config_hash over exactly those leaves plus (``per_model``) the job's own model entry. Rules pass leaves, not
    whole sections: Snakemake compares params by their text, in which a section's key order would count."""
    named = step_leaves(step, config)
    values = {name: leaf(config, path) for name, path in named.items()}
    return {**values, "config_hash": hash_of(list(named.values()), per_model)}


def canonical(section):
    """A config section as params with its keys sorted at every level: Snakemake compares params as text, so
    the key order of the config file must not rerun a job."""
    return json.loads(json.dumps(section, sort_keys=True))


def own_model_entry(wildcards):
    """The job's own `models` entry (never the whole list), keys sorted: Snakemake compares params by their
    text, so the order of the keys in the config file must not matter."""
    return dict(sorted(model_entry(config, wildcards.model).items()))


# Figure rules (rules/figures.smk, one per row of posgen.figure_table).
def figure_inputs(row):
    """The row's inputs: wildcards of its scope kept, every other one expanded over its values in the workflow's
    order (posgen.workflow.figure_wildcards: the variants of the step the figure reads)."""
    each = figure_wildcards(config, row)
    over = {name: each[name] for name in row.expanded()}
    return {role: expand(template, **over, allow_missing=True) for role, template in row.inputs.items()}


def figure_hash(row):
    """The params function of a figure's config hash: what its params read."""
    leaves = ["random_init_seeds"] if "variant" in row.expanded() else []
    leaves += list(INTERVALS.values()) if row.bootstrap else []
    return hash_of(leaves, per_model="model" in row.wildcards)


# Training trajectories (rules/trajectory.smk): the models the workflow trains itself, the leaves of the per-step
# table, and the input functions of the trajectory figures.
TRAIN_MODELS = [m["name"] for m in config["trajectory"]["models"] if m["source"] == "train"]


def training_log(wildcards):
    """training.nc of a model trained by the workflow; a hub series has none."""
    return TRAINING_LOG.format(model=wildcards.model) if wildcards.model in TRAIN_MODELS else []


def trajectory_figure_variants(row):
    """The variants a trajectory figure reads, a function of the job's model."""
    if "variant" not in row.expanded():
        return lambda wildcards: []
    return lambda wildcards: heatmap_variants(variants(config, wildcards.model))


def trajectory_figure_inputs(row):
    """Input functions of a trajectory figure: the row's templates for the job's model and its variants."""
    pick = trajectory_figure_variants(row)

    def role_paths(template):
        return lambda wildcards: expand(template, model=wildcards.model, variant=pick(wildcards))

    return {role: role_paths(template) for role, template in row.inputs.items()}


# The second paper's family (rules/synthetic.smk, rules/deposit_study.smk; posgen.experiments): the
# experiments of both collections with their resolved settings, and the params and input functions of its rules.
from posgen.config import config_hash as _hash_of_options
from posgen.experiments import COLLECTIONS, classifiers, dataset, pe_labels, resolve, train_options

SYN = config["synthetic"]
SYN_DATA_KEYS = ["data_seed", "vocab_size", "test_fraction", "distance", "count"]
SYN_DATA = canonical({key: SYN[key] for key in SYN_DATA_KEYS})
# every experiment named by a collection, with its resolved settings
SYN_EXPERIMENTS = {name: resolve(SYN, name) for which in COLLECTIONS for name in SYN[which]}
SYN_TASKS = sorted({task for options in SYN_EXPERIMENTS.values() for task in options["tasks"]})
SYN_PES = sorted({pe for options in SYN_EXPERIMENTS.values() for pe in pe_labels(options)})
# the task data sets (posgen.experiments.dataset): name -> (task, the data settings its job reads);
# experiments with their own task sizes get their own
SYN_DATASETS = {
    dataset(SYN, options, task): (task, canonical({**SYN_DATA, task: options[task]}))
    for options in SYN_EXPERIMENTS.values()
    for task in options["tasks"]
}
SYN_TASK_DATA = "results/synthetic/tasks/{dataset}.nc"
# experiments whose classifiers go into one training and one analysis job per task (synthetic.jobs: task); of the
# rest, those whose seeds train as one ensemble job (synthetic.train.ensemble), and the others (a job per seed)
SYN_BY_TASK = [name for name, options in SYN_EXPERIMENTS.items() if options["jobs"] == "task"]
SYN_ENSEMBLES = [
    name for name, options in SYN_EXPERIMENTS.items() if options["train"]["ensemble"] and name not in SYN_BY_TASK
]
SYN_SOLO = [name for name in SYN_EXPERIMENTS if name not in SYN_ENSEMBLES + SYN_BY_TASK]


wildcard_constraints:
    experiment="|".join(re.escape(name) for name in SYN_EXPERIMENTS) or "none",
    task="|".join(SYN_TASKS),
    dataset="|".join(re.escape(name) for name in SYN_DATASETS) or "none",
    pe="|".join(re.escape(pe) for pe in SYN_PES),
    seed=r"\d+",


def syn_fixed(experiment):
    """Wildcards -> the same wildcards with ``experiment`` set: an ensemble rule's experiment is in its name."""
    return lambda w: SimpleNamespace(**dict(w.items()), experiment=experiment)


def syn_seed_files(experiment, name):
    """Per-seed files ``name`` of one experiment's (task, pe) (``{task}``, ``{pe}`` left as wildcards)."""
    seeds = SYN_EXPERIMENTS[experiment]["seeds"]
    return expand(f"{SYN_CLASSIFIER_DIR}/{name}", experiment=experiment, seed=seeds, allow_missing=True)


def syn_task_files(experiment, name):
    """Files ``name`` of every (pe, seed) of one experiment's task (``{task}`` left as a wildcard), PE-major in
    the order of syn_task_classifiers."""
    folder = SYN_CLASSIFIER_DIR.replace("{experiment}", experiment)
    return [
        f"{folder}/{name}".replace("{pe}", pe).replace("{seed}", str(seed))
        for pe, seed in syn_task_classifiers(experiment)
    ]


def syn_task_classifiers(experiment):
    """[pe, seed] of every classifier of one task of ``experiment`` (a params value: lists, not tuples)."""
    options = SYN_EXPERIMENTS[experiment]
    return [[pe, seed] for pe in pe_labels(options) for seed in options["seeds"]]


def syn_dataset(experiment, task):
    return dataset(SYN, SYN_EXPERIMENTS[experiment], task)


def syn_task_data(wildcards):
    """The data set file a classifier of (experiment, task) trains on."""
    return SYN_TASK_DATA.format(dataset=syn_dataset(wildcards.experiment, wildcards.task))


def syn_train_options(wildcards):
    return train_options(SYN_EXPERIMENTS[wildcards.experiment])


def syn_analysis_options(wildcards):
    options = SYN_EXPERIMENTS[wildcards.experiment]
    return {key: options[key] for key in ("ablation_samples", "toeplitz_samples")}


def syn_hash(*parts):
    """A params function: the hash of the data settings and the experiment's ``parts`` (train, analysis)."""

    def job_config_hash(wildcards):
        picked = {
            "data": SYN_DATASETS[syn_dataset(wildcards.experiment, wildcards.task)][1],
            "device": config["device"],
        }
        for part in parts:
            picked[part.__name__] = part(wildcards)
        return _hash_of_options(picked)

    return job_config_hash


def syn_classifier_files(which, name):
    """Per-classifier files ``name`` of every experiment of collection ``which``."""
    return [
        f"{SYN_CLASSIFIER_DIR}/{name}".format(experiment=experiment, task=task, pe=pe, seed=seed)
        for experiment in SYN[which]
        for task, pe, seed in classifiers(SYN_EXPERIMENTS[experiment])
    ]


def syn_keys(which):
    return [[experiment, *key] for experiment in SYN[which] for key in classifiers(SYN_EXPERIMENTS[experiment])]


def syn_task_keys(which):
    """Every (experiment, task) of collection ``which`` and its data set file, for the baselines."""
    pairs = [(experiment, task) for experiment in SYN[which] for task in SYN_EXPERIMENTS[experiment]["tasks"]]
    return pairs, [SYN_TASK_DATA.format(dataset=syn_dataset(*pair)) for pair in pairs]


def study_summary_if_built(wildcards):
    """The deposit study's summary and per-classifier table for the reproduction table: when this run builds the
    study (target `deposit_study`) or an earlier run did; `make run` on a fresh clone neither waits for it nor
    builds it."""
    paths = [f"{SYN_STUDY}/summary.csv", f"{SYN_STUDY}/classifiers.csv"]
    if "deposit_study" in workflow.dag_settings.targets or all(Path(p).exists() for p in paths):
        return paths
    return []
