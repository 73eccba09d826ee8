"""Every path template of the workflow, once: model folders, windows, shards, per-variant and per-model tables, the
second paper's classifiers and collections, figures, logs and benchmarks (docs/data-model.md).

A template's wildcards are Snakemake's: ``{model}``, ``{variant}``, ``{shard}``, ``{table}`` for the first paper;
``{experiment}``, ``{task}``, ``{pe}``, ``{seed}``, ``{dataset}``, ``{collection}`` for the second; ``{figure}`` for
figures. Standard library only (the Snakefile imports it while parsing).
"""

from __future__ import annotations

import itertools
import re

RESULTS = "results"
MODELS_DIR = "resources/models"
MANIFEST = f"{MODELS_DIR}/{{model}}/manifest.json"

# ---------------------------------------------------------------------------------------------- the first paper

MODEL_DIR = f"{RESULTS}/{{model}}"
WINDOWS = f"{MODEL_DIR}/windows.h5"
VARIANT_DIR = f"{MODEL_DIR}/{{variant}}"
# a model job's shard of windows (config `shards`); rule gather merges its tables along `sample`
SHARD_DIR = f"{VARIANT_DIR}/shards/{{shard}}"
QK = f"{SHARD_DIR}/qk.h5"
SHARD_TABLE = f"{SHARD_DIR}/{{table}}.nc"
TABLE = f"{VARIANT_DIR}/{{table}}.nc"


def expand(template: str, **values) -> list[str]:
    """``template`` formatted with every combination of ``values`` (lists), as Snakemake's expand."""
    keys = list(values)
    return [template.format(**dict(zip(keys, combo))) for combo in itertools.product(*values.values())]


def shard_table(table: str) -> str:
    """One shard's ``table`` (decomposition, bands, perturb, cap), before rule gather."""
    return SHARD_TABLE.replace("{table}", table)


def variant_table(table: str) -> str:
    """A (model, variant)'s ``table``: gathered from its shards, or written whole by one job. A statistic that one
    step writes per (model, variant) is ``variant_table(<step>)`` where it is used (block_swap, prefix_content);
    the tables several steps read are named below."""
    return TABLE.replace("{table}", table)


DECOMPOSITION = variant_table("decomposition")
BANDS = variant_table("bands")
PERTURB = variant_table("perturb")
CAP = variant_table("cap")
HEAD_ABLATION = variant_table("head_ablation")
EXAMPLES = variant_table("examples")
MODEL_SUMMARY = {"csv": f"{MODEL_DIR}/summary.csv", "nc": f"{MODEL_DIR}/summary.nc"}
SUMMARY_TABLE = f"{RESULTS}/summary.csv"
GAP_ORIGIN = f"{RESULTS}/gap_origin.md"  # the position study's answer (target `position_study`)
PREFIX_TABLE = {"csv": f"{RESULTS}/prefix_content.csv", "md": f"{RESULTS}/prefix_content.md"}  # the prefix study's
# the scale study's (target `scale_study`): per model, the trends with size, and the table with every verdict
SCALE_TABLE = {"csv": f"{RESULTS}/scale.csv", "trends": f"{RESULTS}/scale_trends.csv", "md": f"{RESULTS}/scale.md"}
# the band-intervention study's (target `band_study`): every model variant's band settings and the predictions
BAND_STUDY = f"{RESULTS}/band_study.md"
CONFIRMATORY_TABLE = {"csv": f"{RESULTS}/confirmatory.csv", "md": f"{RESULTS}/confirmatory.md"}
REPRODUCTION = {
    "csv": f"{RESULTS}/reproduction.csv",
    "md": f"{RESULTS}/reproduction.md",
    "synthetic_csv": f"{RESULTS}/reproduction_synthetic.csv",
    # both papers' verdicts, one row per (paper, claim, scope): as text, and as the digested table the readers read
    "verdicts": f"{RESULTS}/verdicts.csv",
    "verdicts_table": f"{RESULTS}/verdicts.parquet",
}
# the head atlas (issue 55): the first paper's per-head table and the page over both papers
HEADS = f"{RESULTS}/heads.parquet"
ATLAS = f"{RESULTS}/atlas.html"
# training trajectories (target `trajectory`): the log of a model trained by the workflow, the per-step table
TRAINING_LOG = f"{MODEL_DIR}/training.nc"
TRAJECTORY_TABLE = {"csv": f"{MODEL_DIR}/trajectory.csv", "nc": f"{MODEL_DIR}/trajectory.nc"}

# --------------------------------------------------------------------------------------------- the second paper

SYNTHETIC = f"{RESULTS}/synthetic"
TASK_DATA = f"{SYNTHETIC}/tasks/{{dataset}}.nc"
CLASSIFIER_DIR = f"{SYNTHETIC}/{{experiment}}/{{task}}/{{pe}}/seed{{seed}}"
# a classifier's files: checkpoint and learning curves (training), its three analyses (analysis)
CHECKPOINT = f"{CLASSIFIER_DIR}/model.pt"
CURVES = f"{CLASSIFIER_DIR}/train.nc"
ANALYSES = {part: f"{CLASSIFIER_DIR}/{part}.nc" for part in ("ablation", "toeplitz", "probe")}
# A collection's gathered files: collection `run` directly under results/synthetic/, every other one in a folder of
# its name. The `{collection}` wildcard is the folder's suffix: "" for `run`, "/<name>" for the others.
COLLECTION = f"{SYNTHETIC}{{collection}}"
GATHERED_PARTS = ("training", "ablation", "toeplitz", "probe", "baselines")
COLLECTION_PARTS = {part: f"{COLLECTION}/{part}.nc" for part in GATHERED_PARTS}
COLLECTION_TABLES = {
    "csv": f"{COLLECTION}/summary.csv",
    "classifiers": f"{COLLECTION}/classifiers.csv",
    "deposit": f"{COLLECTION}/deposit.csv",
}
VERDICTS = f"{COLLECTION}/verdicts.md"
CLASSIFIER_HEADS = f"{COLLECTION}/heads.parquet"  # per classifier and head: the ablation drops (the atlas')


def collection_suffix(which: str) -> str:
    """The ``{collection}`` wildcard's value of collection ``which``."""
    return "" if which == "run" else f"/{which}"


def collection_name(suffix: str) -> str:
    """The collection whose ``{collection}`` wildcard is ``suffix``."""
    return suffix.removeprefix("/") or "run"


def in_collection(template: str, which: str) -> str:
    """``template`` (one of COLLECTION_*) for collection ``which``."""
    return template.replace("{collection}", collection_suffix(which))


# the collections' files a figure reads (posgen.workflow.figures): the second paper's run's, the deposit study's and
# the regime study's
RUN_TRAINING = in_collection(COLLECTION_PARTS["training"], "run")
RUN_ABLATION = in_collection(COLLECTION_PARTS["ablation"], "run")
RUN_TOEPLITZ = in_collection(COLLECTION_PARTS["toeplitz"], "run")
RUN_PROBE = in_collection(COLLECTION_PARTS["probe"], "run")
STUDY_DEPOSIT = in_collection(COLLECTION_TABLES["deposit"], "deposit_study")
STUDY_PROBE = in_collection(COLLECTION_PARTS["probe"], "deposit_study")
REGIME_CLASSIFIERS = in_collection(COLLECTION_TABLES["classifiers"], "regime_study")


def classifier_file(template: str, experiment: str, task: str, pe: str, seed) -> str:
    """``template`` (a CLASSIFIER_DIR file) of one classifier."""
    return template.format(experiment=experiment, task=task, pe=pe, seed=seed)


# ------------------------------------------------------------------------------------------ per-job identity

# The files whose path says what they are, by paper, the more specific first (a collection's training.nc before a
# model's): a .nc/.h5 or Parquet table records it and is checked on every read (posgen.integrity.check_identity), a
# per-model CSV table on its rows (posgen.integrity.check_rows).
IDENTIFIED = {
    "synthetic": (
        TASK_DATA,
        CURVES,
        *ANALYSES.values(),
        *COLLECTION_PARTS.values(),
        *COLLECTION_TABLES.values(),
        CLASSIFIER_HEADS,
    ),
    "llm": (QK, SHARD_TABLE, TABLE, *MODEL_SUMMARY.values(), TRAINING_LOG, *TRAJECTORY_TABLE.values(), WINDOWS, HEADS),
    "both": (REPRODUCTION["verdicts_table"],),
}
# what a wildcard may match in a path (rules/common.smk constrains Snakemake's wildcards with the same ones)
WILDCARD_PATTERNS = {
    "variant": r"trained|random-seed\d+|step\d+",
    "shard": r"\d+-\d+",
    "seed": r"\d+",
    "collection": r"(?:/[^/]+)?",
}


def _pattern(template: str) -> re.Pattern:
    parts = re.split(r"\{(\w+)\}", template)  # literal, wildcard, literal, ...
    body = "".join(
        re.escape(part) if i % 2 == 0 else f"(?P<{part}>{WILDCARD_PATTERNS.get(part, '[^/]+')})"
        for i, part in enumerate(parts)
    )
    return re.compile(f"(?:^|/){body}$")


_IDENTIFIED = [(paper, _pattern(template)) for paper, templates in IDENTIFIED.items() for template in templates]


def identity(path) -> dict[str, str] | None:
    """What the file at ``path`` is, from its path: ``paper`` (llm or synthetic), ``file`` (its name) and the
    wildcards of its template (model, variant, shard; experiment, task, pe, seed; dataset; collection), as text;
    None for a path outside the workflow's per-job files."""
    text = str(path).replace("\\", "/")
    for paper, pattern in _IDENTIFIED:
        found = pattern.search(text)
        if found:
            wildcards = {name: value for name, value in found.groupdict().items() if name != "table"}
            if "collection" in wildcards:
                wildcards["collection"] = collection_name(wildcards["collection"])
            return {"paper": paper, "file": text.rpartition("/")[2], **wildcards}
    return None


def owner(path) -> tuple[str, str]:
    """(model, variant) of a first-paper per-variant file, from its path (:func:`identity`): the one lookup every
    reader that keys files by model and variant uses; one line naming the file where its path says neither."""
    found = identity(path) or {}
    if "model" not in found or "variant" not in found:
        raise ValueError(f"{path}: not a per-variant file results/<model>/<variant>/<table>.nc")
    return found["model"], found["variant"]


# ------------------------------------------------------------------------------------------------------ figures

# Scopes: which wildcards a figure's outputs carry (one figure per (model, variant), per model, or one in all).
FIGURE_STEMS = {
    "per_variant": f"{MODEL_DIR}/figures/{{figure}}_{{variant}}",
    "per_model": f"{MODEL_DIR}/figures/{{figure}}",
    "global": f"{RESULTS}/figures/{{figure}}",
}
FIGURE_FORMATS = ("png", "pdf")


def figure_file(scope: str, ext: str) -> str:
    """The template of a ``scope`` figure's ``ext`` file (png or pdf)."""
    return f"{FIGURE_STEMS[scope]}.{ext}"


# --------------------------------------------------------------------------------------- logs and benchmarks


def log(*parts: str) -> str:
    """``logs/<parts joined by />.log``, e.g. ``log("extract", "{model}", "{variant}", "{shard}")``."""
    return "logs/" + "/".join(parts) + ".log"


def benchmark(*parts: str) -> str:
    """``benchmarks/<parts joined by />.tsv``: a job's runtime and memory (Snakemake's benchmark)."""
    return "benchmarks/" + "/".join(parts) + ".tsv"


FIGURE_LOGS = {
    "per_variant": log("figures", "{model}", "{figure}_{variant}"),
    "per_model": log("figures", "{model}", "{figure}"),
    "global": log("figures", "{figure}"),
}
