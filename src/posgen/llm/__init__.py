"""The first paper's wing (Han & Ji 2025, docs/method.md sections 1-7): capture of pre-RoPE queries and keys from a
pretrained model (``capture``, ``families``, ``first_token``), extraction and the fused path (``extract``,
``fused``), per-band statistics (``bands``), Method A's terms (``method_a``), the position-generalisation
experiments (``draws``, ``perturb``), per-head ablation (``head_ablation``), example heads (``examples``), the
summary over windows (``summary``), where the random-init gap comes from (``gap_origin``) and a verdict per claim
(``verdicts``). It stands on the shared ground (``posgen.decomposition``, ``store``, ``models``, ``config``, ...);
the second paper's wing is ``posgen.synthetic``.
"""
