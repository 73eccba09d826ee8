"""A model's per-layer RoPE table: what re-rotates its captured pre-RoPE q/k (docs/method.md section 1).

One type from the capture (:meth:`posgen.llm.capture.Capture.rope`) through the store (qk.h5 holds each array as a
variable of the same name, :data:`ROPE_VARIABLES`; written by :class:`posgen.store.QKWriter`, read by
:func:`posgen.store.read_rope`) to the self-check (:func:`posgen.llm.extract.verify_logits`), Method A
(:class:`posgen.llm.method_a.Terms`), the decomposition and the fused path. No torch here: the store and the figures
read it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posgen.layer_types import layer_type

# qk.h5's variables of the table, in the order they are written: dims and dtype ("str": a string per layer).
# The first five are what the statistics read (PARAMETERS); the rest record each layer's layout.
ROPE_VARIABLES = {
    "inv_freq": (("layer", "band"), "f4"),
    "attention_scaling": (("layer",), "f8"),
    "scaling": (("layer",), "f8"),
    "sliding_window": (("layer",), "i8"),
    "kv_group": (("head",), "i8"),
    "layer_index": (("layer",), "i8"),
    "rotary_dims": (("layer",), "i8"),
    "dim_order": (("layer", "dim"), "i8"),
    "head_dims": (("layer",), "i8"),
    "rope_layout": (("layer",), "str"),
    "rotary_position": (("layer",), "str"),
}
PARAMETERS = ("inv_freq", "attention_scaling", "scaling", "sliding_window", "kv_group")


@dataclass(frozen=True)
class LayerRope:
    """One layer's row of a :class:`RopeTable`: what rotates and scales its q/k."""

    inv_freq: np.ndarray  # (band,) float32 (a torch tensor works as well: readers convert with torch.as_tensor)
    scaling: float
    attention_scaling: float = 1.0
    sliding_window: int = 0  # 0 = global


@dataclass(frozen=True, eq=False)
class RopeTable:
    """Per-layer RoPE parameters in the canonical (half-split) layout, and the layout each layer was found in.

    The layout arrays (docs/data-model.md, qk.h5) may be left out: then the model's own layout is the canonical
    one (every dim rotated, half-split, layers numbered as the model does). Arrays are kept in qk.h5's dtypes.

    A layer whose heads are smaller than the store's ``dim`` (Gemma 4: global layers have larger heads than
    sliding ones) is zero-padded in the middle of each half (:func:`pad_dims`): its bands keep their index, the
    padded bands have frequency 0 and the padded dims are exactly 0, so no logit changes.
    """

    inv_freq: np.ndarray  # (layer, band) float32: theta_l; 0 for a band that does not rotate
    attention_scaling: np.ndarray  # (layer,) float64: the amplitude cos and sin are multiplied with
    scaling: np.ndarray  # (layer,) float64: the logit scale s
    sliding_window: np.ndarray  # (layer,) int64: 0 = global
    kv_group: np.ndarray  # (head,) int64: the KV head each query head reads
    layer_index: np.ndarray | None = None  # (layer,) the model's own index of each layer
    rotary_dims: np.ndarray | None = None  # (layer,) how many head dims the model rotates
    dim_order: np.ndarray | None = None  # (layer, dim) the model's own dim of each stored dim; -1: padding
    head_dims: np.ndarray | None = None  # (layer,) each layer's own head size (the store's dim is the largest)
    rope_layout: np.ndarray | None = None  # (layer,) 'half', 'interleaved' or 'none'
    rotary_position: np.ndarray | None = None  # (layer,) 'first' or 'last'

    def __post_init__(self):
        n_layers, n_band = np.shape(self.inv_freq)
        head_dim = 2 * n_band
        defaults = {
            "layer_index": np.arange(n_layers),
            "rotary_dims": np.full(n_layers, head_dim),
            "dim_order": np.tile(np.arange(head_dim), (n_layers, 1)),
            "head_dims": np.full(n_layers, head_dim),
            "rope_layout": ["half"] * n_layers,
            "rotary_position": ["first"] * n_layers,
        }
        for name, (_, dtype) in ROPE_VARIABLES.items():
            value = getattr(self, name)
            value = defaults[name] if value is None else value
            object.__setattr__(self, name, np.asarray(value, dtype=object if dtype == "str" else dtype))

    @property
    def n_layers(self) -> int:
        return len(self.scaling)

    @property
    def n_heads(self) -> int:
        return len(self.kv_group)

    def layer(self, layer: int) -> LayerRope:
        """Layer ``layer``'s row."""
        return LayerRope(
            inv_freq=self.inv_freq[layer],
            scaling=float(self.scaling[layer]),
            attention_scaling=float(self.attention_scaling[layer]),
            sliding_window=int(self.sliding_window[layer]),
        )

    def layer_types(self, n_tokens: int) -> np.ndarray:
        """The :func:`posgen.layer_types.layer_type` of every layer at sequence length ``n_tokens``."""
        return np.array(
            [layer_type(self.inv_freq[i], int(self.sliding_window[i]), n_tokens) for i in range(self.n_layers)],
            dtype=str,
        )


def pad_dims(n_dims: int, width: int) -> np.ndarray:
    """(n_dims,) where each canonical dim of an ``n_dims``-dim head sits in a ``width``-dim store: the first half
    at ``[0, n_dims / 2)``, the second at ``[width / 2, width / 2 + n_dims / 2)``, so that band b pairs dims b and
    b + width / 2 as the half-split layout requires."""
    half = np.arange(n_dims // 2)
    return np.concatenate([half, width // 2 + half])
