import re
import sys
from pathlib import Path

# The library lives beside the workflow; make it importable without an install.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from posgen.config import ConfigError, check_overlays, model_entry, trajectory_models, variants  # noqa: E402
from posgen.config import validate as validate_config  # noqa: E402
from posgen.experiments import COLLECTIONS  # noqa: E402
from posgen import paths  # noqa: E402
from posgen.workflow.figures import CAPTIONS, FIGURES, figure_inputs, figure_params, of_scope  # noqa: E402
from posgen.workflow.sharding import figure_shard, shards_of  # noqa: E402
from posgen.workflow.steps import GATHERED, MODEL_PRIORITY, MODEL_THREADS, is_fused, step_variants  # noqa: E402
from posgen.workflow.steps import params_of as step_params  # noqa: E402
from posgen.workflow.synthetic import SyntheticPlan, rule_name, unit_resources  # noqa: E402
from posgen.workflow.targets import final_outputs, head_tables, section_tables, targets  # noqa: E402

try:
    # paths only in the main process: a cluster job's node may not see the login node's local files
    validate_config(
        config, Path(workflow.basedir) / "schemas" / "config.schema.yaml", check_paths=workflow.is_main_process
    )
    check_overlays(config, workflow.overwrite_configfiles)
except ConfigError as err:
    # one line, not Snakemake's traceback of the Snakefile
    sys.exit(f"ConfigError: {err}")

MODELS = [m["name"] for m in config["models"]]
VARIANTS = variants(config)
# Checkpoint series (config `trajectory.models`): their variants are step<N>; they go through the same per-variant
# rules, but only the `trajectory` target asks for them.
TRAJECTORY_MODELS = trajectory_models(config)
TRAIN_MODELS = [m["name"] for m in config["trajectory"]["models"] if m["source"] == "train"]
FUSED = is_fused(config)  # the extraction job writes decomposition.nc and bands.nc too (extract.analysis)
FIGURE_SHARD = figure_shard(config)  # the shard whose qk.h5 holds the example heads' window
# the second paper's experiments, data sets and job units (posgen.workflow.synthetic)
SYN = SyntheticPlan(config)
# profiles/slurm asks a GPU for synthetic_train and synthetic_analyse by name; the unit rules (named per
# experiment, which set-resources cannot match) ask for it themselves unless the config runs on the CPU
SYN_GPU = 0 if config["device"] == "cpu" else 1


def alternatives(names):
    return "|".join(re.escape(name) for name in names) or "(?!)"


wildcard_constraints:
    model=alternatives(MODELS + TRAJECTORY_MODELS),
    variant=paths.WILDCARD_PATTERNS["variant"],
    shard=paths.WILDCARD_PATTERNS["shard"],
    experiment=alternatives(SYN.experiments),
    task=alternatives(SYN.tasks),
    dataset=alternatives(SYN.datasets),
    pe=alternatives(SYN.pes),
    seed=paths.WILDCARD_PATTERNS["seed"],
    collection=alternatives([paths.collection_suffix(which) for which in COLLECTIONS]),


def params_of(step, **fixed):
    """A rule's params: the config leaves ``step`` reads and config_hash over exactly those (posgen.workflow.steps;
    a figure's: its row's, posgen.workflow.figures)."""
    if step == "figure":
        return figure_params(config)
    return step_params(step, config, SYN, **fixed)


def over_variants(template):
    """An input function: ``template`` for every variant of the job's own model."""
    return lambda w: expand(template, model=w.model, variant=variants(config, w.model))


def every_variant(template, variants=VARIANTS):
    """``template`` for every model of the config and each of ``variants`` (default: every variant; a step's:
    ``step_variants(config, step)``)."""
    return expand(template, model=MODELS, variant=variants)


def first_paper_results():
    """What the readers of the first paper's results read (posgen.llm.readers): the summary table, and the gathered
    bands, perturbation and capping tables of every model and variant."""
    return {
        "summary": paths.SUMMARY_TABLE,
        "bands": every_variant(paths.BANDS),
        "perturb": every_variant(paths.PERTURB, step_variants(config, "perturb")),
        "cap": every_variant(paths.CAP, step_variants(config, "cap")),
    }


def gathered_shards(wildcards):
    """The per-shard files rule gather merges into one table."""
    return expand(paths.SHARD_TABLE, shard=shards_of(GATHERED[wildcards.table], config), **wildcards)


def figure_output(scope):
    """A figure rule's outputs: the PNG in the report (its row's menu entry and labels, its caption section) and
    the PDF."""
    row = lambda w: FIGURES[w.figure]
    png = report(
        paths.figure_file(scope, "png"),
        caption=f"../{CAPTIONS}",
        category=lambda w: row(w).category,
        subcategory=lambda w: row(w).subcategory,
        labels=lambda w: row(w).labels,
    )
    return {"png": png, "pdf": paths.figure_file(scope, "pdf")}


def collection_of(wildcards):
    return paths.collection_name(wildcards.collection)


def classifier_inputs(template):
    """An input function: ``template`` of every classifier of the job's collection."""
    return lambda w: SYN.collection_files(collection_of(w), template)


def study_summary_if_built(wildcards):
    """The deposit study's summary and per-classifier table for the reproduction table: when this run builds the
    study (target `deposit_study`) or an earlier run did; `make run` on a fresh clone neither waits for nor builds
    it."""
    tables = [paths.in_collection(paths.COLLECTION_TABLES[t], "deposit_study") for t in ("csv", "classifiers")]
    if "deposit_study" in workflow.dag_settings.targets or all(Path(p).exists() for p in tables):
        return tables
    return []
