"""Capture of pre-RoPE queries/keys and of the model's own attention logits.

Two ecosystem mechanisms, no edits to transformers:

* pre-RoPE q/k: forward hooks on the last module before the rotary step -- ``q_norm``/``k_norm`` (or
  ``q_layernorm``/``k_layernorm``) where the attention has them (Gemma 3, Qwen 3, Phi, StableLM, ...), else
  ``q_proj``/``k_proj`` (Llama, Mistral, Qwen 2, ...), or the fused projection sliced into q and k
  (``qkv_proj`` of Phi-3: [all q | all k | all v]; ``query_key_value`` of GPT-NeoX: [q, k, v] per head).
  Llama 4 normalises q/k (L2) after the rotation; a rotation keeps the norm, so the hooked projection is
  normalised by the model's own ``qk_norm`` before it is stored.
* the RoPE layout of every layer (half-split or interleaved pairs, partial rotary, NoPE) is detected on the
  first captured pass (:func:`posgen.llm.families.detect_layout`) and q/k are stored permuted into the canonical
  half-split layout, where the unrotated dims are bands of frequency 0.
* post-RoPE q/k and logits: a custom backend registered with ``AttentionInterface`` under ``BACKEND`` (and
  the matching mask under the same name in ``AttentionMaskInterface``; without it the causal mask silently
  disappears). It records what it needs and then runs the real attention: SDPA, or the model's own eager
  attention when the model soft-caps its logits or has attention sinks (``BACKEND_EAGER``, with the additive
  mask). ``BACKEND`` refuses sinks and soft-capping rather than drop them.

The extraction self-check (``posgen.llm.extract``) re-rotates the hooked pre-RoPE vectors and must reproduce the
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
from posgen.llm import attention_layers, families
from posgen.rope_table import RopeTable, pad_dims

BACKEND = "posgen_capture"
BACKEND_EAGER = "posgen_capture_eager"
CAPPED_BACKEND = "posgen_capped"
BANDS_BACKEND = "posgen_bands"  # registered by posgen.llm.band_interventions

_active: "Capture | None" = None


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def eager_forward(module):
    """The eager attention of the module's own modeling file (keeps soft-capping and other quirks)."""
    return sys.modules[type(module).__module__].eager_attention_forward


# Attention backends that report to a running Capture.
CAPTURING_BACKENDS = (BACKEND, BACKEND_EAGER, CAPPED_BACKEND, BANDS_BACKEND)


def notify(module, query, key, scaling, kwargs) -> None:
    """Called by a capturing backend with the rotated q/k it is about to attend with."""
    if _active is not None:
        _active._on_attention(module, query, key, scaling, kwargs)


# attention arguments SDPA has no place for: the model's own eager attention must run them
EAGER_ONLY = ("softcap", "s_aux")


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``BACKEND``: SDPA with its boolean mask; refuses what SDPA would silently drop."""
    notify(module, query, key, scaling, kwargs)
    dropped = [name for name in EAGER_ONLY if kwargs.get(name) is not None]
    if dropped:
        raise RuntimeError(
            f"{type(module).__name__}: the model passes {', '.join(dropped)} to its attention, which SDPA drops; "
            f"load it with attn_implementation={BACKEND_EAGER!r} (capture.backend_for picks it)"
        )
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


def _attention_eager_mask(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``BACKEND_EAGER``: the model's own eager attention where it has soft-capping or sinks, else SDPA."""
    notify(module, query, key, scaling, kwargs)
    if any(kwargs.get(name) is not None for name in EAGER_ONLY):
        return eager_forward(module)(
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
    if kwargs.get("s_aux") is not None:
        raise RuntimeError(f"{type(module).__name__}: distance capping does not support attention sinks")
    weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling

    distance_cap = getattr(module, "posgen_distance_cap", None)
    if distance_cap is not None:
        n = query.shape[-2]
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(n, device=query.device)[None]
        far = (positions[:, :, None] - positions[:, None, :]) > distance_cap  # (B or 1, T, T)
        if far.any():
            inv_freq = module.posgen_inv_freq[: query.shape[-1] // 2].to(query.device)  # a padded row: its own bands
            # inv_freq is in the canonical layout: permute the model's dims into it (dot products unchanged)
            layout = getattr(module, "posgen_layout", None)
            query_c = query if layout is None else families.to_canonical(query, layout)  # (B, H, T, d)
            key_c = key_states if layout is None else families.to_canonical(key_states, layout)  # (B, H, T, d)
            # query and key arrive rotated to their positions p; turning them by C - p and -p gives
            # (R_C q).(R_0 k), the LM-Infinite logit of a pair farther apart than C.
            q_far = _rotate_rows(query_c, distance_cap - positions, inv_freq)
            k_far = _rotate_rows(key_c, -positions, inv_freq)
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
AttentionInterface.register(BACKEND_EAGER, _attention_eager_mask)
AttentionMaskInterface.register(BACKEND_EAGER, eager_mask)
AttentionInterface.register(CAPPED_BACKEND, _capped_attention)
AttentionMaskInterface.register(CAPPED_BACKEND, eager_mask)


def backend_for(config) -> str:
    """The capturing backend ``config`` needs; refuses (one line) a family the capture cannot handle.

    Soft-capping and attention sinks need the eager path (SDPA has neither), hence its additive mask.
    """
    families.check_supported(config)
    return BACKEND_EAGER if families.needs_eager_attention(config) else BACKEND


def load_capturing(
    model_dir,
    variant: str = "trained",
    *,
    dtype: str = "float32",
    device: str = "cpu",
    backend: str | None = None,
    device_map: str | None = None,
):
    """``(model, tokenizer, manifest)`` of a checkpoint folder, loaded with a capturing backend: ``backend``, or
    the one its config needs (:func:`backend_for`); ``device_map`` as in :func:`posgen.models.load_model`."""
    from posgen.models import load_model

    if backend is not None and backend not in CAPTURING_BACKENDS:
        raise ValueError(f"backend {backend!r}: not a capturing backend ({', '.join(CAPTURING_BACKENDS)})")
    return load_model(
        model_dir,
        variant,
        dtype=dtype,
        device=device,
        attn_implementation=backend or backend_for,
        device_map=device_map,
    )


def _pre_rope_points(m, n_heads: int, n_kv_heads: int, head_dim: int):
    """``(description, [(module, {name: slicer})])``: where pre-RoPE q/k are read. A slicer turns the module's
    output into ``name`` ("q" or "k") as (batch, tokens, heads, head_dim), or returns None when it only keeps a
    part for a later hook (MLA); without a slicer the output is q or k itself, read by :func:`_heads_first`."""
    if hasattr(m, "query_key_value"):  # GPT-NeoX: per head [q, k, v], head_dim each

        def per_head(part):
            def cut(x):  # (b, s, 3 * H * d) -> (b, s, H, d)
                x = x.view(x.shape[0], x.shape[1], n_heads, 3 * head_dim)
                return x[..., part * head_dim : (part + 1) * head_dim]

            return cut

        return "query_key_value output (per head [q, k, v])", [
            (m.query_key_value, {"q": per_head(0), "k": per_head(1)})
        ]
    if hasattr(m, "kv_a_proj_with_mqa"):  # MLA (DeepSeek): q per head, k = [k_nope per head, k_rot shared]
        q_point = m.q_proj if getattr(m, "q_proj", None) is not None else m.q_b_proj
        nope, rope_dims, lora = m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank
        shared = {}

        def mla_q(x):  # (b, s, H * (nope + rope)) -> (b, s, H, nope + rope)
            return x.unflatten(-1, (n_heads, nope + rope_dims))

        def mla_k_rot(x):  # (b, s, lora + rope): keep the shared pre-RoPE key part for mla_k
            shared["k_rot"] = x[..., lora:]
            return None

        def mla_k(x):  # (b, [1,] s, H * (nope + v)) -> (b, s, H, nope + rope)
            x = x.flatten(1, -2)  # (b, s, H * (nope + v)): the latent may arrive as one 'head'
            k_nope = x.unflatten(-1, (n_heads, -1))[..., :nope]  # (b, s, H, nope)
            k_rot = shared.pop("k_rot")[:, :, None, :].expand(-1, -1, n_heads, -1)  # (b, s, H, rope)
            return torch.cat([k_nope, k_rot], dim=-1)

        q_name = "q_proj" if q_point is getattr(m, "q_proj", None) else "q_b_proj"
        description = f"{q_name} output; k: kv_b_proj (k_nope) + kv_a_proj_with_mqa (shared k_rot)"
        return description, [
            (q_point, {"q": mla_q}),
            (m.kv_a_proj_with_mqa, {"k": mla_k_rot}),
            (m.kv_b_proj, {"k": mla_k}),
        ]
    if hasattr(m, "qkv_proj"):  # Phi-3: [all q | all k | all v]
        q_size, k_size = n_heads * head_dim, n_kv_heads * head_dim

        def q_cut(x):  # (b, s, (H + 2 H_kv) d) -> (b, s, H, d)
            return x[..., :q_size].unflatten(-1, (n_heads, head_dim))

        def k_cut(x):  # (b, s, (H + 2 H_kv) d) -> (b, s, H_kv, d)
            return x[..., q_size : q_size + k_size].unflatten(-1, (n_kv_heads, head_dim))

        slicers = {"q": q_cut, "k": k_cut}
        return "qkv_proj output ([q | k | v])", [(m.qkv_proj, slicers)]
    # a KV-sharing layer has no key projection: its keys are an earlier layer's
    keys = not attention_layers.shares_keys(m)
    for q_name, k_name in [("q_norm", "k_norm"), ("q_layernorm", "k_layernorm")]:
        q_mod, k_mod = getattr(m, q_name, None), getattr(m, k_name, None)
        if q_mod is not None and (k_mod is not None or not keys):
            return f"{q_name}/{k_name} output", [(q_mod, {"q": None})] + [(k_mod, {"k": None})] * keys
    return "q_proj/k_proj output", [(m.q_proj, {"q": None})] + [(m.k_proj, {"k": None})] * keys


def _rotary_module(model):
    for m in model.modules():
        if type(m).__name__.endswith("RotaryEmbedding"):
            return m
    raise families.UnsupportedModelError(
        f"{type(model).__name__}: not supported: no rotary embedding module (not a RoPE model?)"
    )


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


def layout_tolerance(dtype: torch.dtype) -> float:
    """Relative error within which a candidate RoPE layout must reproduce the model's rotated q/k: float32
    rounding, or a few eps of a half-precision dtype (the model rotates in it). A wrong layout is off by O(1)."""
    return max(1e-4, 8 * torch.finfo(dtype).eps)


class Capture:
    """Collects, per forward pass, pre-RoPE q/k of every attention layer and the logits of ``ref_layers``.

    Use as a context manager around one or more forward passes; call ``reset`` before each pass.
    Tensors are moved to the CPU as float32 as soon as they are produced, in the canonical RoPE layout
    (:mod:`posgen.llm.families`) detected on the first pass. Layers are numbered by position among the attention
    layers; ``layer_index`` holds the model's own index of each (they differ in hybrid stacks).
    With ``check_tokens`` > 0, passes with ``keep_logits`` also keep the logits of every layer on the first
    ``check_tokens`` tokens (``prefix_logits``), for the all-layer self-check.
    """

    def __init__(self, model, ref_layers=(), check_tokens: int = 0):
        self.model = model
        self.config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.modules = attention_layers.attention_modules(model)
        self.n_layers = len(self.modules)
        self.layer_index = np.array([m.layer_idx for m in self.modules], dtype=np.int64)
        self._position = {int(m.layer_idx): i for i, m in enumerate(self.modules)}
        where = families.architecture(model.config)
        self.n_heads = self.config.num_attention_heads
        self.n_kv_heads = attention_layers.kv_heads(self.modules, self.config, self.n_heads, where)
        self.head_dims = np.array(
            [attention_layers.head_size(m, self.config, self.n_heads) for m in self.modules], dtype=np.int64
        )
        self.head_dim = int(self.head_dims.max())  # the store's dim: smaller heads are zero-padded (pad_dims)
        if hasattr(self.modules[0], "qk_head_dim"):  # MLA: k expanded per head
            self.n_kv_heads = self.n_heads
        self._key_readers = attention_layers.key_readers(self.modules, where)
        self.ref_layers = {int(layer) % self.n_layers for layer in ref_layers}
        self.check_tokens = int(check_tokens)
        self.keep_logits = False
        self.scaling = np.full(self.n_layers, np.nan)
        self.sliding_window = np.zeros(self.n_layers, dtype=np.int64)
        self.softcap = 0.0
        self.layouts: list = [None] * self.n_layers
        self.layout_error = np.full(self.n_layers, np.nan)
        self.dtype = next(model.parameters()).dtype
        # Llama 4 normalises q/k after the rotation; the norm commutes with it, so it is applied to the hook
        self._post_norm = {i: m.qk_norm for i, m in enumerate(self.modules) if getattr(m, "qk_norm", None)}
        self._hooks = []
        self.reset(0)

    def reset(self, n_tokens: int, keep_logits: bool = False) -> None:
        self.n_tokens = n_tokens
        self.keep_logits = keep_logits
        self.q = [None] * self.n_layers
        self.k = [None] * self.n_layers
        self.logits = {}
        self.prefix_logits = {}

    def _hook(self, slicers: dict, layer: int):
        def hook(_module, _inputs, output):
            for name, slicer in slicers.items():
                n_heads = self.n_heads if name == "q" else self.n_kv_heads
                x = output.detach()
                if slicer is not None:
                    x = slicer(x)  # (b, s, H, d), or None: a part kept for another hook
                    if x is None:
                        continue
                    x = x.transpose(1, 2)  # (b, H, s, d)
                else:
                    x = _heads_first(x, n_heads, int(self.head_dims[layer]), self.n_tokens)  # (b, H, s, d)
                if layer in self._post_norm:
                    x = self._post_norm[layer](x)
                for reader in [layer] if name == "q" else self._key_readers[layer]:
                    getattr(self, name)[reader] = self._stored(x, reader)

        return hook

    def _stored(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """Hooked (b, H, s, d_layer) as stored: float32 on the CPU, in the canonical layout, zero-padded to the
        store's dim (:func:`posgen.rope_table.pad_dims`); in the model's own order before the layout is known."""
        layout = self.layouts[layer]
        if layout is not None:
            x = families.to_canonical(x, layout)  # (b, H, s, d_layer)
        x = x.to(device="cpu", dtype=torch.float32)
        if layout is None or x.shape[-1] == self.head_dim:
            return x
        padded = x.new_zeros(*x.shape[:-1], self.head_dim)  # (b, H, s, d)
        padded[..., torch.as_tensor(pad_dims(x.shape[-1], self.head_dim))] = x
        return padded

    def _rotary_table(self, layer: int) -> tuple[np.ndarray, float]:
        """The model's own (inv_freq, attention_scaling) for attention layer ``layer`` (its layer type's table)."""
        rotary = _rotary_module(self.model)
        layer_types = getattr(self.config, "layer_types", None)
        kind = layer_types[self.layer_index[layer]] if layer_types else None
        inv = getattr(rotary, f"{kind}_inv_freq", None) if kind else None
        inv = rotary.inv_freq if inv is None else inv
        amp = getattr(rotary, f"{kind}_attention_scaling", None) if kind else None
        amp = float(rotary.attention_scaling if amp is None else amp)
        return inv.detach().float().cpu().numpy(), amp

    def _detect(self, module, layer: int, query, key, kwargs) -> None:
        """Find the layer's RoPE layout from its hooked (pre-RoPE) and backend (rotated) q/k; canonicalise q/k."""
        if self.q[layer] is None or self.k[layer] is None:
            raise RuntimeError(f"layer {layer}: the pre-RoPE hooks saw nothing before the attention backend ran")
        positions = kwargs.get("position_ids")
        n = query.shape[-2]
        positions = torch.arange(n) if positions is None else positions[0].detach().cpu()
        inv_freq, amplitude = self._rotary_table(layer)
        where = f"{families.architecture(self.model.config)} layer {int(self.layer_index[layer])}"
        layout, err = families.detect_layout(
            self.q[layer][:1],
            query[:1].detach().to(device="cpu", dtype=torch.float32),
            self.k[layer][:1],
            key[:1].detach().to(device="cpu", dtype=torch.float32),
            positions,
            inv_freq,
            amplitude,
            layout_tolerance(self.dtype),
            where,
        )
        self.layouts[layer] = layout
        self.layout_error[layer] = err
        module.posgen_layout = None if layout.backend.identity else layout.backend  # read by the capped backend
        self.q[layer] = self._stored(self.q[layer], layer)
        self.k[layer] = self._stored(self.k[layer], layer)

    def _on_attention(self, module, query, key, scaling, kwargs) -> None:
        layer = self._position[int(module.layer_idx)]
        self.scaling[layer] = scaling if scaling is not None else int(self.head_dims[layer]) ** -0.5
        self.sliding_window[layer] = kwargs.get("sliding_window") or 0
        self.softcap = float(kwargs.get("softcap") or 0.0)
        if self.layouts[layer] is None:
            self._detect(module, layer, query, key, kwargs)
        if self.keep_logits and (layer in self.ref_layers or self.check_tokens > 0):
            k = _repeat_kv(key.float(), query.shape[1] // key.shape[1])  # (b, H, T, d)
            if layer in self.ref_layers:
                self.logits[layer] = ((query.float() @ k.transpose(-1, -2)) * self.scaling[layer]).cpu()
            if self.check_tokens > 0:
                p = min(self.check_tokens, query.shape[-2])
                q_p, k_p = query[..., :p, :].float(), k[..., :p, :]  # (b, H, p, d)
                self.prefix_logits[layer] = ((q_p @ k_p.transpose(-1, -2)) * self.scaling[layer]).cpu()

    def __enter__(self):
        global _active
        if self.model.config._attn_implementation not in CAPTURING_BACKENDS:
            raise RuntimeError(f"load the model with attn_implementation={BACKEND!r} to capture it")
        for layer, m in enumerate(self.modules):
            _, points = _pre_rope_points(m, self.n_heads, self.n_kv_heads, int(self.head_dims[layer]))
            for point, slicers in points:
                self._hooks.append(point.register_forward_hook(self._hook(slicers, layer)))
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
        description, _ = _pre_rope_points(self.modules[0], self.n_heads, self.n_kv_heads, int(self.head_dims[0]))
        return description + (", then the model's qk_norm" if self._post_norm else "")

    def rope(self) -> RopeTable:
        """Per-layer RoPE parameters in the canonical layout, as read from the model after a forward pass
        (dynamic RoPE included), with the layout each layer was found in."""
        if np.isnan(self.scaling).any() or any(layout is None for layout in self.layouts):
            raise RuntimeError("rope() needs one captured forward pass first")
        inv_freq, amplitude, dim_order = [], [], []
        for layer, layout in enumerate(self.layouts):
            inv, amp = self._rotary_table(layer)
            if not (layout.identity and layout.rotary_dims == self.head_dims[layer]):
                inv = layout.canonical_inv_freq(inv)  # else the model's table as is
            bands = np.zeros(self.head_dim // 2, dtype=np.float32)  # padded bands do not rotate
            bands[: inv.size] = inv
            inv_freq.append(bands)
            amplitude.append(amp if layout.rotary_dims else 1.0)  # NoPE: no rotation, no amplitude
            order = np.full(self.head_dim, -1)  # -1: a padded dim
            order[pad_dims(layout.dim_order.size, self.head_dim)] = layout.dim_order
            dim_order.append(order)
        n_rep = self.n_heads // self.n_kv_heads
        return RopeTable(
            inv_freq=np.stack(inv_freq),
            attention_scaling=np.asarray(amplitude),
            scaling=self.scaling.copy(),
            sliding_window=self.sliding_window.copy(),
            kv_group=np.arange(self.n_heads) // n_rep,
            layer_index=self.layer_index.copy(),
            rotary_dims=np.array([layout.rotary_dims for layout in self.layouts], dtype=np.int64),
            rope_layout=np.array([layout.rope_layout for layout in self.layouts], dtype=object),
            rotary_position=np.array([layout.rotary_position for layout in self.layouts], dtype=object),
            dim_order=np.stack(dim_order).astype(np.int64),
            head_dims=self.head_dims.copy(),
        )

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

    ``inv_freq`` (layer, band) is the per-layer RoPE frequency table (``Capture.rope().inv_freq``), in the
    canonical layout of a :class:`Capture` that has run on this model (it leaves each layer's layout there).
    Outside this context the backend does not cap.
    """
    if model.config._attn_implementation != CAPPED_BACKEND:
        raise RuntimeError(f"load the model with attn_implementation={CAPPED_BACKEND!r} to cap distances")
    modules = attention_layers.attention_modules(model)
    for layer, m in enumerate(modules):
        m.posgen_distance_cap = distance_cap
        m.posgen_inv_freq = torch.as_tensor(inv_freq[layer], dtype=torch.float32)
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
