"""The second paper's family (arXiv 2505.13027, docs/method.md section 8): which positional encoding learns what on
two synthetic classification tasks, and where a small encoder puts its positional reasoning.

``tasks``: the position-sensitive "distance" and position-agnostic "count" data sets; ``pe``: the registry of
positional encodings; ``model``: the encoder classifier; ``train``: its training job; ``analysis``: per-head
ablation (deposit index) and the Toeplitz view of the logits, gathered over (task, pe, seed). Its figures are in
``posgen.figures.synthetic``, its reproduction rows in ``posgen.reproduction``.
"""

TASKS = ("distance", "count")
