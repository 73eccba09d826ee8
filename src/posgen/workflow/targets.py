"""What each target builds from a validated config: rule ``all`` (``make run``) and the named study targets
(rules/targets.smk: ``input: targets(config, name)``). Standard library only."""

from __future__ import annotations

from posgen import paths
from posgen.config import trajectory_models
from posgen.paths import expand
from posgen.workflow.figures import FIGURES, figure_outputs, of_group
from posgen.workflow.sharding import shards_of
from posgen.workflow.steps import STEPS, step_variants

COLLECTION_OUTPUTS = (*paths.COLLECTION_PARTS.values(), *paths.COLLECTION_TABLES.values(), paths.VERDICTS)
STUDY_TABLES = ("csv", "classifiers", "deposit")


def collection_outputs(which: str, tables=None) -> list[str]:
    """The gathered parts, the tables and the verdicts of collection ``which`` (``tables``: only those of
    paths.COLLECTION_TABLES, and the verdicts)."""
    if tables is None:
        chosen = COLLECTION_OUTPUTS
    else:
        chosen = (*(paths.COLLECTION_TABLES[t] for t in tables), paths.VERDICTS)
    return [paths.in_collection(template, which) for template in chosen]


def final_outputs(config: dict) -> list[str]:
    """What rule `all` builds: every model variant's q/k shards, gathered tables, perturbation, capping and head
    ablation, the summaries, the second paper's `synthetic.run` collection, every figure of group `all`, the
    reproduction tables and the head atlas (its Parquet tables and page). The checkpoint series and the studies
    have targets of their own."""
    models = [m["name"] for m in config["models"]]
    each = {"model": models, "variant": step_variants(config)}
    out = expand(paths.QK, **each, shard=shards_of("extract", config))
    for template in (paths.DECOMPOSITION, paths.BANDS):
        out += expand(template, **each)
    out += expand(paths.MODEL_SUMMARY["nc"], model=models) + [paths.SUMMARY_TABLE]
    for step, template in (
        ("perturb", paths.PERTURB),
        ("cap", paths.CAP),
        ("head_ablation", paths.HEAD_ABLATION),
        ("band_interventions", paths.variant_table("band_interventions")),
    ):
        out += expand(template, model=models, variant=step_variants(config, step))
    out += collection_outputs("run")
    for row in of_group("all"):
        out += figure_outputs(row, each)
    atlas = [paths.HEADS, paths.in_collection(paths.CLASSIFIER_HEADS, "run"), paths.ATLAS]
    return out + list(paths.REPRODUCTION.values()) + atlas


def section_tables(config: dict) -> dict[str, list[str]]:
    """The reproduction's sections (posgen.workflow.steps: a step's ``section``): each such step's table of every
    model variant, by step."""
    each = {"model": [m["name"] for m in config["models"]], "variant": step_variants(config)}
    return {name: expand(paths.variant_table(name), **each) for name, step in STEPS.items() if step.section}


def head_tables(config: dict) -> dict[str, list[str]]:
    """Rule heads' inputs: every model variant's decomposition.nc (the rows of heads.parquet) and the table of every
    model variant of each step that declares per-head columns (a step's ``heads``), by step."""
    models = [m["name"] for m in config["models"]]
    out = {"decomposition": expand(paths.DECOMPOSITION, model=models, variant=step_variants(config))}
    for name, step in STEPS.items():
        if step.heads:
            out[name] = expand(paths.variant_table(name), model=models, variant=step_variants(config, name))
    return out


def targets(config: dict, name: str) -> list[str]:
    """What the named target ``name`` builds (README: the studies and the trajectories)."""
    if name == "trajectory":
        models = trajectory_models(config)
        tables = [path for template in paths.TRAJECTORY_TABLE.values() for path in expand(template, model=models)]
        return tables + [path for row in of_group("trajectory") for path in figure_outputs(row, {"model": models})]
    if name == "position_study":
        return [paths.GAP_ORIGIN]
    if name == "scale_study":
        figures = [path for row in of_group("scale_study") for path in figure_outputs(row, {})]
        return [*paths.SCALE_TABLE.values(), *figures, paths.GAP_ORIGIN, *paths.REPRODUCTION.values()]
    if name == "band_study":
        each = {"model": [m["name"] for m in config["models"]], "variant": step_variants(config, "band_interventions")}
        return [paths.BAND_STUDY, *figure_outputs(FIGURES["band_loss"], each)]
    if name == "confirmatory":
        return [*paths.CONFIRMATORY_TABLE.values(), *paths.REPRODUCTION.values()]
    if name == "prefix_study":
        return list(paths.PREFIX_TABLE.values())
    if name == "deposit_study":
        figures = [path for row in of_group("deposit_study") for path in figure_outputs(row, {})]
        tables = [paths.in_collection(paths.COLLECTION_TABLES[t], name) for t in ("csv", "deposit")]
        return tables + figures + list(paths.REPRODUCTION.values())
    if name == "regime_study":
        figures = [path for row in of_group("regime_study") for path in figure_outputs(row, {})]
        return collection_outputs(name, STUDY_TABLES) + figures
    if name in ("decisive_study", "decisive_gpu"):
        return collection_outputs(name, STUDY_TABLES)
    raise KeyError(f"target {name!r}: not a named target (trajectory, position_study, prefix_study, ...)")
