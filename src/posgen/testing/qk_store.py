"""A ``qk.h5`` built from given q/k arrays, for tests of what reads the store (decomposition, bands, summary).

Written by the same :class:`posgen.store.QKWriter` the extraction uses; token ids and reference logits are
zeros (nothing the readers under test look at).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from posgen.rope_table import RopeTable
from posgen.store import QKLayout, QKWriter

# the attrs of a toy model's trained variant
TOY_ATTRS = {"model": "toy", "variant": "trained", "init_seed": -1}


def toy_rope(inv_freq, kv_group, *, scaling, sliding_window=0, attention_scaling=1.0) -> RopeTable:
    """A :class:`RopeTable` from ``inv_freq`` (layer, band) and ``kv_group`` (head,); ``scaling``,
    ``sliding_window`` and ``attention_scaling`` are per layer or one value for every layer."""
    n_layers = np.shape(inv_freq)[0]

    def per_layer(value):
        return np.full(n_layers, value) if np.ndim(value) == 0 else value

    return RopeTable(
        inv_freq=inv_freq,
        attention_scaling=per_layer(attention_scaling),
        scaling=per_layer(scaling),
        sliding_window=per_layer(sliding_window),
        kv_group=kv_group,
    )


def write_qk_store(
    path: str | Path,
    q: np.ndarray,
    k: np.ndarray,
    rope: RopeTable,
    *,
    samples=None,
    attrs: dict | None = None,
    ref_layers=(0,),
    qk_dtype: str = "float32",
) -> Path:
    """Write q (sample, layer, head, token, dim) and k (sample, layer, kv_head, token, dim) to ``path`` as the
    windows ``samples`` (default 0, 1, ...) with ``attrs`` (default :data:`TOY_ATTRS`); window 0, where present,
    is the reference window. Returns ``path``."""
    n_samples, n_layers, n_heads, n_tokens, head_dim = np.shape(q)
    samples = range(n_samples) if samples is None else samples
    layout = QKLayout(
        samples=samples,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=np.shape(k)[2],
        n_tokens=n_tokens,
        head_dim=head_dim,
        ref_samples=[0],
        ref_layers=list(ref_layers),
        qk_dtype=qk_dtype,
    )
    with QKWriter(path, layout, rope=rope, attrs=TOY_ATTRS if attrs is None else attrs) as w:
        logits_ref = np.zeros((len(ref_layers), n_heads, n_tokens, n_tokens), np.float32)
        for position, sample in enumerate(samples):
            w.write_sample(sample, q[position], k[position], np.zeros(n_tokens, np.int64), logits_ref)
    return Path(path)
