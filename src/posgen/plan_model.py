"""The arithmetic of posgen.plan's cost model (its docstring and docs/slurm.md, "The cost model"): a model's
:class:`Shape` read from its config, and the work of each part of a job, in FLOPs and bytes, with its seconds at a
device's :class:`posgen.rates.Rates`. ``posgen.plan`` prices the jobs from these; the benchmarks read them here.
Standard library only: the Snakefile's resource callables import it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from posgen.numerics import TOKEN_BLOCK
from posgen.paths import MODELS_DIR
from posgen.rates import Rates
from posgen.shapes import SHAPES

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CG_STEPS = 20  # Method B's conjugate gradients per sink (15-25 measured)
CG_PASSES = 40  # passes over the unknowns per step (posgen.decomposition.design.AdditiveDesign.normal)
CAPTURE_OVERHEAD = 1.3  # extraction through the capturing backend over a plain forward pass (bench scale)


# --------------------------------------------------------------------------------------------------- shapes


def widest_head(c: dict, default: int) -> int:
    """A config dict's q/k head size; where it varies by layer (Gemma 4's full layers: ``global_head_dim`` or a
    ``per_layer_config`` override), the widest, which qk.h5 stores every layer at (docs/data-model.md)."""
    sizes = [int(c.get("head_dim") or default), int(c.get("global_head_dim") or 0)]
    sizes += [int(o.get("head_dim") or 0) for o in (c.get("per_layer_config") or {}).values() if isinstance(o, dict)]
    return max(sizes)


@dataclass(frozen=True)
class Shape:
    """What the cost model reads from a model config (``config.json`` keys; parameter counts analytic)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    sliding_window: int = 0  # 0: every layer global
    n_sliding: int = 0  # layers with the sliding window
    softcap: bool = False

    @classmethod
    def from_dict(cls, config: dict) -> "Shape":
        """From a ``config.json`` dict (a multimodal config's ``text_config`` wins)."""
        c = {**config, **config.get("text_config", {})}
        try:
            n_heads = int(c["num_attention_heads"])
            hidden = int(c["hidden_size"])
            n_layers = int(c["num_hidden_layers"])
            intermediate = int(c["intermediate_size"])
            vocab = int(c["vocab_size"])
        except KeyError as err:
            raise KeyError(f"model config: no {err.args[0]!r} (not a decoder config this plan can read)") from None
        window = int(c.get("sliding_window") or 0)
        types = c.get("layer_types")
        if types:
            n_sliding = sum(t == "sliding_attention" for t in types[:n_layers])
        elif c.get("model_type") == "gemma2":
            n_sliding = (n_layers + 1) // 2  # alternating local/global, local first
        elif c.get("model_type") in ("gemma3", "gemma3_text"):
            pattern = int(c.get("sliding_window_pattern", 6))  # every pattern-th layer is global
            n_sliding = n_layers - n_layers // pattern
        elif c.get("model_type") in ("qwen2", "qwen3") and not c.get("use_sliding_window", False):
            n_sliding = 0
        else:
            n_sliding = n_layers if window else 0
        return cls(
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(c.get("num_key_value_heads") or n_heads),
            head_dim=widest_head(c, hidden // n_heads),
            hidden=hidden,
            intermediate=intermediate,
            vocab=vocab,
            tied=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=c.get("model_type") == "qwen2" or bool(c.get("attention_bias", False)),
            sliding_window=window if n_sliding else 0,
            n_sliding=n_sliding,
            softcap=bool(c.get("attn_logit_softcapping")),
        )

    @property
    def n_body(self) -> int:
        """Parameters of the decoder layers (attention, gated MLP, norms): what every token multiplies."""
        H, Hkv, d, D = self.n_heads, self.n_kv_heads, self.head_dim, self.hidden
        attention = D * d * (2 * H + 2 * Hkv) + (H + 2 * Hkv) * d * self.qkv_bias
        return self.n_layers * (attention + 3 * D * self.intermediate + 4 * D)

    @property
    def n_params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.n_body + embeddings + self.hidden

    def windows(self, n_tokens: int) -> list[int]:
        """The distinct attention masks of the analysis: 0 (global) and the sliding window if it is < T."""
        out = [0] if self.n_sliding < self.n_layers else []
        if self.n_sliding and 0 < self.sliding_window < n_tokens:
            out.append(self.sliding_window)
        elif self.n_sliding:
            out = [0]
        return out

    def qk_bytes(self, n_tokens: int, dtype: str = "float32") -> int:
        """One window's pre-RoPE q/k of every layer in ``dtype``."""
        return self.n_layers * (self.n_heads + self.n_kv_heads) * n_tokens * self.head_dim * DTYPE_BYTES[dtype]

    def logits_bytes(self, n_tokens: int) -> int:
        """One layer's float32 attention logits of one window."""
        return self.n_heads * n_tokens * n_tokens * 4


def model_shape(entry: dict, models_dir: str | Path = MODELS_DIR) -> Shape | None:
    """The shape of a config's model entry: its acquired config.json, else a recorded shape, else None."""
    acquired = Path(models_dir) / entry["name"] / "config.json"
    if acquired.exists():
        return Shape.from_dict(json.loads(acquired.read_text()))
    source = entry.get("source", "")
    names = [entry["name"], source.partition(":")[2]]
    names.append(names[1].split("@")[0].split("/")[-1].lower())  # hf:meta-llama/Llama-3.1-8B@... -> llama-3.1-8b
    for name in names:
        if name in SHAPES:
            return Shape.from_dict(SHAPES[name])
    return None


def model_shape_at(model_dir: str | Path, entry: dict, variant: str = "") -> Shape | None:
    """The shape of an acquired model folder (a checkpoint series keeps its config in ``<variant>/``), else of its
    config entry (:func:`model_shape`)."""
    model_dir = Path(model_dir)
    for folder in (model_dir, model_dir / variant):
        if (folder / "config.json").is_file():
            return Shape.from_dict(json.loads((folder / "config.json").read_text()))
    return model_shape(entry, model_dir.parent)


# ----------------------------------------------------------------------------------------------- FLOPs


def forward_flops(shape: Shape, n_tokens: int) -> float:
    """One window through the decoder layers: projections and MLPs plus causal QK^T and AV."""
    T = n_tokens
    return 2 * shape.n_body * T + 2 * shape.n_layers * shape.n_heads * shape.head_dim * T * T


def _n_delta(n_tokens: int, window: int) -> int:
    return window or n_tokens


def moments_flops(shape: Shape, n_tokens: int, n_distances: int, window: int = 0) -> float:
    """masked_moments of one (window, layer), float64: Gram matrices and key-side products, ragged columns."""
    H, Hkv, d, T = shape.n_heads, shape.n_kv_heads, shape.head_dim, n_tokens
    C = TOKEN_BLOCK * (3 if window else 1)
    k = 3 + n_distances  # key sets [x | f | phi] and every g_D
    return (26 * H + 2 * Hkv) * T * d * d + 2 * H * T * C * d * k + 2 * H * T * C * k * k


def method_b_cost(shape: Shape, n_tokens: int, window: int = 0) -> tuple[float, float]:
    """(FLOPs, bytes streamed) of Method B on one (window, layer): the FFT sums, and the conjugate gradients on
    both sinks (every head at once), each step a few prefix sums over the unknowns."""
    T = n_tokens
    n_z = 2 * T + _n_delta(T, window)
    fft = 10 * (shape.n_heads + shape.n_kv_heads) * shape.head_dim * 2 * T * math.log2(2 * T)
    return fft, 2 * CG_STEPS * CG_PASSES * shape.n_heads * n_z * 8


def error_flops(shape: Shape, n_tokens: int, window: int = 0) -> float:
    """The error-and-bound pass of one (window, layer): the error product ``4 d``, the bound's slow and fast
    bands ``~3 d / 2`` and about 8 elementwise operations per counted entry (two sinks)."""
    T, H, d = n_tokens, shape.n_heads, shape.head_dim
    pairs = T * min(T, window) if window else T * T / 2  # counted entries of one head, per sink
    return (4 * d + 1.5 * d + 8) * H * 2 * pairs


def _layer_windows(shape: Shape, n_tokens: int) -> list[tuple[int, int]]:
    """(effective window, number of layers) over the layers."""
    window = shape.sliding_window if 0 < shape.sliding_window < n_tokens else 0
    if not window:
        return [(0, shape.n_layers)]
    return [(0, shape.n_layers - shape.n_sliding), (window, shape.n_sliding)]


def analysis_parts(shape: Shape, cfg: dict, n_windows: int, n_bound: int, rates: Rates) -> dict:
    """Seconds of the decomposition of ``n_windows`` windows (``n_bound`` of them with the error bound) by part:
    ``moments``, ``method_b``, ``error``; and ``bands``."""
    T = cfg["seq_len"]
    dec = cfg["decomposition"]
    n_distances = len(set(dec["dummy_distances"]) | {dec["dummy_distance"]})
    parts = dict.fromkeys(("moments", "method_b", "error"), 0.0)
    for window, n_layers in _layer_windows(shape, T):
        parts["moments"] += n_windows * n_layers * moments_flops(shape, T, n_distances, window) / rates.moments
        flops, read = method_b_cost(shape, T, window)
        parts["method_b"] += n_windows * n_layers * (flops / rates.factor + read / rates.memory)
        parts["error"] += n_bound * n_layers * error_flops(shape, T, window) / rates.error
    # feature bands: a few elementwise passes over the window's q/k
    parts["bands"] = n_windows * 8 * shape.qk_bytes(T) / 4 / rates.error
    return parts


def analysis_seconds(shape: Shape, cfg: dict, n_windows: int, n_bound: int, rates: Rates, bands: bool = True) -> float:
    """Decomposition (and feature bands) of ``n_windows`` windows, ``n_bound`` of them with the error bound."""
    parts = analysis_parts(shape, cfg, n_windows, n_bound, rates)
    return sum(v for k, v in parts.items() if bands or k != "bands")
