"""The paper figures, declared once: rules/figures.smk makes one ``fig_<name>`` rule per row,
posgen.figures.registry maps each name to its loader and drawing function, and the report test expects one
report entry per output.

Dependency-free (standard library only) so that the Snakefile can import it without torch or matplotlib.
Adding a figure: one row here, one drawing function + loader in its family's module of posgen.figures and one
entry in posgen.figures.registry, one caption in report/.
"""

from __future__ import annotations

import dataclasses
import itertools
import string

# Scopes: which wildcards a figure's outputs carry (one figure per (model, variant), per model, or one in all).
PER_VARIANT = "per_variant"
PER_MODEL = "per_model"
GLOBAL = "global"
SCOPE_WILDCARDS = {PER_VARIANT: ("model", "variant"), PER_MODEL: ("model",), GLOBAL: ()}
OUTPUT_STEM = {
    PER_VARIANT: "results/{model}/figures/{name}_{variant}",
    PER_MODEL: "results/{model}/figures/{name}",
    GLOBAL: "results/figures/{name}",
}
LOG_STEM = {
    PER_VARIANT: "logs/figures/{model}/{name}_{variant}",
    PER_MODEL: "logs/figures/{model}/{name}",
    GLOBAL: "logs/figures/{name}",
}


@dataclasses.dataclass(frozen=True)
class FigureRow:
    """One paper figure.

    ``inputs`` maps a role (the loader's key) to a path template of an upstream output. A template wildcard
    that the scope keeps (``{model}`` for a per-model figure) stays a wildcard of the rule; any other one
    (``{variant}`` in a per-model figure, anything in a global one) is expanded over all its values, in the
    workflow's order, so the role receives a list of files.
    """

    name: str
    category: str  # report menu entry; its leading number fixes the order in the menu
    caption: str  # reStructuredText caption, path relative to the repository root
    inputs: dict[str, str]
    scope: str = PER_MODEL
    bootstrap: bool = False  # takes the `intervals` settings (n_boot, seed)
    step: str = ""  # the step whose outputs it reads, where that step may skip variants (workflow.step_variants)

    def __post_init__(self):
        if self.scope not in SCOPE_WILDCARDS:
            raise ValueError(f"figure {self.name!r}: scope {self.scope!r} is not one of {', '.join(SCOPE_WILDCARDS)}")

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
        return OUTPUT_STEM[self.scope].format(name=self.name, model="{model}", variant="{variant}") + f".{ext}"

    @property
    def log(self) -> str:
        """Log path template of the figure's rule."""
        return LOG_STEM[self.scope].format(name=self.name, model="{model}", variant="{variant}") + ".log"

    def paths(self, values: dict[str, list[str]], ext: str = "png") -> list[str]:
        """Every output path of extension ``ext`` for wildcard ``values`` (``{"model": [...], ...}``)."""
        keys = self.wildcards
        combos = itertools.product(*(values[k] for k in keys))
        return [self.output(ext).format(**dict(zip(keys, combo))) for combo in combos]


def template_fields(template: str) -> list[str]:
    """Wildcard names of a path template (``"results/{model}/{variant}/x.nc"`` -> ``["model", "variant"]``)."""
    return [field for _, field, _, _ in string.Formatter().parse(template) if field]


def _row(name, category, inputs, **kw) -> FigureRow:
    return FigureRow(name, category, f"report/{name}.rst", inputs, **kw)


_EXAMPLES = "results/{model}/{variant}/examples.nc"
_BLOCK_SWAP = "results/{model}/{variant}/block_swap.nc"
_DECOMPOSITION = "results/{model}/{variant}/decomposition.nc"
_PERTURB = "results/{model}/{variant}/perturb.nc"
_ABLATION = "results/synthetic/ablation.nc"
_STUDY = "results/synthetic/deposit_study"

FIGURES = {
    row.name: row
    for row in [
        _row("logit_maps", "1. Logit maps", {"examples": _EXAMPLES}, scope=PER_VARIANT),
        _row("scatter", "2. W against f + g", {"examples": _EXAMPLES}, scope=PER_VARIANT),
        _row("r_heatmap", "3. r over layer x head", {"decomposition": _DECOMPOSITION}),
        _row("layer_r", "4. Per-layer r", {"summary": "results/{model}/summary.nc"}),
        _row("position_share", "4b. Absolute position in q and k", {"summary": "results/{model}/summary.nc"}),
        _row("bands", "5. Feature bands", {"bands": "results/{model}/{variant}/bands.nc"}),
        _row("block_swap", "5b. Block swaps: a second reading per head", {"block_swap": _BLOCK_SWAP}),
        _row("dummy_sweep", "6. Dummy-distance sweep", {"decomposition": _DECOMPOSITION}, bootstrap=True),
        _row("perturb_ppl", "7. Perturbation: perplexity", {"perturb": _PERTURB}, bootstrap=True, step="perturb"),
        _row("perturb_fg", "8. Perturbation: f and g change", {"perturb": _PERTURB}, bootstrap=True, step="perturb"),
        _row("cap", "9. Distance capping", {"cap": "results/{model}/{variant}/cap.nc"}, bootstrap=True, step="cap"),
        # the second paper (docs/method.md section 8): per-head ablation of the pretrained models
        _row(
            "head_ablation",
            "14. Pretrained LLMs: single-head ablation",
            {"head_ablation": "results/{model}/{variant}/head_ablation.nc"},
            step="head_ablation",
        ),
        # the second paper: PE classifiers on the synthetic tasks
        _row(
            "synthetic_accuracy",
            "10. PE x task: accuracy",
            {"training": "results/synthetic/training.nc"},
            scope=GLOBAL,
        ),
        _row("synthetic_ablation", "11. PE x task: single-head ablation", {"ablation": _ABLATION}, scope=GLOBAL),
        _row("synthetic_deposit", "12. PE x task: deposit index", {"ablation": _ABLATION}, scope=GLOBAL),
        _row(
            "synthetic_toeplitz",
            "13. PE x task: Toeplitz share",
            {"toeplitz": "results/synthetic/toeplitz.nc"},
            scope=GLOBAL,
        ),
        _row(
            "synthetic_probe", "13b. PE x task: position probe", {"probe": "results/synthetic/probe.nc"}, scope=GLOBAL
        ),
    ]
}

# Training trajectories (posgen.trajectory): per trajectory model, built by the `trajectory` target only
# (rules/trajectory.smk makes their rules; `all` and its report never list them). The heatmap's variants are a
# few checkpoints (posgen.trajectory.heatmap_variants), not all of them.
TRAJECTORY_FIGURES = {
    row.name: row
    for row in [
        _row("trajectory", "15. Training trajectory", {"trajectory": "results/{model}/trajectory.nc"}),
        _row("trajectory_r_heatmap", "16. Training trajectory: r over layer x head", {"decomposition": _DECOMPOSITION}),
    ]
}

# The deposit study (rules/deposit_study.smk): built by the `deposit_study` target only, never by `all`.
STUDY_FIGURES = {
    row.name: row
    for row in [
        _row(
            "deposit_study", "17. Deposit study: top vs second drop", {"deposit": f"{_STUDY}/deposit.csv"}, scope=GLOBAL
        ),
        _row("deposit_study_probe", "18. Deposit study: position probe", {"probe": f"{_STUDY}/probe.nc"}, scope=GLOBAL),
    ]
}

# The regime study (rules/deposit_study.smk): built by the `regime_study` target only.
REGIME_FIGURES = {
    row.name: row
    for row in [
        _row(
            "regime_study",
            "19. Regime study: accuracy and layer-0 drops against steps and distance",
            {"classifiers": "results/synthetic/regime_study/classifiers.csv"},
            scope=GLOBAL,
        ),
    ]
}
