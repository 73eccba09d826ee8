"""The workflow's shape, read by the Snakefile, rules/*.smk and posgen.plan: the config leaves each step reads,
the path templates of its files, the model jobs (threads, priorities, the windows each reads, their shards), the
rules of the fused and the store path, and what rule `all` builds (:func:`final_outputs`).

Light on purpose: the Snakefile imports it while parsing, in an environment that may hold snakemake alone
(no torch, transformers, xarray, h5py, h5netcdf; tests/workflow/test_workflow.py checks it).
"""

from __future__ import annotations

import itertools
import re

from posgen.config import variants
from posgen.experiments import COLLECTIONS
from posgen.figure_table import FIGURES

# --------------------------------------------------------------------------------------------- config leaves


def leaves(*paths: str, **named: str) -> dict[str, str]:
    """{param name: dotted config leaf}: each of ``paths`` under its last key, each of ``named`` under its name."""
    names = [path.rpartition(".")[2] for path in paths] + list(named)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"leaves: two leaves under the param name(s) {', '.join(twice)}")
    return {**{path.rpartition(".")[2]: path for path in paths}, **named}


INTERVALS = leaves(n_boot="intervals.bootstrap", seed="intervals.seed")

# The config leaves each step reads, once: a rule passes exactly these as params and its job's `config_hash`
# covers exactly these plus its own model's `models` entry (rules/common.smk: params_of), so editing any other
# key (a figure setting, another model) neither changes the hash nor reruns the job. Defaults live in the schema
# only (schemas/config.schema.yaml); the library's functions take every leaf as a required keyword argument.
STEP_LEAVES = {
    "windows": leaves("corpus.source", "n_samples", "seq_len", seed="window_seed", heldout="heldout_windows"),
    "extract": leaves(
        "dtype",
        "device",
        "extract.ref_samples",
        "extract.ref_layers",
        "extract.check_rtol",
        "extract.check_tokens",
        "extract.transparency_tokens",
        "extract.transparency_rtol",
        "extract.compression",
        "extract.analysis",
        "extract.keep_qk",
        "extract.qk_dtype",
    ),
    "decompose": leaves(
        "decomposition.dummy_distances",
        "decomposition.dummy_distance",
        "decomposition.lstsq_tol",
        "decomposition.precision",
        "decomposition.bound_rows",
        "decomposition.bound_samples",
        "device",
    ),
    "bands": leaves(),
    "perturb": leaves(
        "perturb.n_samples",
        "perturb.seq_len",
        "perturb.rates",
        "perturb.seed",
        "perturb.jitter",
        "decomposition.dummy_distance",
        "dtype",
        "device",
    ),
    "cap": leaves(
        "perturb.n_samples",
        "perturb.seq_len",
        "decomposition.dummy_distance",
        "dtype",
        "device",
        distance_caps="perturb.caps",
    ),
    "head_ablation": leaves(
        "head_ablation.n_samples",
        "head_ablation.seq_len",
        "head_ablation.probe_samples",
        "head_ablation.probe_period",
        "head_ablation.seed",
        "head_ablation.probes",
        "dtype",
        "device",
    ),
    "examples": leaves("figures.sample", "figures.map_tokens", "figures.pool_pairs", "figures.seed"),
    "block_swap": leaves(),  # its settings are constants of posgen.llm.block_swap, fixed before any result
    "summarize": INTERVALS,
    "synthetic_summary": {},  # t intervals over seeds: no resampling settings
    "train_trajectory": leaves(source="corpus.source"),
    "trajectory_table": leaves("trajectory.sensitivity_rates", **INTERVALS),
}


def step_leaves(step: str, config: dict) -> dict[str, str]:
    """The leaves ``step`` reads under ``config``: the fused extraction (extract.analysis: fused) also reads what
    the decompose and bands jobs read, since it writes their files."""
    out = dict(STEP_LEAVES[step])
    if step == "extract" and config["extract"]["analysis"] == "fused":
        for other in ("decompose", "bands"):
            for name, path in STEP_LEAVES[other].items():
                if out.setdefault(name, path) != path:
                    raise ValueError(f"step_leaves: param {name!r} of extract and {other} reads two leaves")
    return out


# ---------------------------------------------------------------------------------------------- path templates

MODELS_DIR = "resources/models"
MANIFEST = f"{MODELS_DIR}/{{model}}/manifest.json"
WINDOWS = "results/{model}/windows.h5"
# a model job's shard of windows (`shards`), and the tables rule gather merges from its shards along `sample`
SHARD_DIR = "results/{model}/{variant}/shards/{shard}"
QK = f"{SHARD_DIR}/qk.h5"
SHARD_TABLE = f"{SHARD_DIR}/{{table}}.nc"
TABLE = "results/{model}/{variant}/{table}.nc"
DECOMPOSITION = "results/{model}/{variant}/decomposition.nc"
BANDS = "results/{model}/{variant}/bands.nc"
PERTURB = "results/{model}/{variant}/perturb.nc"
CAP = "results/{model}/{variant}/cap.nc"
HEAD_ABLATION = "results/{model}/{variant}/head_ablation.nc"
EXAMPLES = "results/{model}/{variant}/examples.nc"
BLOCK_SWAP = "results/{model}/{variant}/block_swap.nc"
MODEL_SUMMARY = {"csv": "results/{model}/summary.csv", "nc": "results/{model}/summary.nc"}
SUMMARY_TABLE = "results/summary.csv"
GAP_ORIGIN = "results/gap_origin.md"  # the position study's answer (target `position_study`)
# training trajectories (target `trajectory`): the log of a model trained by the workflow, the per-step table
TRAINING_LOG = "results/{model}/training.nc"
TRAJECTORY_TABLE = {"csv": "results/{model}/trajectory.csv", "nc": "results/{model}/trajectory.nc"}
REPRODUCTION = {
    "csv": "results/reproduction.csv",
    "md": "results/reproduction.md",
    "synthetic_csv": "results/reproduction_synthetic.csv",
}
# the second paper's family: one folder per classifier, the gathered parts and summary of each collection
SYN_CLASSIFIER_DIR = "results/synthetic/{experiment}/{task}/{pe}/seed{seed}"
SYN_PARTS = ["training", "ablation", "toeplitz", "probe"]
SYN_STUDY = COLLECTIONS["deposit_study"]
SYN_REGIME = COLLECTIONS["regime_study"]
SYN_DECISIVE = COLLECTIONS["decisive_study"]


def shard_table(table: str) -> str:
    """The template of one shard's ``table`` (decomposition, bands, perturb, cap), before rule gather."""
    return f"{SHARD_DIR}/{table}.nc"


def syn_outputs(which: str) -> list[str]:
    """The gathered parts, the tables and the verdicts of collection ``which`` (a key of ``COLLECTIONS``)."""
    folder = COLLECTIONS[which]
    tables = ("summary.csv", "classifiers.csv", "verdicts.md")
    return [f"{folder}/{part}.nc" for part in SYN_PARTS] + [f"{folder}/{name}" for name in tables]


# ------------------------------------------------------------------------------------------------ model jobs

# The jobs that run a model (or read its q/k) per (model, variant) and shard: what posgen.plan prices.
MODEL_JOB_RULES = ("extract", "decompose", "bands", "perturb", "cap", "head_ablation")
GPU_RULES = ("extract", "decompose", "perturb", "cap", "head_ablation")  # bands reads q/k on the CPU
# rules only the store path runs (extract.analysis: store); the fused extraction writes their tables itself
STORE_RULES = ("decompose", "bands")
# CPU threads of each model job. One: a model job is parallel across jobs (variants, shards), and on a 2-core
# machine two 1-thread jobs side by side finish 23 % sooner than the same jobs one after another with 2 threads
# (docs/results.md, "make run"). GPU jobs ask for their CPUs apart (profiles/slurm); a workstation running one big
# model locally raises it with `--set-threads extract=8`.
MODEL_THREADS = 1
# Which ready model job starts first when cores are short (Snakemake `priority`): the longest first, so that a run
# ends on short jobs, not on a 2-minute perturbation beside an idle core (docs/results.md, "make run").
MODEL_PRIORITY = {"perturb": 4, "extract": 3, "head_ablation": 2, "cap": 1}
# gathered table -> the rule whose shards write it
GATHERED = {"decomposition": "extract", "bands": "extract", "perturb": "perturb", "cap": "cap"}
# the tables the fused extraction writes beside q/k (the store path: rules decompose and bands)
FUSED_TABLES = ("decomposition", "bands")


def is_fused(config: dict) -> bool:
    """The fused path (extract.analysis: fused): the extraction job writes decomposition.nc and bands.nc too."""
    return config["extract"]["analysis"] == "fused"


def planned_rules(config: dict) -> tuple[str, ...]:
    """The model-job rules ``config`` runs, in MODEL_JOB_RULES order."""
    return tuple(rule for rule in MODEL_JOB_RULES if not (is_fused(config) and rule in STORE_RULES))


def rule_windows(rule: str, config: dict) -> int:
    """The windows a job of ``rule`` reads, all shards together: perturb and cap their own ``perturb.n_samples``,
    head_ablation its ``head_ablation.n_samples`` (one job, not sharded), the others ``n_samples``."""
    if rule in ("perturb", "cap"):
        return config["perturb"]["n_samples"]
    if rule == "head_ablation":
        return config["head_ablation"]["n_samples"]
    return config["n_samples"]


def rule_shards(rule: str, config: dict) -> list[tuple[int, int]]:
    """The window ranges of ``rule``'s jobs of one (model, variant): config ``shards`` of them, at most one window
    each. head_ablation is one job: its per-layer statistics of means over both probes cannot be gathered."""
    total = rule_windows(rule, config)
    if rule == "head_ablation":
        return [(0, total)]
    return shard_ranges(total, min(config["shards"], total))


def shards_of(rule: str, config: dict) -> list[str]:
    """The shard names of ``rule``'s jobs (the ``shard`` wildcard)."""
    return [f"{start}-{stop}" for start, stop in rule_shards(rule, config)]


def figure_shard(config: dict) -> str:
    """The shard whose qk.h5 holds the example heads' window (figures.sample)."""
    return shard_of(config["figures"]["sample"], config["n_samples"], config["shards"])


# ---------------------------------------------------------------------------------------------------- shards

SHARD_NAME = re.compile(r"(\d+)-(\d+)")


def shard_ranges(n_samples: int, n_shards: int) -> list[tuple[int, int]]:
    """``n_shards`` contiguous ranges covering ``range(n_samples)``, sizes differing by at most one (the first
    ``n_samples % n_shards`` one window longer)."""
    if not 1 <= n_shards <= n_samples:
        raise ValueError(f"shards: {n_shards} must be between 1 and the {n_samples} windows")
    size, longer = divmod(n_samples, n_shards)
    stops = list(itertools.accumulate(size + (i < longer) for i in range(n_shards)))
    return list(zip([0] + stops[:-1], stops))


def shard_names(n_samples: int, n_shards: int) -> list[str]:
    return [f"{start}-{stop}" for start, stop in shard_ranges(n_samples, n_shards)]


def parse_shard(name: str) -> tuple[int, int]:
    """``'<start>-<stop>'`` -> (start, stop)."""
    match = SHARD_NAME.fullmatch(name)
    if not match or int(match[1]) >= int(match[2]):
        raise ValueError(f"shard {name!r}: not a window range <start>-<stop>")
    return int(match[1]), int(match[2])


def shard_of(sample: int, n_samples: int, n_shards: int) -> str:
    """The name of the shard that holds window ``sample``."""
    for start, stop in shard_ranges(n_samples, n_shards):
        if start <= sample < stop:
            return f"{start}-{stop}"
    raise IndexError(f"window {sample} is not one of the {n_samples} windows")


# ------------------------------------------------------------------------------------------------ rule `all`


def expand(template: str, **values) -> list[str]:
    """``template`` formatted with every combination of ``values`` (lists), as Snakemake's expand."""
    keys = list(values)
    return [template.format(**dict(zip(keys, combo))) for combo in itertools.product(*values.values())]


# steps whose config section's `random_init` says whether they also run on the random-init variants (controls no
# verdict reads); every other step runs on every variant
CONTROL_SECTION = {"perturb": "perturb", "cap": "perturb", "head_ablation": "head_ablation"}


def step_variants(config: dict, step: str = "") -> list[str]:
    """The variants of ``models`` that ``step`` runs on, in the workflow's order: every one, or the trained weights
    only where the step's section (``CONTROL_SECTION``) sets ``random_init: false``."""
    every = variants(config)
    section = CONTROL_SECTION.get(step)
    if section is None or config[section]["random_init"]:
        return every
    return [variant for variant in every if not variant.startswith("random-seed")]


def figure_wildcards(config: dict, row=None) -> dict[str, list[str]]:
    """The values a figure input's wildcard that its scope does not keep is expanded over, in this order; the
    variants are those of the step whose outputs ``row`` (a FigureRow, or None) reads."""
    step = row.step if row is not None else ""
    return {"model": [m["name"] for m in config["models"]], "variant": step_variants(config, step)}


def final_outputs(config: dict) -> list[str]:
    """What rule `all` builds from a validated ``config``: every model variant's q/k shards, gathered tables,
    perturbation, capping and head ablation, the summaries, the second paper's `synthetic.run` collection, every
    figure of posgen.figure_table.FIGURES and the reproduction tables. The checkpoint series (target
    `trajectory`) and the deposit study (target `deposit_study`) are not among them."""
    each = figure_wildcards(config)
    models = each["model"]
    out = expand(QK, **each, shard=shards_of("extract", config))
    for template in (DECOMPOSITION, BANDS):
        out += expand(template, **each)
    out += expand(MODEL_SUMMARY["nc"], model=models) + [SUMMARY_TABLE]
    for step, template in (("perturb", PERTURB), ("cap", CAP), ("head_ablation", HEAD_ABLATION)):
        out += expand(template, model=models, variant=step_variants(config, step))
    out += syn_outputs("run")
    for row in FIGURES.values():
        for ext in ("png", "pdf"):
            out += row.paths(each, ext)
    return out + list(REPRODUCTION.values())
