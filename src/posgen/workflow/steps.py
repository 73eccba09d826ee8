"""Every step of both papers, declared once: the config leaves its jobs read (their params, and the only keys their
``config_hash`` covers), the models-entry keys it passes, whether its jobs load torch, and its runner, the library
function the step's jobs run, named lazily as ``"module:function"`` so that this module imports nothing heavy.

A rule passes ``params_of(step, config)`` as its params (rules/common.smk): plain values, or functions of the job's
wildcards; one hash form for every step. ``workflow_scripts/step.py`` runs any rule's job by its step's runner.
Standard library only (the Snakefile imports it while parsing).
"""

from __future__ import annotations

import dataclasses
import json

from posgen.config import job_hash, leaf, model_entry, variants
from posgen.workflow.synthetic import SyntheticPlan


def leaves(*paths: str, **named: str) -> dict[str, str]:
    """{param name: dotted config leaf}: each of ``paths`` under its last key, each of ``named`` under its name."""
    names = [path.rpartition(".")[2] for path in paths] + list(named)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"leaves: two leaves under the param name(s) {', '.join(twice)}")
    return {**{path.rpartition(".")[2]: path for path in paths}, **named}


INTERVALS = leaves(n_boot="intervals.bootstrap", seed="intervals.seed")


@dataclasses.dataclass(frozen=True)
class Step:
    """One step: ``leaves`` the config leaves its jobs read ({param: dotted leaf}; defaults live in the schema
    only); ``per_model``: its hash also covers the job's own ``models`` entry; ``entry``: keys of that entry passed
    as params ({param: default}), ``optional`` the same where some entry of the config sets the key (so that a
    config without it keeps its params); ``torch``: its jobs import torch (``large_blocks``: and keep freed blocks over
    32 MB, a training loop's; posgen.allocator); ``runner``: ``"module:function"`` of the job; ``section``: a
    statistic's section of reproduction.md (``"module:function"`` of its ``variant_table`` files)."""

    name: str
    runner: str
    leaves: dict[str, str] = dataclasses.field(default_factory=dict)
    per_model: bool = True
    entry: dict[str, str] = dataclasses.field(default_factory=dict)
    optional: dict[str, str] = dataclasses.field(default_factory=dict)  # entry keys passed where an entry sets them
    torch: bool = False
    large_blocks: bool = False
    hashed: bool = True  # its params carry a config_hash
    section: str = ""  # "module:function": its section of reproduction.md, from its table of every model variant
    # "module:function" of (its variant_table file) -> {heads.parquet column: (layer, head) values}: the per-head
    # columns it adds to results/heads.parquet (rule heads reads its table of every model variant)
    heads: str = ""
    head_columns: tuple = ()  # HeadColumn: what the atlas' menu shows of its per-head columns


@dataclasses.dataclass(frozen=True)
class HeadColumn:
    """A per-head statistic of results/heads.parquet in the atlas' menu: its ``column``, its menu ``label`` and
    the construction (``method``) whose rows hold it; ``key`` the menu's name (the column's by default). A column
    ending in ``*`` stands for every column with that prefix (one per probe), ``{suffix}`` in its label for the
    rest of each."""

    column: str
    label: str
    method: str = "A"
    key: str = ""


def _step(name: str, runner: str, **kw) -> Step:
    return Step(name, runner, **kw)


# The model jobs: run a model (or read its q/k) per (model, variant) and shard; what posgen.plan prices.
MODEL_JOB_RULES = ("extract", "decompose", "bands", "perturb", "cap", "head_ablation", "band_interventions")
# bands reads q/k on the CPU
GPU_RULES = ("extract", "decompose", "perturb", "cap", "head_ablation", "band_interventions")
# rules only the store path runs (extract.analysis: store); the fused extraction writes their tables itself
STORE_RULES = ("decompose", "bands")
# CPU threads of each model job. One: a model job is parallel across jobs (variants, shards), and on a 2-core
# machine two 1-thread jobs side by side finish 23 % sooner than the same jobs one after another with 2 threads
# (docs/results.md, "make run"). GPU jobs ask for their CPUs apart (profiles/slurm); a workstation running one big
# model locally raises it with `--set-threads extract=8`.
MODEL_THREADS = 1
# Which ready model job starts first when cores are short (Snakemake `priority`): the longest first, so that a run
# ends on short jobs, not on a 2-minute perturbation beside an idle core (docs/results.md, "make run").
MODEL_PRIORITY = {"perturb": 4, "extract": 3, "head_ablation": 2, "band_interventions": 2, "cap": 1}
# gathered table -> the rule whose shards write it
GATHERED = {"decomposition": "extract", "bands": "extract", "perturb": "perturb", "cap": "cap"}
# the tables the fused extraction writes beside q/k (the store path: rules decompose and bands)
FUSED_TABLES = ("decomposition", "bands")
DEVICE_MAP = {"device_map": ""}  # a models entry's device_map: "auto" spreads the model over the node's GPUs

STEPS = {
    step.name: step
    for step in [
        # the first paper
        _step("get_model", "posgen.models:get_model_step", torch=True, hashed=False),
        _step(
            "windows",
            "posgen.corpus:windows_step",
            leaves=leaves("corpus.source", "n_samples", "seq_len", seed="window_seed", heldout="heldout_windows"),
            optional={"window_set": "corpus", "fresh_windows": {}},
        ),
        _step(
            "extract",
            "posgen.llm.extract:extract_step",
            leaves=leaves(
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
            entry={**DEVICE_MAP, "first_token": "model"},
            torch=True,
        ),
        _step(
            "decompose",
            "posgen.decomposition.table:decompose_step",
            leaves=leaves(
                "decomposition.dummy_distances",
                "decomposition.dummy_distance",
                "decomposition.lstsq_tol",
                "decomposition.precision",
                "decomposition.bound_rows",
                "decomposition.bound_samples",
                "device",
            ),
            torch=True,
            # its decomposition.nc's per-window statistics are the rows of heads.parquet (posgen.atlas.tables)
            head_columns=(
                HeadColumn("r_rc", "Method A row-centred r (what softmax sees; the verdicts' r)", "A", "r_rc_A"),
                HeadColumn("r_rc", "Method B row-centred r", "B", "r_rc_B"),
                HeadColumn("r", "Method A r (raw, paper-comparable)", "A", "r_A"),
                HeadColumn("r", "Method B r (raw)", "B", "r_B"),
                HeadColumn("r", "Method A-drift r (diagnostic)", "A-drift", "r_A-drift"),
                HeadColumn("r", "Method A-shared r (diagnostic)", "A-shared", "r_A-shared"),
                HeadColumn("f_share", "f share r2_f / (r2_f + r2_g), Method A"),
                HeadColumn("r_sweep_spread", "spread of Method A r over the D sweep"),
                HeadColumn("k_position_share_smooth", "keys' smooth position share"),
                HeadColumn("q_position_share_smooth", "queries' smooth position share"),
            ),
        ),
        _step(
            "bands",
            "posgen.llm.bands:bands_step",
            heads="posgen.llm.readers:band_columns",
            head_columns=(
                HeadColumn("low_share_k", "keys' low-frequency share"),
                HeadColumn("low_share_q", "queries' low-frequency share"),
            ),
        ),
        _step("gather", "posgen.gather:gather_step", hashed=False),
        # window_seed: the data set a verdict judges (posgen.verdict_rules.data_status), carried as a column
        _step(
            "summarize",
            "posgen.llm.summary:summarize_step",
            leaves={**INTERVALS, "window_seed": "window_seed"},
            optional={"fresh_windows": {}},
        ),
        _step("summary_table", "posgen.llm.summary:summary_table_step", hashed=False),
        _step("gap_origin", "posgen.llm.gap_origin:gap_origin_step", per_model=False),
        _step(
            "examples",
            "posgen.llm.examples:examples_step",
            leaves=leaves("figures.sample", "figures.map_tokens", "figures.pool_pairs", "figures.seed"),
            torch=True,
        ),
        # its settings are constants of posgen.llm.block_swap
        _step(
            "block_swap",
            "posgen.llm.block_swap:block_swap_step",
            torch=True,
            section="posgen.llm.block_swap:reproduction_section",
            heads="posgen.llm.readers:block_swap_columns",
            head_columns=(HeadColumn("positional_score", "block-swap score (1 positional, 0 semantic)"),),
        ),
        _step(
            "perturb",
            "posgen.llm.perturb:perturb_step",
            leaves=leaves(
                "perturb.n_samples",
                "perturb.seq_len",
                "perturb.rates",
                "perturb.seed",
                "perturb.jitter",
                "decomposition.dummy_distance",
                "dtype",
                "device",
            ),
            entry=DEVICE_MAP,
            torch=True,
        ),
        _step(
            "cap",
            "posgen.llm.perturb:cap_step",
            leaves=leaves(
                "perturb.n_samples",
                "perturb.seq_len",
                "decomposition.dummy_distance",
                "dtype",
                "device",
                distance_caps="perturb.caps",
            ),
            entry=DEVICE_MAP,
            torch=True,
        ),
        _step(
            "head_ablation",
            "posgen.llm.head_ablation:head_ablation_step",
            leaves=leaves(
                "head_ablation.n_samples",
                "head_ablation.seq_len",
                "head_ablation.probe_samples",
                "head_ablation.probe_period",
                "head_ablation.seed",
                "head_ablation.probes",
                "dtype",
                "device",
            ),
            entry=DEVICE_MAP,
            torch=True,
            heads="posgen.llm.readers:head_ablation_columns",
            head_columns=(HeadColumn("loss_increase_*", "head-ablation loss increase, {suffix} probe (nats)"),),
        ),
        _step("reproduction", "posgen.reproduction:reproduction_step", per_model=False),
        # band interventions (issue 65): a diagnostic section of reproduction.md, a column per setting in the atlas
        _step(
            "band_interventions",
            "posgen.llm.band_interventions:band_step",
            leaves=leaves(
                *(f"band_interventions.{key}" for key in ("n_samples", "seq_len", "shares", "ablate")),
                *(f"decomposition.{key}" for key in ("dummy_distances", "dummy_distance", "lstsq_tol", "precision")),
                "extract.check_rtol",
                "dtype",
                "device",
            ),
            heads="posgen.llm.readers:band_intervention_columns",
            head_columns=(HeadColumn("band_kl_*", "KL of the attention rows under band setting {suffix}"),),
            section="posgen.llm.band_interventions:reproduction_section",
            entry=DEVICE_MAP,
            torch=True,
        ),
        # the prefix study (target `prefix_study`, docs/method.md section 3E)
        _step(
            "prefix_content",
            "posgen.llm.prefix_content:prefix_content_step",
            leaves=leaves("dtype", "device"),
            entry={**DEVICE_MAP, "first_token": "model"},
            torch=True,
        ),
        _step("prefix_table", "posgen.llm.prefix_content:prefix_table_step", leaves=INTERVALS, per_model=False),
        # the band-intervention study (target `band_study`): reproduction.md's band section on its own
        _step("band_study_table", "posgen.llm.band_interventions:band_study_step", per_model=False),
        # the scale study (target `scale_study`): the first paper's numbers against model size
        _step("scale_table", "posgen.llm.scale:scale_step", per_model=False),
        _step(
            "confirmatory_table",
            "posgen.llm.confirm:confirm_step",
            leaves=leaves("confirmatory.pairs"),
            per_model=False,
        ),
        _step("figure", "posgen.figures.registry:figure_step"),
        # the head atlas (issue 55): tidy per-head tables and the page over both papers
        _step("heads", "posgen.atlas.tables:heads_step", leaves=INTERVALS, per_model=False),
        _step("classifier_heads", "posgen.atlas.tables:classifier_heads_step", per_model=False),
        _step("atlas", "posgen.atlas.page:atlas_step", hashed=False),
        # training trajectories
        _step(
            "train_trajectory",
            "posgen.trajectory.train:train_step",
            leaves=leaves(source="corpus.source"),
            torch=True,
        ),
        _step(
            "trajectory_table",
            "posgen.trajectory.table:trajectory_table_step",
            leaves=leaves("trajectory.sensitivity_rates", **INTERVALS),
        ),
        # the second paper (their options come from the experiment: posgen.workflow.synthetic)
        _step("synthetic_tasks", "posgen.synthetic.tasks:tasks_step", per_model=False),
        _step("synthetic_train", "posgen.synthetic.train:train_step", per_model=False, torch=True, large_blocks=True),
        _step(
            "synthetic_analyse",
            "posgen.synthetic.analysis:analyse_step",
            per_model=False,
            torch=True,
            large_blocks=True,
        ),
        _step("synthetic_gather", "posgen.synthetic.analysis:gather_step", per_model=False),
        _step("synthetic_summary", "posgen.synthetic.summary:summary_step", per_model=False),
        _step("synthetic_verdicts", "posgen.synthetic.verdicts:verdicts_step", hashed=False),
    ]
}
# a rule named for its step, or for its step and what it holds (fig_per_model, synthetic_train_task_clean)
RULE_PREFIXES = {"fig": "figure"}


def step_of(rule: str) -> Step:
    """The step whose runner runs rule ``rule``'s jobs: the step of that name, else the longest step name (or
    RULE_PREFIXES key) that prefixes it followed by ``_``."""
    if rule in STEPS:
        return STEPS[rule]
    names = {**{name: name for name in STEPS}, **RULE_PREFIXES}
    prefixes = [prefix for prefix in names if rule.startswith(prefix + "_")]
    if not prefixes:
        raise KeyError(f"rule {rule!r}: no step of posgen.workflow.steps runs it")
    return STEPS[names[max(prefixes, key=len)]]


# --------------------------------------------------------------------------------------------- config leaves


def is_fused(config: dict) -> bool:
    """The fused path (extract.analysis: fused): the extraction job writes decomposition.nc and bands.nc too."""
    return config["extract"]["analysis"] == "fused"


def step_leaves(step: str, config: dict) -> dict[str, str]:
    """The leaves ``step`` reads under ``config``: the fused extraction also reads what the decompose and bands
    jobs read, since it writes their files."""
    out = dict(STEPS[step].leaves)
    if step == "extract" and is_fused(config):
        for other in STORE_RULES:
            for name, path in STEPS[other].leaves.items():
                if out.setdefault(name, path) != path:
                    raise ValueError(f"step_leaves: param {name!r} of extract and {other} reads two leaves")
    return out


def planned_rules(config: dict) -> tuple[str, ...]:
    """The model-job rules ``config`` runs, in MODEL_JOB_RULES order."""
    return tuple(rule for rule in MODEL_JOB_RULES if not (is_fused(config) and rule in STORE_RULES))


# steps whose config section's `random_init` says whether they also run on the random-init variants (controls no
# verdict reads); every other step runs on every variant
CONTROL_SECTION = {
    "perturb": "perturb",
    "cap": "perturb",
    "head_ablation": "head_ablation",
    "band_interventions": "band_interventions",
}


def step_variants(config: dict, step: str = "") -> list[str]:
    """The variants of ``models`` that ``step`` runs on, in the workflow's order: every one, or the trained weights
    only where the step's section (``CONTROL_SECTION``) sets ``random_init: false``."""
    every = variants(config)
    section = CONTROL_SECTION.get(step)
    if section is None or config[section]["random_init"]:
        return every
    return [variant for variant in every if not variant.startswith("random-seed")]


# ------------------------------------------------------------------------------------------------------ params


def canonical(value):
    """``value`` with its keys sorted at every level: Snakemake compares params as text, so the key order of the
    config file must not rerun a job."""
    return json.loads(json.dumps(value, sort_keys=True))


def _entry_value(config: dict, key: str, default: str):
    return lambda wildcards: model_entry(config, wildcards.model).get(key, default)


def hash_of(config: dict, leaf_paths: list[str], per_model: bool):
    """The params function of a job's config_hash: over ``leaf_paths``, and (``per_model``) its model's entry."""
    return lambda wildcards: job_hash(config, leaf_paths, wildcards.model if per_model else None)


def params_of(step: str, config: dict, plan: SyntheticPlan | None = None, **fixed) -> dict:
    """A rule's params: every config leaf ``step`` reads under its param name, the models-entry keys it passes,
    what its kind of job adds (the figure, the experiment's options, ...) and ``config_hash`` over exactly what it
    reads. Values, or functions of the job's wildcards. ``plan``: the second paper's (its steps need it);
    ``fixed``: values of the rule's own (an experiment). A figure's: posgen.workflow.figures.figure_params."""
    kind = STEPS[step]
    if step.startswith("synthetic_"):
        return plan.params(step, **fixed)
    named = step_leaves(step, config)
    out = {name: leaf(config, path) for name, path in named.items()}
    out.update({name: _entry_value(config, name, default) for name, default in kind.entry.items()})
    entry_keys = {key for entry in config["models"] for key in entry}
    out.update({name: _entry_value(config, name, d) for name, d in kind.optional.items() if name in entry_keys})
    if step == "get_model":
        out["entry"] = lambda wildcards: dict(sorted(model_entry(config, wildcards.model).items()))
    elif step == "train_trajectory":
        out["train"] = lambda wildcards: canonical(model_entry(config, wildcards.model)["train"])
    elif step == "trajectory_table":
        out["variants"] = lambda wildcards: variants(config, wildcards.model)
    if kind.hashed:
        out["config_hash"] = hash_of(config, list(named.values()), kind.per_model)
    return out
