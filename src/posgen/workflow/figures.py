"""The paper figures, declared once: one row per figure with its inputs (role -> the path template of a step's
output), its scope, the target that builds it, and its loader and drawing function, named lazily as
``"module:function"`` (:func:`posgen.figures.registry.draw` resolves them). rules/figures.smk has one rule per
scope, the figure a wildcard (``{figure}``); its caption is its section of ``report/figures.rst``.

Adding a figure: a row here, a drawing function and loader in its family's module of posgen.figures, a caption
section. Standard library only (the Snakefile imports it while parsing).
"""

from __future__ import annotations

import dataclasses
import itertools
import string

from posgen import paths
from posgen.config import variant_order, variant_step, variants
from posgen.paths import figure_file
from posgen.workflow.steps import INTERVALS, hash_of, step_variants

SCOPE_WILDCARDS = {"per_variant": ("model", "variant"), "per_model": ("model",), "global": ()}
CAPTIONS = "report/figures.rst"  # reStructuredText with one Jinja section per figure, relative to the repository
# the target that builds a group's figures: `all` (make run), or a named study target
GROUPS = ("all", "trajectory", "deposit_study", "regime_study", "scale_study")


def template_fields(template: str) -> list[str]:
    """Wildcard names of a path template (``"results/{model}/{variant}/x.nc"`` -> ``["model", "variant"]``)."""
    return [field for _, field, _, _ in string.Formatter().parse(template) if field]


@dataclasses.dataclass(frozen=True)
class FigureRow:
    """One paper figure.

    ``inputs`` maps a role (the loader's key) to a path template of an upstream output. A template wildcard that
    the scope keeps (``{model}`` for a per-model figure) stays a wildcard of the rule; any other one (``{variant}``
    in a per-model figure, anything in a global one) is expanded over all its values, in the workflow's order, so
    the role receives a list of files. ``step``: the step whose outputs it reads, where that step may skip
    variants (posgen.workflow.steps.step_variants). ``draw`` and ``load``: ``"module:function"``.
    """

    name: str
    category: str  # report menu entry; its leading number fixes the order in the menu
    inputs: dict[str, str]
    draw: str
    load: str
    scope: str = "per_model"
    bootstrap: bool = False  # takes the `intervals` settings (n_boot, seed)
    step: str = ""
    group: str = "all"

    def __post_init__(self):
        if self.scope not in SCOPE_WILDCARDS:
            raise ValueError(f"figure {self.name!r}: scope {self.scope!r} is not one of {', '.join(SCOPE_WILDCARDS)}")
        if self.group not in GROUPS:
            raise ValueError(f"figure {self.name!r}: group {self.group!r} is not one of {', '.join(GROUPS)}")

    caption = CAPTIONS  # every figure's caption is its section of this file

    @property
    def wildcards(self) -> tuple[str, ...]:
        """The wildcards of the figure's outputs."""
        return SCOPE_WILDCARDS[self.scope]

    def expanded(self) -> list[str]:
        """Input wildcards expanded over all their values (sorted; e.g. ``["variant"]``)."""
        names = {field for template in self.inputs.values() for field in template_fields(template)}
        return sorted(names - set(self.wildcards))

    def output(self, ext: str) -> str:
        """Output path template of the ``ext`` file (``png`` or ``pdf``), with the scope's wildcards."""
        return figure_file(self.scope, ext).replace("{figure}", self.name)

    @property
    def subcategory(self) -> str:
        """The report's submenu: the figure's model, all models, or its study."""
        if "model" in self.wildcards:
            return "{model}"
        return "all models" if self.group == "all" else self.group.replace("_", " ")

    @property
    def labels(self) -> dict[str, str]:
        """The report's labels: the figure, and its variant for a per-variant one."""
        return {"figure": self.name, **({"variant": "{variant}"} if "variant" in self.wildcards else {})}

    def paths(self, values: dict[str, list[str]], ext: str = "png") -> list[str]:
        """Every output path of extension ``ext`` for wildcard ``values`` (``{"model": [...], ...}``)."""
        keys = self.wildcards
        combos = itertools.product(*(values[k] for k in keys))
        return [self.output(ext).format(**dict(zip(keys, combo))) for combo in combos]


def _row(name, category, inputs, draw, load, **kw) -> FigureRow:
    return FigureRow(name, category, inputs, draw=f"posgen.figures.{draw}", load=f"posgen.figures.{load}", **kw)


SUMMARY_NC = paths.MODEL_SUMMARY["nc"]

FIGURES = {
    row.name: row
    for row in [
        # the first paper
        _row("logit_maps", "1. Logit maps", {"examples": paths.EXAMPLES}, "llm:fig_logit_maps", "llm:load_examples",
             scope="per_variant"),
        _row("scatter", "2. W against f + g", {"examples": paths.EXAMPLES}, "llm:fig_scatter", "llm:load_examples",
             scope="per_variant"),
        _row("r_heatmap", "3. r over layer x head", {"decomposition": paths.DECOMPOSITION}, "llm:fig_r_heatmap",
             "llm:load_r_heatmap"),
        _row("layer_r", "4. Per-layer r", {"summary": SUMMARY_NC}, "llm:fig_layer_r", "llm:load_layer_r"),
        _row("position_share", "4b. Absolute position in q and k", {"summary": SUMMARY_NC}, "llm:fig_position_share",
             "llm:load_layer_r"),
        _row("bands", "5. Feature bands", {"bands": paths.BANDS}, "llm:fig_bands", "llm:load_bands"),
        _row("block_swap", "5b. Block swaps: a second reading per head", {"block_swap": paths.variant_table("block_swap")},
             "block_swap:fig_block_swap", "block_swap:load_block_swap"),
        _row("dummy_sweep", "6. Dummy-distance sweep", {"decomposition": paths.DECOMPOSITION}, "llm:fig_dummy_sweep",
             "llm:load_dummy_sweep", bootstrap=True),
        _row("perturb_ppl", "7. Perturbation: perplexity", {"perturb": paths.PERTURB}, "llm:fig_perturb_ppl",
             "llm:load_perturb", bootstrap=True, step="perturb"),
        _row("perturb_fg", "8. Perturbation: f and g change", {"perturb": paths.PERTURB}, "llm:fig_perturb_fg",
             "llm:load_perturb", bootstrap=True, step="perturb"),
        _row("cap", "9. Distance capping", {"cap": paths.CAP}, "llm:fig_cap", "llm:load_cap", bootstrap=True,
             step="cap"),
        _row("band_loss", "9b. Band interventions: loss", {"band_interventions": paths.variant_table("band_interventions")},
             "band_interventions:fig_band_loss", "band_interventions:load_band_interventions", bootstrap=True,
             step="band_interventions"),
        # the second paper: per-head ablation of the pretrained models (docs/method.md section 8)
        _row("head_ablation", "14. Pretrained LLMs: single-head ablation", {"head_ablation": paths.HEAD_ABLATION},
             "head_ablation:fig_head_ablation", "head_ablation:load_head_ablation", step="head_ablation"),
        # the second paper: PE classifiers on the synthetic tasks
        _row("synthetic_accuracy", "10. PE x task: accuracy", {"training": paths.RUN_TRAINING},
             "synthetic:fig_accuracy", "synthetic:load_training", scope="global"),
        _row("synthetic_ablation", "11. PE x task: single-head ablation", {"ablation": paths.RUN_ABLATION},
             "synthetic:fig_ablation", "synthetic:load_ablation", scope="global"),
        _row("synthetic_deposit", "12. PE x task: deposit index", {"ablation": paths.RUN_ABLATION},
             "synthetic:fig_deposit", "synthetic:load_ablation", scope="global"),
        _row("synthetic_toeplitz", "13. PE x task: Toeplitz share", {"toeplitz": paths.RUN_TOEPLITZ},
             "synthetic:fig_toeplitz", "synthetic:load_toeplitz", scope="global"),
        _row("synthetic_probe", "13b. PE x task: position probe", {"probe": paths.RUN_PROBE},
             "synthetic:fig_position_probe", "synthetic:load_probe", scope="global"),
        # training trajectories (target `trajectory`): per trajectory model; the heatmap's variants are a few
        # checkpoints (heatmap_variants)
        _row("trajectory", "15. Training trajectory", {"trajectory": paths.TRAJECTORY_TABLE["nc"]},
             "trajectory:fig_trajectory", "trajectory:load_trajectory", group="trajectory"),
        _row("trajectory_r_heatmap", "16. Training trajectory: r over layer x head",
             {"decomposition": paths.DECOMPOSITION}, "llm:fig_r_heatmap", "llm:load_r_heatmap", group="trajectory"),
        # the deposit and regime studies (their targets only)
        _row("deposit_study", "17. Deposit study: top vs second drop", {"deposit": paths.STUDY_DEPOSIT},
             "synthetic:fig_deposit_study", "synthetic:load_deposit", scope="global", group="deposit_study"),
        _row("deposit_study_probe", "18. Deposit study: position probe", {"probe": paths.STUDY_PROBE},
             "synthetic:fig_position_probe", "synthetic:load_probe", scope="global", group="deposit_study"),
        _row("regime_study", "19. Regime study: accuracy and layer-0 drops against steps and distance",
             {"classifiers": paths.REGIME_CLASSIFIERS}, "synthetic:fig_regime_study", "synthetic:load_classifiers",
             scope="global", group="regime_study"),
        _row("scale_study", "20. Scale study: the first paper's numbers against model size",
             {"scale": paths.SCALE_TABLE["csv"]}, "scale:fig_scale", "scale:load_scale", scope="global",
             group="scale_study"),
    ]
}  # fmt: skip


def of_group(group: str) -> list[FigureRow]:
    """The figures target ``group`` builds."""
    return [row for row in FIGURES.values() if row.group == group]


HEATMAP_STEPS = 4  # checkpoints shown side by side in the trajectory's r heatmap


def heatmap_variants(variants) -> list[str]:
    """Up to HEATMAP_STEPS checkpoints, evenly spaced in checkpoint index, first and last included."""
    steps = sorted((v for v in variants if variant_step(v) is not None), key=variant_order)
    if len(steps) <= HEATMAP_STEPS:
        return steps
    last = len(steps) - 1
    picks = sorted({round(i * last / (HEATMAP_STEPS - 1)) for i in range(HEATMAP_STEPS)})
    return [steps[i] for i in picks]


def figure_variants(config: dict, row: FigureRow, model: str | None = None) -> list[str]:
    """The variants a figure's inputs are expanded over, in the workflow's order: those of the step it reads; a
    trajectory model's (``model``) few checkpoints; none where its inputs are not expanded over variants."""
    if "variant" not in row.expanded():
        return []
    if row.group == "trajectory":
        return heatmap_variants(variants(config, model))
    return step_variants(config, row.step)


def figure_inputs(config: dict, wildcards) -> dict[str, list[str]]:
    """The inputs of the figure a job's wildcards name (``figure``, and its scope's): role -> files, the wildcards of
    its scope kept, every other one expanded over its values in the workflow's order (the variants of the step it
    reads; of a trajectory model, a few checkpoints)."""
    row = FIGURES[wildcards.figure]
    kept = {name: [getattr(wildcards, name)] for name in row.wildcards}
    model = kept.get("model", [None])[0]
    values = {"model": [m["name"] for m in config["models"]], "variant": figure_variants(config, row, model)}
    over = {name: values[name] for name in row.expanded()}
    return {role: paths.expand(template, **kept, **over) for role, template in row.inputs.items()}


def figure_outputs(row: FigureRow, values: dict[str, list[str]]) -> list[str]:
    """Every PNG and PDF of ``row`` for wildcard ``values``."""
    return [path for ext in paths.FIGURE_FORMATS for path in row.paths(values, ext)]


def of_scope(scope: str) -> list[str]:
    """The names of the figures of ``scope`` (the ``{figure}`` wildcard's values in its rule)."""
    return [name for name, row in FIGURES.items() if row.scope == scope]


def hashed_leaves(row: FigureRow) -> list[str]:
    """The config leaves a figure's params read: the random-init seeds where its inputs are expanded over the
    variants (a trajectory model's checkpoints are its own entry's), the `intervals` settings where it bootstraps."""
    leaves = ["random_init_seeds"] if "variant" in row.expanded() and row.group != "trajectory" else []
    return leaves + (list(INTERVALS.values()) if row.bootstrap else [])


def figure_params(config: dict) -> dict:
    """A figure rule's params, functions of the job's wildcards (``figure`` names its row): the figure, the variants
    its inputs are expanded over (in that order), the `intervals` settings where it bootstraps, and config_hash over
    what those read."""

    def row(wildcards) -> FigureRow:
        return FIGURES[wildcards.figure]

    def config_hash(wildcards) -> str:
        return hash_of(config, hashed_leaves(row(wildcards)), "model" in row(wildcards).wildcards)(wildcards)

    return {
        "figure": lambda w: w.figure,
        "variants": lambda w: figure_variants(config, row(w), getattr(w, "model", None)),
        "n_boot": lambda w: config["intervals"]["bootstrap"] if row(w).bootstrap else None,
        "seed": lambda w: config["intervals"]["seed"] if row(w).bootstrap else None,
        "config_hash": config_hash,
    }
