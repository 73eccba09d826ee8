"""posgen: how LLMs compute with positions, as a reproducible workflow.

From Python (README, "From Python"; the functions live in :mod:`posgen.api`)::

    import posgen

    loaded = posgen.load("embedded:smollm2-135m")  # (model, tokenizer, manifest)
    qk = posgen.capture_qk(loaded, posgen.windows(loaded, n_samples=1, seq_len=128))  # as qk.h5
    decomposition = posgen.decompose(qk)  # as decomposition.nc
    posgen.draw("r_heatmap", decomposition)

Importing posgen imports none of torch, xarray or matplotlib (the Snakefile imports posgen's light modules while
it parses): the API is loaded on first use.
"""

import importlib

from posgen.version import VERSION as __version__

# the notebook API: posgen.api's functions, handed on here
API = ("load", "windows", "capture_qk", "decompose", "ablate_heads", "draw", "heads", "classifier_heads", "verdicts")
__all__ = ["__version__", *API]


def __getattr__(name: str):
    if name in API:
        # at first use (PEP 562): posgen.api imports torch, transformers, xarray and matplotlib
        return getattr(importlib.import_module("posgen.api"), name)
    raise AttributeError(f"module 'posgen' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *API])
