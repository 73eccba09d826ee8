"""Capture of pre-RoPE queries/keys and of the model's own attention logits.

Two ecosystem mechanisms, no edits to transformers:

* pre-RoPE q/k: forward hooks on the last module before the rotary step -- ``q_norm``/``k_norm`` where the
  attention has them (Gemma 3, Qwen 3, ...), else ``q_proj``/``k_proj`` (Llama, Mistral, Qwen 2, ...).
* post-RoPE q/k and logits: a custom backend registered with ``AttentionInterface`` under ``BACKEND`` (and
  the matching mask under the same name in ``AttentionMaskInterface``; without it the causal mask silently
  disappears). It records what it needs and then runs the real attention: SDPA, or the model's own eager
  attention when the model soft-caps its logits.

The extraction self-check (``posgen.extract``) re-rotates the hooked pre-RoPE vectors and must reproduce the
logits seen by the backend, which proves the hook point is the one the rotary step reads.

Distance capping (LM-Infinite)
------------------------------
``logit_ij = s (R_{min(p_i - p_j, C)} q_i).k_j``: beyond distance C (the distance cap) the query is rotated as
if at distance C. It runs inside the model as the third capturing backend, ``CAPPED_BACKEND`` (eager
attention, its mask registered under the same name); :func:`capped_distances` sets C for a block of forward
passes.
Without a cap, or when no distance exceeds C, it computes exactly what the model's eager attention computes.
:func:`capped_logits` is the same formula from pre-RoPE q/k, the reference the tests hold the backend to.

All three backends are registered when this module is imported: naming one means importing its name from
here, and no other module registers anything.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from posgen import rope

BACKEND = "posgen_capture"
BACKEND_EAGER = "posgen_capture_eager"
CAPPED_BACKEND = "posgen_capped"

_active: "Capture | None" = None


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def _eager_forward(module):
    """The eager attention of the module's own modeling file (keeps soft-capping and other quirks)."""
    return sys.modules[type(module).__module__].eager_attention_forward


# Attention backends that report to a running Capture.
CAPTURING_BACKENDS = (BACKEND, BACKEND_EAGER, CAPPED_BACKEND)


def notify(module, query, key, scaling, kwargs) -> None:
    """Called by a capturing backend with the rotated q/k it is about to attend with."""
    if _active is not None:
        _active._on_attention(module, query, key, scaling, kwargs)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    notify(module, query, key, scaling, kwargs)
    if kwargs.get("softcap") is not None:
        return _eager_forward(module)(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


def _rotate_rows(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, d) by per-row positions (B or 1, T) with unit amplitude."""
    rows = [rope.rotate(x[b], positions[b if positions.shape[0] > 1 else 0], inv_freq) for b in range(x.shape[0])]
    return torch.stack(rows)


def _capped_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The eager attention of transformers' Llama, with distances beyond ``module.posgen_distance_cap`` seen as
    that cap."""
    scaling = module.head_dim**-0.5 if scaling is None else scaling
    notify(module, query, key, scaling, kwargs)  # a running Capture records logits/scaling
    n_rep = query.shape[1] // key.shape[1]
    key_states = _repeat_kv(key, n_rep)
    value_states = _repeat_kv(value, n_rep)
    weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling

    distance_cap = getattr(module, "posgen_distance_cap", None)
    if distance_cap is not None:
        n = query.shape[-2]
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(n, device=query.device)[None]
        far = (positions[:, :, None] - positions[:, None, :]) > distance_cap  # (B or 1, T, T)
        if far.any():
            inv_freq = module.posgen_inv_freq.to(query.device)
            # query and key arrive rotated to their positions p; turning them by C - p and -p gives
            # (R_C q).(R_0 k), the LM-Infinite logit of a pair farther apart than C.
            q_far = _rotate_rows(query, distance_cap - positions, inv_freq)
            k_far = _rotate_rows(key_states, -positions, inv_freq)
            far_weights = (q_far @ k_far.transpose(2, 3)) * scaling
            weights = torch.where(far[:, None], far_weights.to(weights.dtype), weights)

    softcap = kwargs.get("softcap")
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : key_states.shape[-2]]
    weights = torch.nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value_states).transpose(1, 2).contiguous()
    return output, weights


AttentionInterface.register(BACKEND, _attention)
AttentionMaskInterface.register(BACKEND, sdpa_mask)
AttentionInterface.register(BACKEND_EAGER, _attention)
AttentionMaskInterface.register(BACKEND_EAGER, eager_mask)
AttentionInterface.register(CAPPED_BACKEND, _capped_attention)
AttentionMaskInterface.register(CAPPED_BACKEND, eager_mask)


def backend_for(config) -> str:
    """Soft-capping models need the eager path (SDPA cannot soft-cap), hence its additive mask."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return BACKEND_EAGER if getattr(text_config, "attn_logit_softcapping", None) else BACKEND


def load_capturing(
    model_dir, variant: str = "trained", *, dtype: str = "float32", device: str = "cpu", backend: str | None = None
):
    """``(model, tokenizer, manifest)`` of a checkpoint folder, loaded with a capturing backend: ``backend``, or
    the one its config needs (:func:`backend_for`)."""
    from posgen.models import load_model

    if backend is not None and backend not in CAPTURING_BACKENDS:
        raise ValueError(f"backend {backend!r}: not a capturing backend ({', '.join(CAPTURING_BACKENDS)})")
    return load_model(model_dir, variant, dtype=dtype, device=device, attn_implementation=backend or backend_for)


def attention_modules(model) -> list:
    """Self-attention modules in layer order."""
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "q_proj") and hasattr(m, "k_proj")]
    if not found:
        raise NotImplementedError(
            f"{type(model).__name__}: no attention module with q_proj/k_proj (fused qkv projections are not supported)"
        )
    return sorted(found, key=lambda m: m.layer_idx)


def _rotary_module(model):
    for m in model.modules():
        if type(m).__name__.endswith("RotaryEmbedding"):
            return m
    raise NotImplementedError(f"{type(model).__name__}: no rotary embedding module (not a RoPE model?)")


def _heads_first(x: torch.Tensor, n_heads: int, head_dim: int, n_tokens: int) -> torch.Tensor:
    """Bring a hooked projection/norm output to (batch, heads, tokens, head_dim)."""
    if x.ndim == 3:  # (b, s, heads * d): a projection, or a norm over the whole projection
        return x.view(x.shape[0], x.shape[1], n_heads, head_dim).transpose(1, 2)
    if x.ndim == 4 and n_tokens != n_heads:
        if x.shape[1] == n_heads and x.shape[2] == n_tokens:
            return x
        if x.shape[1] == n_tokens and x.shape[2] == n_heads:
            return x.transpose(1, 2)
    raise RuntimeError(f"cannot read hooked q/k of shape {tuple(x.shape)} (heads={n_heads}, tokens={n_tokens})")


class Capture:
    """Collects, per forward pass, pre-RoPE q/k of every layer and the logits of ``ref_layers``.

    Use as a context manager around one or more forward passes; call ``reset`` before each pass.
    Tensors are moved to the CPU as float32 as soon as they are produced.
    """

    def __init__(self, model, ref_layers=()):
        self.model = model
        self.config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.modules = attention_modules(model)
        self.n_layers = len(self.modules)
        self.n_heads = self.config.num_attention_heads
        self.n_kv_heads = getattr(self.config, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.n_heads
        self.ref_layers = {int(layer) % self.n_layers for layer in ref_layers}
        self.keep_logits = False
        self.scaling = np.full(self.n_layers, np.nan)
        self.sliding_window = np.zeros(self.n_layers, dtype=np.int64)
        self.softcap = 0.0
        self._hooks = []
        self.reset(0)

    def reset(self, n_tokens: int, keep_logits: bool = False) -> None:
        self.n_tokens = n_tokens
        self.keep_logits = keep_logits
        self.q = [None] * self.n_layers
        self.k = [None] * self.n_layers
        self.logits = {}

    def _hook(self, name: str, layer: int, n_heads: int):
        def hook(_module, _inputs, output):
            x = _heads_first(output.detach(), n_heads, self.head_dim, self.n_tokens)
            getattr(self, name)[layer] = x.to(device="cpu", dtype=torch.float32)

        return hook

    def _on_attention(self, module, query, key, scaling, kwargs) -> None:
        layer = module.layer_idx
        self.scaling[layer] = scaling if scaling is not None else self.head_dim**-0.5
        self.sliding_window[layer] = kwargs.get("sliding_window") or 0
        self.softcap = float(kwargs.get("softcap") or 0.0)
        if self.keep_logits and layer in self.ref_layers:
            k = _repeat_kv(key.float(), query.shape[1] // key.shape[1])
            self.logits[layer] = ((query.float() @ k.transpose(-1, -2)) * self.scaling[layer]).cpu()

    def __enter__(self):
        global _active
        if self.model.config._attn_implementation not in CAPTURING_BACKENDS:
            raise RuntimeError(f"load the model with attn_implementation={BACKEND!r} to capture it")
        for m in self.modules:
            pre_q, pre_k = (
                (m.q_norm, m.k_norm) if hasattr(m, "q_norm") and hasattr(m, "k_norm") else (m.q_proj, m.k_proj)
            )
            self._hooks.append(pre_q.register_forward_hook(self._hook("q", m.layer_idx, self.n_heads)))
            self._hooks.append(pre_k.register_forward_hook(self._hook("k", m.layer_idx, self.n_kv_heads)))
        _active = self
        return self

    def __exit__(self, *exc):
        global _active
        _active = None
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        return False

    @property
    def capture_point(self) -> str:
        m = self.modules[0]
        return "q_norm/k_norm output" if hasattr(m, "q_norm") else "q_proj/k_proj output"

    def rope(self) -> dict:
        """Per-layer RoPE parameters as read from the model after a forward pass (dynamic RoPE included)."""
        rotary = _rotary_module(self.model)
        layer_types = getattr(self.config, "layer_types", None)
        inv_freq, amplitude = [], []
        for layer in range(self.n_layers):
            kind = layer_types[layer] if layer_types else None
            inv = getattr(rotary, f"{kind}_inv_freq", None) if kind else None
            inv = rotary.inv_freq if inv is None else inv
            amp = getattr(rotary, f"{kind}_attention_scaling", None) if kind else None
            amplitude.append(float(rotary.attention_scaling if amp is None else amp))
            inv_freq.append(inv.detach().float().cpu().numpy())
        inv_freq = np.stack(inv_freq)
        if 2 * inv_freq.shape[1] != self.head_dim:
            raise NotImplementedError(
                f"partial rotary embedding ({2 * inv_freq.shape[1]} of {self.head_dim} dims rotated) is not supported"
            )
        if np.isnan(self.scaling).any():
            raise RuntimeError("rope() needs one captured forward pass first")
        n_rep = self.n_heads // self.n_kv_heads
        return {
            "inv_freq": inv_freq,
            "attention_scaling": np.asarray(amplitude),
            "scaling": self.scaling.copy(),
            "sliding_window": self.sliding_window.copy(),
            "kv_group": np.arange(self.n_heads) // n_rep,
            "softcap": self.softcap,
        }

    def stacked(self, batch_index: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(q, k) of one batch element as arrays (layer, head, token, dim) and (layer, kv_head, token, dim)."""
        q = torch.stack([x[batch_index] for x in self.q]).numpy()
        k = torch.stack([x[batch_index] for x in self.k]).numpy()
        return q, k


# --------------------------------------------------------------------------------------------------------
# Distance capping


@contextlib.contextmanager
def capped_distances(model, distance_cap: int, inv_freq: np.ndarray):
    """Run ``model`` (loaded with ``CAPPED_BACKEND``) with RoPE distances capped at ``distance_cap``.

    ``inv_freq`` (layer, band) is the per-layer RoPE frequency table (``Capture.rope()["inv_freq"]``).
    Outside this context the backend does not cap.
    """
    if model.config._attn_implementation != CAPPED_BACKEND:
        raise RuntimeError(f"load the model with attn_implementation={CAPPED_BACKEND!r} to cap distances")
    modules = attention_modules(model)
    for m in modules:
        m.posgen_distance_cap = distance_cap
        m.posgen_inv_freq = torch.as_tensor(inv_freq[m.layer_idx], dtype=torch.float32)
    try:
        yield model
    finally:
        for m in modules:
            m.posgen_distance_cap = None


def capped_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    scaling: float,
    attention_scaling: float = 1.0,
    distance_cap: int | None = None,
) -> torch.Tensor:
    """Reference for the capped backend: ``s (R_{min(p_i - p_j, C)} q_i).k_j`` from pre-RoPE q/k, (..., T, T)."""
    q_rot = rope.rotate(q, positions, inv_freq, attention_scaling)  # (..., T, d)
    k_rot = rope.rotate(k, positions, inv_freq, attention_scaling)  # (..., T, d)
    w = (q_rot @ k_rot.transpose(-1, -2)) * scaling  # (..., T, T)
    if distance_cap is None:
        return w
    far = (positions[:, None] - positions[None, :]) > distance_cap  # (T, T)
    q_cap = rope.rotate(q, torch.tensor(distance_cap), inv_freq, attention_scaling)  # (..., T, d)
    k_zero = rope.rotate(k, torch.tensor(0), inv_freq, attention_scaling)  # (..., T, d)
    return torch.where(far, (q_cap @ k_zero.transpose(-1, -2)) * scaling, w)


# --------------------------------------------------------------------------------------------------------
# Forward passes


@dataclass
class Pass:
    """One batched forward pass: per-sample NLL and the captured pre-RoPE q/k per layer."""

    nll: np.ndarray  # (N,)
    token_nll: np.ndarray  # (N, T - 1): NLL of the token at positions 1..T-1
    q: list  # per layer (N, H, T, d)
    k: list  # per layer (N, H_kv, T, d)
    positions: torch.Tensor  # (N, T)


def forward_pass(model, recorder: Capture, token_ids: np.ndarray, position_ids: np.ndarray | None = None) -> Pass:
    """NLL per sample (mean over targets 1..T-1) and the q/k ``recorder`` captured in one batched forward pass."""
    device = model.device
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=device)
    n, t = ids.shape
    pos = torch.arange(t).expand(n, t) if position_ids is None else torch.as_tensor(position_ids, dtype=torch.long)
    kwargs = {} if position_ids is None else {"position_ids": pos.to(device)}
    recorder.reset(t)
    with torch.inference_mode():
        # An explicit all-ones mask stops transformers from reading non-monotonic position ids as packed
        # sequences (which would cut the causal mask into blocks).
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **kwargs).logits
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
    token_nll = nll.view(n, t - 1).double().cpu().numpy()
    return Pass(
        nll=token_nll.mean(-1), token_nll=token_nll, q=list(recorder.q), k=list(recorder.k), positions=pos.cpu()
    )
