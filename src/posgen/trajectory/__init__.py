"""Training trajectories (issue 13): checkpoints as variants ``step<N>``, a tiny Llama trained by the workflow
(``posgen.trajectory.train``) and the per-step table (``posgen.trajectory.table``); its figures are in
``posgen.figures.trajectory``.

Light on purpose (the Snakefile imports it): no torch, no matplotlib here.
"""

from __future__ import annotations

from posgen.config import variant_order, variant_step

HEATMAP_STEPS = 4  # checkpoints shown side by side in the trajectory's r heatmap


def heatmap_variants(variants) -> list[str]:
    """Up to HEATMAP_STEPS checkpoints, evenly spaced in checkpoint index, first and last included."""
    steps = sorted((v for v in variants if variant_step(v) is not None), key=variant_order)
    if len(steps) <= HEATMAP_STEPS:
        return steps
    last = len(steps) - 1
    picks = sorted({round(i * last / (HEATMAP_STEPS - 1)) for i in range(HEATMAP_STEPS)})
    return [steps[i] for i in picks]
