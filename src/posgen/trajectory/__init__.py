"""Training trajectories (issue 13): checkpoints as variants ``step<N>``, a tiny Llama trained by the workflow
(``posgen.trajectory.train``) and the per-step table (``posgen.trajectory.table``); its figures are in
``posgen.figures.trajectory``.

Which checkpoints the trajectory's r heatmap shows: posgen.workflow.figures.heatmap_variants.
"""
