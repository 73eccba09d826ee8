"""The top of the figures: :func:`draw` (a figure of the table posgen.workflow.figures.FIGURES by its row's loader
and drawing function, resolved by name) and :func:`render` and :func:`figure_step`, which the figure rules run."""

from __future__ import annotations

from pathlib import Path

import xarray as xr
from matplotlib.figure import Figure

from posgen.figures.style import save_figure
from posgen.store import stable_provenance
from posgen.workflow.figures import FIGURES
from posgen.workflow.job import resolve


def draw(name: str, inputs: dict, *, variants=(), n_boot: int | None = 1000, seed: int | None = 0) -> Figure:
    """Load figure ``name``'s inputs (``inputs``: role -> path or paths, or the datasets of those files) and draw
    it. ``n_boot`` and ``seed`` (the `intervals` settings) are used only by figures whose table row bootstraps."""
    if name not in FIGURES:
        raise KeyError(f"figure {name!r}: unknown (known: {', '.join(FIGURES)})")
    row = FIGURES[name]
    inputs = {k: [v] if isinstance(v, (str, Path, xr.Dataset)) else list(v) for k, v in inputs.items()}
    data = resolve(row.load)(inputs, list(variants or []))
    func = resolve(row.draw)
    return func(data, n_boot=n_boot, seed=seed) if row.bootstrap else func(data)


def render(
    name: str,
    inputs: dict,
    png: str | Path,
    pdf: str | Path,
    *,
    variants=(),
    n_boot: int | None = 1000,
    seed: int | None = 0,
    **attrs,
) -> None:
    """Load figure ``name``'s input files (``inputs``: role -> path or paths), draw it (:func:`draw`), save
    PNG + PDF."""
    fig = draw(name, inputs, variants=variants, n_boot=n_boot, seed=seed)
    save_figure(fig, png, pdf, provenance=stable_provenance(figure=name, **attrs))


def figure_step(job) -> None:
    """A figure rule's job (a :class:`posgen.workflow.job.StepJob`): the figure drawn and saved, its wildcards
    (model, variant: none for a global figure) recorded in the provenance beside the figure's name."""
    p = job.params
    scope = {name: value for name, value in job.wildcards.items() if name != "figure"}
    render(
        p["figure"],
        dict(job.input),
        job.output["png"],
        job.output["pdf"],
        variants=p["variants"],
        n_boot=p["n_boot"],
        seed=p["seed"],
        **scope,
        config_hash=p["config_hash"],
    )
