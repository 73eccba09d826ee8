"""Band interventions (issue 65; docs/method.md section 6.4): the model run with its RoPE changed per band.

A band is a pair of canonical head dims (l, l + d/2) that RoPE turns by ``inv_freq[l]`` per position
(posgen.llm.families, "Canonical layout"); the rotating bands of a layer are those with ``inv_freq > 0`` (a
partial-rotary head's unrotated dims and a NoPE layer have none), ordered here from the slowest (lowest frequency)
to the fastest. A :class:`BandSetting` changes them in one of three ways:

* ``below``: the lowest ``share`` of the rotating bands stop rotating (angle 0: p-RoPE of Barbero et al. 2025,
  applied to a trained model without retraining);
* ``above``: the highest ``share`` stop rotating;
* ``ablate``: the q and k components of one ``quarter`` of the rotating bands (0 the lowest, 3 the highest) are
  set to zero.

The attention backend :data:`BANDS_BACKEND` (transformers' attention interface; no source patched) receives q and k
rotated by the model, turns the stopped bands back by their positions (so they carry the model's amplitude at angle
0, as an unrotated vector would), zeroes the ablated ones, and attends with the model's own eager attention; a
running :class:`posgen.llm.capture.Capture` sees the modified q and k. Outside :func:`intervening`, or with a setting
that changes no band, it is the model's own eager attention on the model's own q and k.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from posgen import rope
from posgen.llm import attention_layers, families
from posgen.llm.capture import notify

BANDS_BACKEND = "posgen_bands"
KINDS = ("none", "below", "above", "ablate")
QUARTERS = ("lowest", "second", "third", "highest")


@dataclass(frozen=True)
class BandSetting:
    """One intervention: ``kind`` (:data:`KINDS`), the ``share`` of the rotating bands it stops (below, above), or
    the ``quarter`` it zeroes (ablate)."""

    kind: str
    share: float = 0.0
    quarter: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"band setting {self.kind!r}: not one of {', '.join(KINDS)}")
        if not 0.0 <= self.share <= 1.0 or self.quarter not in range(len(QUARTERS)):
            raise ValueError(f"band setting {self.label}: share in [0, 1], quarter in 0..{len(QUARTERS) - 1}")

    @property
    def label(self) -> str:
        """``none``, ``below-25``, ``above-50``, ``ablate-lowest``: the setting's coordinate in band.nc."""
        if self.kind == "ablate":
            return f"ablate-{QUARTERS[self.quarter]}"
        return self.kind if self.kind == "none" else f"{self.kind}-{round(100 * self.share)}"


def grid(shares=(0.25, 0.5, 0.75), ablate: bool = True) -> list[BandSetting]:
    """The unmodified model, truncation from below and from above at each of ``shares``, and (``ablate``) each
    quarter zeroed."""
    out = [BandSetting("none")]
    out += [BandSetting(kind, share) for kind in ("below", "above") for share in shares]
    return out + ([BandSetting("ablate", quarter=q) for q in range(len(QUARTERS))] if ablate else [])


def band_masks(inv_freq: np.ndarray, setting: BandSetting) -> tuple[np.ndarray, np.ndarray]:
    """(stop, zero): (band,) booleans of one layer's canonical table ``inv_freq`` (band,): the bands that stop
    rotating and the bands whose components are zeroed under ``setting``."""
    inv_freq = np.asarray(inv_freq, dtype=np.float64)
    rotating = np.flatnonzero(inv_freq > 0)
    slow_first = rotating[np.argsort(inv_freq[rotating], kind="stable")]  # (n,) lowest frequency first
    n = slow_first.size
    stop, zero = np.zeros(inv_freq.size, bool), np.zeros(inv_freq.size, bool)
    count = int(round(setting.share * n))
    if setting.kind == "below":
        stop[slow_first[:count]] = True
    elif setting.kind == "above":
        stop[slow_first[n - count :]] = True
    elif setting.kind == "ablate":
        edges = np.linspace(0, n, len(QUARTERS) + 1).round().astype(int)  # quarters of the rotating bands
        zero[slow_first[edges[setting.quarter] : edges[setting.quarter + 1]]] = True
    return stop, zero


def intervene(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, stop: torch.Tensor, zero: torch.Tensor
) -> torch.Tensor:
    """``x`` (..., T, d), canonical and rotated to ``positions`` (T,) by ``inv_freq`` (d/2,), with the ``stop``
    bands (d/2,) turned back to angle 0 and the ``zero`` bands' two dims set to zero."""
    back = rope.rotate(x, -positions, inv_freq * stop)  # (..., T, d): only the stopped bands turn
    keep = (~zero).to(back.dtype).repeat(2)  # (d,): band l is dims l and l + d/2
    return back * keep


def _eager_forward(module):
    """The eager attention of the module's own modeling file (soft-capping and other quirks kept)."""
    return sys.modules[type(module).__module__].eager_attention_forward


def _band_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``BANDS_BACKEND``: the module's own eager attention on q and k with its bands changed (module docstring)."""
    change = getattr(module, "posgen_bands", None)
    if change is not None:
        inv_freq, stop, zero = (t.to(query.device) for t in change)
        positions = kwargs.get("position_ids")
        positions = torch.arange(query.shape[-2], device=query.device) if positions is None else positions[0]
        layout = getattr(module, "posgen_layout", None)
        query = query if layout is None else families.to_canonical(query, layout)  # (B, H, T, d)
        key = key if layout is None else families.to_canonical(key, layout)  # (B, H_kv, T, d)
        query = intervene(query, positions, inv_freq, stop, zero).to(value.dtype)
        key = intervene(key, positions, inv_freq, stop, zero).to(value.dtype)
    notify(module, query, key, scaling, kwargs)
    out = _eager_forward(module)(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if getattr(module, "posgen_probs", None) is not None:  # band_effects reads the attention rows
        module.posgen_probs.append(out[1].detach().float())
    return out


AttentionInterface.register(BANDS_BACKEND, _band_attention)
AttentionMaskInterface.register(BANDS_BACKEND, eager_mask)


@contextlib.contextmanager
def intervening(model, setting: BandSetting, inv_freq: np.ndarray, layouts=None):
    """Run ``model`` (loaded with ``attn_implementation=BANDS_BACKEND``) under ``setting``: ``inv_freq`` (layer,
    band) the canonical RoPE table (``Capture.rope().inv_freq``), ``layouts`` each attention layer's
    :class:`posgen.llm.families.Layout` (None: those a Capture that ran on this model left, else the head dims
    are taken as canonical). A setting that changes no band leaves the model as it is."""
    if model.config._attn_implementation != BANDS_BACKEND:
        raise RuntimeError(f"load the model with attn_implementation={BANDS_BACKEND!r} to change its bands")
    modules = attention_layers.attention_modules(model)
    for layer, module in enumerate(modules):
        stop, zero = band_masks(inv_freq[layer], setting)
        if layouts is not None:  # else a Capture that ran on this model left each layer's (as the backend sees it)
            module.posgen_layout = None if layouts[layer].backend.identity else layouts[layer].backend
        if stop.any() or zero.any():
            table = torch.as_tensor(inv_freq[layer], dtype=torch.float32)
            module.posgen_bands = (table, torch.as_tensor(stop), torch.as_tensor(zero))
    try:
        yield model
    finally:
        for module in modules:
            module.posgen_bands = None


def _pass(model, ids: torch.Tensor, setting: BandSetting, inv_freq: np.ndarray, layouts):
    """(loss (N,): mean next-token NLL of each window, probs: per layer (N, H, T, T)) of one forward pass under
    ``setting``."""
    modules = attention_layers.attention_modules(model)
    for module in modules:
        module.posgen_probs = []
    try:
        with intervening(model, setting, inv_freq, layouts), torch.inference_mode():
            logits = model(input_ids=ids, use_cache=False).logits  # (N, T, vocab)
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none"
        )
        return nll.view(ids.shape[0], -1).double().mean(-1).numpy(), [m.posgen_probs[0] for m in modules]
    finally:
        for module in modules:
            module.posgen_probs = None


def _head_changes(ref: torch.Tensor, mod: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(KL, previous-token change, diagonal change), each (N, H), of one layer's attention rows ``mod`` against
    ``ref`` (N, H, T, T): KL(ref || mod) of each query row, and the changes of the weight on key i - 1 and key i,
    means over the rows that have a previous token (i >= 1)."""
    ref, mod = ref.double()[:, :, 1:], mod.double()[:, :, 1:]  # (N, H, T-1, T): rows 1..T-1
    logs = torch.where(ref > 0, torch.log(ref) - torch.log(mod.clamp_min(1e-300)), torch.zeros_like(ref))
    kl = (ref * logs).sum(-1).mean(-1)  # (N, H)
    rows = torch.arange(ref.shape[2])
    prev = (mod - ref)[:, :, rows, rows].mean(-1)  # (N, H): key i - 1 of query row i (rows shifted by one)
    diag = (mod - ref)[:, :, rows, rows + 1].mean(-1)  # (N, H): key i of query row i
    return kl.numpy(), prev.numpy(), diag.numpy()


def band_effects(model, token_ids: np.ndarray, settings, inv_freq: np.ndarray, layouts=None) -> xr.Dataset:
    """Every setting of ``settings`` (the first must be ``none``) on the windows ``token_ids`` (N, T): the next-token
    loss (nats per token, mean over each window's targets) and its change from the unmodified model's (paired);
    per attention layer and head the KL divergence of its attention rows from the unmodified model's, and the
    changes of its attention to the previous token and to the diagonal (means over query rows 1..T-1)."""
    settings = list(settings)
    if settings[0].kind != "none":
        raise ValueError("band_effects: the first setting must be the unmodified model ('none')")
    ids = torch.as_tensor(np.asarray(token_ids), dtype=torch.long, device=model.device)
    base_loss, base_probs = _pass(model, ids, settings[0], inv_freq, layouts)
    loss, kl, prev, diag = [], [], [], []
    for setting in settings:
        this_loss, probs = (
            (base_loss, base_probs) if setting is settings[0] else _pass(model, ids, setting, inv_freq, layouts)
        )
        changes = [_head_changes(ref.cpu(), mod.cpu()) for ref, mod in zip(base_probs, probs, strict=True)]
        loss.append(this_loss)
        for out, index in ((kl, 0), (prev, 1), (diag, 2)):
            out.append(np.stack([c[index] for c in changes], axis=1))  # (N, layer, H)
    dims = ("setting", "sample", "layer", "head")
    return xr.Dataset(
        {
            "loss": (("setting", "sample"), np.stack(loss)),
            "loss_change": (("setting", "sample"), np.stack(loss) - base_loss),
            "kl": (dims, np.stack(kl)),
            "prev_change": (dims, np.stack(prev)),
            "diag_change": (dims, np.stack(diag)),
        },
        coords={
            "setting": [s.label for s in settings],
            "kind": ("setting", [s.kind for s in settings]),
            "share": ("setting", [s.share for s in settings]),
            "quarter": ("setting", [s.quarter for s in settings]),
        },
    )
