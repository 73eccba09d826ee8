"""The paper figures, in layers: ``style`` at the bottom (house style, saving with reproducible bytes, colours,
axis helpers, the shared loaders); one drawing module per family above it (``llm``: the first paper's,
``head_ablation``: the pretrained LLMs' per-head ablation, ``synthetic``: the second paper's and the deposit
study's, ``trajectory``: training trajectories); ``registry`` on top (figure name -> loader and drawing function,
and ``render``, which the figure rules run).

Light on purpose: importing this package imports no matplotlib (posgen.workflow.figures, read at workflow parse time,
sits beside it); import the modules themselves.
"""
