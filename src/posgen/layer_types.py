"""Layer types: the one rule that splits every statistic by layer (docs/method.md, "Layer types").

A layer is ``nope`` when none of its bands rotates (every ``inv_freq`` is 0: the store marks NoPE layers so, and
the unrotated dims of a partial-rotary head are bands of frequency 0), ``sliding`` when its window is shorter than
the sequence (``0 < sliding_window < n_tokens``), else ``global``. No torch here: summaries and figures use it.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

LAYER_TYPES = ("global", "sliding", "nope")


def effective_window(n_tokens: int, sliding_window: int) -> int:
    """0 for a global layer (or a window that covers the whole sequence), else the window."""
    return int(sliding_window) if 0 < sliding_window < n_tokens else 0


def layer_type(inv_freq, sliding_window: int, n_tokens: int) -> str:
    """'nope' if no band rotates (every inv_freq == 0), 'sliding' if 0 < sliding_window < n_tokens, else 'global'.

    A NoPE layer has no positional term in the RoPE sense; a sliding-window layer never sees a distance of its
    window or more.
    """
    if not (np.asarray(inv_freq) > 0).any():
        return "nope"
    return "sliding" if effective_window(n_tokens, sliding_window) else "global"


def layer_types(ds: xr.Dataset) -> np.ndarray:
    """The :func:`layer_type` of every layer of a qk.h5 dataset (its ``token`` length is the sequence length)."""
    n_tokens = ds.sizes["token"]
    inv_freq = np.asarray(ds["inv_freq"].transpose("layer", "band").values)  # (layer, band)
    window = np.asarray(ds["sliding_window"].values)  # (layer,)
    return np.array([layer_type(inv_freq[i], int(window[i]), n_tokens) for i in range(len(window))], dtype=str)


def used_dummy_distance(dummy_distance: int, sliding_window: int, n_tokens: int) -> int:
    """The dummy distance a layer is scored at: ``min(D, window - 1)`` for a sliding-window layer, else D.

    A sliding-window layer only ever sees distances below its window; a larger D would score the semantic term
    at a rotation the layer was never trained on.
    """
    window = effective_window(n_tokens, sliding_window)
    return min(int(dummy_distance), window - 1) if window else int(dummy_distance)
