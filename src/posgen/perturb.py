"""Position-generalisation experiments: perturbed token order / position ids, and RoPE distance capping.

Perturbations (all seeded; position 0 -- the first token, the attention sink -- never moves)
-------------------------------------------------------------------------------------------
A perturbation of a window of T tokens is a pair ``(order, position_ids)``: perturbed position t holds the
original token ``order[t]`` and is rotated by RoPE as position ``position_ids[t]``. The *rate* p is the
fraction of movable units that are perturbed; units are the tokens 1..T-1 (token and posid kinds) or the words
1..W-1 (word kinds; word 0 holds token 0).

* ``token-swap``    ``round(p * U / 2)`` non-overlapping adjacent unit pairs, drawn uniformly, are swapped
  (U = T - 1 movable tokens), so ``2 * round(p * U / 2)`` tokens move.
* ``token-permute`` ``k = round(p * U)`` units (at least 2 when k > 0) are drawn and deranged among their own
  slots (a permutation without fixed points, so exactly k units move).
* ``word-swap``, ``word-permute``: the same on words. A token starts a word when its text starts with a
  space marker (``Ġ``, ``▁``, a space) or a line/tab marker (``Ċ``, ``ĉ``, ``\\n``, ``\\t``); the swapped or
  deranged words are written back as whole blocks, so every token of a moved word changes position.
* ``posid-swap``    token order kept; the position ids of ``round(p * U / 2)`` adjacent pairs are swapped.
* ``posid-jitter``  token order kept; ``round(p * U)`` position ids get a seeded offset drawn uniformly from
  ``{-J..-1, 1..J}`` (J = ``jitter``), clipped at 0.

``moved`` is the fraction of positions 1..T-1 whose token or position id differs from the original;
``moved_units`` the fraction of units moved (what the rate sets). They differ for word kinds: deranging words
of unequal length also shifts every word between them. A draw that changes nothing (rate 0) is the
unperturbed pass itself (no second forward pass; its f/g correlations are 1 by definition).
The random stream of (kind, rate, sample) is ``numpy.random.default_rng([seed, kind_index, round(rate * 1e6),
sample])`` with ``kind_index`` the index in ``KINDS``; the drawn ``order`` and ``position_ids`` are stored too.

Perplexity (same target tokens)
-------------------------------
``nll`` of a sample is the mean over the T - 1 targets of ``-log p(y_t | y_<t)`` for t = 1..T-1, where y is
the (perturbed) sequence fed to the model with its position ids. Because position 0 never moves, the targets
are exactly the original tokens 1..T-1 in every perturbation: each original token is scored once, given
the perturbed context that precedes it. ``ppl_ratio = exp(nll - nll_unperturbed)``.
A second reading isolates the effect of the perturbed *context*: ``ppl_ratio_kept`` compares perturbed and
unperturbed NLL on the targets K whose token and position id did not change (moved tokens are themselves
hard to predict, which dominates ``ppl_ratio`` for token kinds): ``exp(mean_K nll - mean_K nll_unperturbed)``.

f/g change
----------
Method A of science.md section 3 on the pre-RoPE q/k captured in each forward pass, in the sink-free reading
("without" in docs/data-model.md): ``kbar`` is the mean key over tokens 1..T-1 and the key column j = 0 is
not scored. ``f_ij = s (R_{p_i} q_i).(R_{p_j} kbar)`` with the position ids p of that pass (under a cap,
distances beyond C are seen as C), ``g_ij = s (R_D q_i).(k_j - kbar)``. For each layer the Pearson r between
the perturbed and the unperturbed term is taken per head over the matched pairs -- perturbed entry (i', j')
is compared with original entry (order[i'], order[j']), using the pairs that are causal in both -- and then
averaged over heads.

Distance capping (LM-Infinite)
------------------------------
``logit_ij = s (R_{min(p_i - p_j, C)} q_i).k_j``: beyond distance C the query is rotated as if at distance C.
It runs inside the model as the attention backend ``CAPPED_BACKEND``, registered with ``AttentionInterface``
and, under the same name, with ``AttentionMaskInterface`` (the causal mask vanishes otherwise). Without a
cap, or when no distance exceeds C, it computes exactly what the model's eager attention computes.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from tqdm.auto import tqdm
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from posgen import capture, rope

KINDS = ("token-swap", "token-permute", "word-swap", "word-permute", "posid-swap", "posid-jitter")
WORD_MARKERS = ("Ġ", "▁", " ", "Ċ", "ĉ", "\n", "\t")
CAPPED_BACKEND = "posgen_capped"
JITTER = 4  # largest |offset| of posid-jitter


# --------------------------------------------------------------------------------------------------------
# Perturbations


@dataclass(frozen=True)
class Perturbation:
    order: np.ndarray  # (T,) perturbed position t holds original token order[t]
    position_ids: np.ndarray  # (T,) RoPE position of perturbed position t
    moved_units: float = 0.0  # fraction of the movable units (tokens, or words for word kinds) moved

    @property
    def moved(self) -> float:
        """Fraction of positions 1..T-1 whose token or position id changed."""
        t = np.arange(len(self.order))
        changed = (self.order != t) | (self.position_ids != t)
        return float(changed[1:].mean()) if len(t) > 1 else 0.0

    @property
    def is_identity(self) -> bool:
        t = np.arange(len(self.order))
        return bool((self.order == t).all() and (self.position_ids == t).all())


def _round(x: float) -> int:
    """Round half up (Python's round() rounds half to even)."""
    return int(np.floor(x + 0.5))


def word_starts(tokens: list[str]) -> np.ndarray:
    """(T,) bool: token t begins a word (t = 0 always does)."""
    starts = np.array([t.startswith(WORD_MARKERS) for t in tokens], dtype=bool)
    if len(starts):
        starts[0] = True
    return starts


def _adjacent_pairs(n_units: int, n_pairs: int, rng: np.random.Generator) -> np.ndarray:
    """First indices of ``n_pairs`` non-overlapping adjacent pairs among ``n_units``, uniform over all such sets."""
    n_pairs = min(n_pairs, n_units // 2)
    if n_pairs == 0:
        return np.zeros(0, dtype=np.int64)
    # Stars and bars: sets of n disjoint pairs in m units <-> n-subsets of m - n slots.
    slots = np.sort(rng.choice(n_units - n_pairs, size=n_pairs, replace=False))
    return slots + np.arange(n_pairs)


def _derangement(k: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly drawn permutation of range(k) without fixed points (k >= 2); ~e tries on average."""
    while True:
        perm = rng.permutation(k)
        if (perm != np.arange(k)).all():
            return perm


def _unit_order(kind: str, n_units: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """New order of the movable units 0..n_units-1."""
    perm = np.arange(n_units)
    if kind.endswith("swap"):
        for s in _adjacent_pairs(n_units, _round(rate * n_units / 2), rng):
            perm[s], perm[s + 1] = perm[s + 1], perm[s]
    else:
        k = min(_round(rate * n_units), n_units)
        if k == 1:  # one unit cannot move on its own
            k = 2 if n_units >= 2 else 0
        if k:
            chosen = np.sort(rng.choice(n_units, size=k, replace=False))
            perm[chosen] = chosen[_derangement(k, rng)]
    return perm


def perturb(
    kind: str,
    rate: float,
    n_tokens: int,
    rng: np.random.Generator,
    starts: np.ndarray | None = None,
    jitter: int = JITTER,
) -> Perturbation:
    """Draw one perturbation of a window of ``n_tokens`` (``starts``: word starts, needed by word kinds)."""
    if kind not in KINDS:
        raise ValueError(f"perturbation kind {kind!r}: expected one of {', '.join(KINDS)}")
    if not 0 <= rate <= 1:
        raise ValueError(f"perturbation rate {rate}: expected a fraction in [0, 1]")
    identity = np.arange(n_tokens)
    order, position_ids = identity.copy(), identity.copy()
    n_movable = n_tokens - 1
    if kind in ("token-swap", "token-permute"):
        units = _unit_order(kind, n_movable, rate, rng)
        order[1:] = 1 + units
    elif kind in ("word-swap", "word-permute"):
        if starts is None or len(starts) != n_tokens:
            raise ValueError(f"{kind}: needs the word starts of all {n_tokens} tokens")
        bounds = np.append(np.flatnonzero(starts), n_tokens)
        words = [identity[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        units = _unit_order(kind, len(words) - 1, rate, rng)
        order = np.concatenate([words[0]] + [words[1 + u] for u in units])
    elif kind == "posid-swap":
        units = _unit_order("swap", n_movable, rate, rng)
        position_ids[1:] = 1 + units
    else:  # posid-jitter
        k = min(_round(rate * n_movable), n_movable)
        chosen = 1 + np.sort(rng.choice(n_movable, size=k, replace=False))
        offset = rng.integers(1, jitter + 1, size=k) * rng.choice(np.array([-1, 1]), size=k)
        position_ids[chosen] = np.maximum(chosen + offset, 0)
        units = np.arange(n_movable)
        units[chosen - 1] = -1  # marks the jittered tokens as moved
    moved_units = float((units != np.arange(len(units))).mean()) if len(units) else 0.0
    return Perturbation(order=order, position_ids=position_ids, moved_units=moved_units)


def rng_for(seed: int, kind: str, rate: float, sample: int) -> np.random.Generator:
    """The random stream of one (kind, rate, sample); independent of the model and variant."""
    return np.random.default_rng([seed, KINDS.index(kind), _round(rate * 1e6), sample])


# --------------------------------------------------------------------------------------------------------
# Method A terms and their matched correlation


def method_a_terms(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    scaling: float,
    attention_scaling: float = 1.0,
    dummy_distance: int = 1000,
    cap: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Method A's f and g, each (..., H, T, T), with the sink-free kbar (mean over keys 1..T-1).

    ``q`` (..., H, T, d) and ``k`` (..., H_kv, T, d) are pre-RoPE; query head h reads KV head
    h // (H / H_kv) as in transformers' ``repeat_kv``. ``positions`` (T,) are the position ids of the pass.
    With ``cap`` the positional term sees min(p_i - p_j, C).
    """
    q, k = q.float(), k.float()
    *lead, n_heads, n_tokens, dim = q.shape
    n_kv = k.shape[-3]
    q_grouped = q.reshape(*lead, n_kv, n_heads // n_kv, n_tokens, dim)  # GQA without expanding the keys
    kbar = k[..., 1:, :].mean(dim=-2, keepdim=True)  # (..., H_kv, 1, d)

    def scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """s a_i.b_j for grouped queries a (..., H_kv, rep, T, d) and keys b (..., H_kv, T, d)."""
        return (a @ (b * scaling).unsqueeze(-3).transpose(-1, -2)).reshape(*lead, n_heads, n_tokens, b.shape[-2])

    # f_ij = s (R_{p_i} q_i).(R_{p_j} kbar); rotate() applies attention_scaling to each side
    q_rot = rope.rotate(q_grouped, positions, inv_freq, attention_scaling)
    f = scores(q_rot, rope.rotate(kbar.expand_as(k), positions, inv_freq, attention_scaling))

    def turned(x: torch.Tensor, angle: int) -> torch.Tensor:
        """A^2 R_{-a} x, so that (A R_a q).(A x) = q.turned(x, a) with A = attention_scaling: fixed rotations
        go onto the (fewer, KV-head) key side."""
        return rope.rotate(x, torch.tensor(-angle), inv_freq, attention_scaling) * attention_scaling

    if cap is not None:
        far = (positions[:, None] - positions[None, :]) > cap
        f_far = scores(q_grouped, turned(kbar, cap))  # (..., H, T, 1): constant along each row
        f = torch.where(far, f_far, f)
    g = scores(q_grouped, turned(k - kbar, dummy_distance))
    return f, g


def capped_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    scaling: float,
    attention_scaling: float = 1.0,
    cap: int | None = None,
) -> torch.Tensor:
    """Reference for the capped backend: ``s (R_{min(p_i - p_j, C)} q_i).k_j`` from pre-RoPE q/k, (..., T, T)."""
    q_rot = rope.rotate(q, positions, inv_freq, attention_scaling)
    k_rot = rope.rotate(k, positions, inv_freq, attention_scaling)
    w = (q_rot @ k_rot.transpose(-1, -2)) * scaling
    if cap is None:
        return w
    far = (positions[:, None] - positions[None, :]) > cap
    q_cap = rope.rotate(q, torch.tensor(cap), inv_freq, attention_scaling)
    k_zero = rope.rotate(k, torch.tensor(0), inv_freq, attention_scaling)
    return torch.where(far, (q_cap @ k_zero.transpose(-1, -2)) * scaling, w)


def pearson(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pearson r along the last dim, float32 after centring. Centres ``x`` and ``y`` in place."""
    x = x.sub_(x.mean(-1, keepdim=True))
    y = y.sub_(y.mean(-1, keepdim=True))
    dot = lambda a, b: torch.einsum("...n,...n->...", a, b)  # noqa: E731 - no product temporaries
    return dot(x, y) / torch.sqrt(dot(x, x) * dot(y, y))


def matched_pairs(order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat (i' T + j') indices of the perturbed pairs and of their original pairs (order[i'], order[j']).

    Kept: pairs causal in both sequences, key j' >= 1 (position 0 is never moved, so also original j >= 1).
    """
    n = len(order)
    mask = rope.causal_mask(n) & rope.causal_mask(n)[order][:, order]
    mask[:, 0] = False
    i, j = mask.nonzero(as_tuple=True)
    return i * n + j, order[i] * n + order[j]


# --------------------------------------------------------------------------------------------------------
# Capped attention backend


def _rotate_rows(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, d) by per-row positions (B or 1, T) with unit amplitude."""
    rows = [rope.rotate(x[b], positions[b if positions.shape[0] > 1 else 0], inv_freq) for b in range(x.shape[0])]
    return torch.stack(rows)


def _capped_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The eager attention of transformers' Llama, with distances beyond ``module.posgen_cap`` seen as the cap."""
    scaling = module.head_dim**-0.5 if scaling is None else scaling
    capture.notify(module, query, key, scaling, kwargs)  # a running Capture records logits/scaling
    n_rep = query.shape[1] // key.shape[1]
    key_states = key if n_rep == 1 else key.repeat_interleave(n_rep, dim=1)
    value_states = value if n_rep == 1 else value.repeat_interleave(n_rep, dim=1)
    weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling

    cap = getattr(module, "posgen_cap", None)
    if cap is not None:
        n = query.shape[-2]
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(n, device=query.device)[None]
        far = (positions[:, :, None] - positions[:, None, :]) > cap  # (B or 1, T, T)
        if far.any():
            inv_freq = module.posgen_inv_freq.to(query.device)
            # query and key arrive rotated to their positions p; turning them by C - p and -p gives
            # (R_C q).(R_0 k), the LM-Infinite logit of a pair farther apart than C.
            q_far = _rotate_rows(query, cap - positions, inv_freq)
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


AttentionInterface.register(CAPPED_BACKEND, _capped_attention)
AttentionMaskInterface.register(CAPPED_BACKEND, eager_mask)
capture.CAPTURING_BACKENDS.add(CAPPED_BACKEND)


@contextlib.contextmanager
def distance_cap(model, cap: int, inv_freq: np.ndarray):
    """Run ``model`` (loaded with ``CAPPED_BACKEND``) with RoPE distances capped at ``cap``.

    ``inv_freq`` (layer, band) is the per-layer RoPE frequency table (``Capture.rope()["inv_freq"]``).
    Outside this context the backend does not cap.
    """
    if model.config._attn_implementation != CAPPED_BACKEND:
        raise RuntimeError(f"load the model with attn_implementation={CAPPED_BACKEND!r} to cap distances")
    modules = capture.attention_modules(model)
    for m in modules:
        m.posgen_cap = cap
        m.posgen_inv_freq = torch.as_tensor(inv_freq[m.layer_idx], dtype=torch.float32)
    try:
        yield model
    finally:
        for m in modules:
            m.posgen_cap = None


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


def forward_pass(model, cap: capture.Capture, token_ids: np.ndarray, position_ids: np.ndarray | None = None) -> Pass:
    """NLL per sample (mean over targets 1..T-1) and the captured q/k of one batched forward pass."""
    device = model.device
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=device)
    n, t = ids.shape
    pos = torch.arange(t).expand(n, t) if position_ids is None else torch.as_tensor(position_ids, dtype=torch.long)
    kwargs = {} if position_ids is None else {"position_ids": pos.to(device)}
    cap.reset(t)
    with torch.inference_mode():
        # An explicit all-ones mask stops transformers from reading non-monotonic position ids as packed
        # sequences (which would cut the causal mask into blocks).
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **kwargs).logits
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
    token_nll = nll.view(n, t - 1).double().cpu().numpy()
    return Pass(nll=token_nll.mean(-1), token_nll=token_nll, q=list(cap.q), k=list(cap.k), positions=pos.cpu())


class Terms:
    """Method A f/g of one pass for one sample and all layers at once, each (layer, H, T, T)."""

    def __init__(self, p: Pass, rope_info: dict, dummy_distance: int, cap: int | None = None, keep: bool = False):
        self.positions, self.D, self.cap, self.keep = p.positions, dummy_distance, cap, keep
        self.q = torch.stack(p.q)  # (layer, N, H, T, d)
        self.k = torch.stack(p.k)  # (layer, N, H_kv, T, d)
        n_heads, n_kv = self.q.shape[2], self.k.shape[2]
        if not np.array_equal(rope_info["kv_group"], np.arange(n_heads) // (n_heads // n_kv)):
            raise NotImplementedError("query heads must read KV heads in contiguous groups (as repeat_kv does)")
        # Layers sharing one RoPE table and scale are handled in one batch (Gemma 3 has two tables).
        self.groups = {}
        for layer in range(len(p.q)):
            key = (rope_info["inv_freq"][layer].tobytes(), float(rope_info["scaling"][layer]),
                   float(rope_info["attention_scaling"][layer]))
            self.groups.setdefault(key, []).append(layer)
        self.inv_freq = {key: torch.as_tensor(rope_info["inv_freq"][layers[0]]) for key, layers in self.groups.items()}
        self._cache = {}

    def __call__(self, sample: int) -> tuple[torch.Tensor, torch.Tensor]:
        if sample in self._cache:
            return self._cache[sample]
        if len(self.groups) == 1:
            ((key, _),) = self.groups.items()
            f, g = method_a_terms(self.q[:, sample], self.k[:, sample], self.positions[sample],
                                  self.inv_freq[key], key[1], key[2], self.D, self.cap)
        else:
            f = g = None
            for key, layers in self.groups.items():
                fl, gl = method_a_terms(self.q[layers, sample], self.k[layers, sample], self.positions[sample],
                                        self.inv_freq[key], key[1], key[2], self.D, self.cap)
                if f is None:
                    f = fl.new_empty((len(self.q),) + fl.shape[1:])
                    g = gl.new_empty((len(self.q),) + gl.shape[1:])
                f[layers], g[layers] = fl, gl
        if self.keep:
            self._cache[sample] = (f, g)
        return f, g


def fg_change(ref: Terms, new: Terms, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sample, layer) head-mean Pearson r of new vs reference f and g over matched pairs."""
    f_corr, g_corr = [], []
    for s, order in enumerate(orders):
        new_idx, ref_idx = matched_pairs(torch.as_tensor(order))
        f1, g1 = new(s)
        f0, g0 = ref(s)
        pick = lambda x, idx: x.flatten(-2).index_select(-1, idx)  # noqa: E731 - a fresh copy of the pairs
        f_corr.append(pearson(pick(f1, new_idx), pick(f0, ref_idx)).mean(-1).numpy())
        g_corr.append(pearson(pick(g1, new_idx), pick(g0, ref_idx)).mean(-1).numpy())
    return np.stack(f_corr), np.stack(g_corr)


# --------------------------------------------------------------------------------------------------------
# Experiments


def _masked_mean(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row means of ``values`` over ``mask``; NaN for a row with nothing kept."""
    count = mask.sum(-1)
    total = np.where(mask, values, 0.0).sum(-1)
    return np.divide(total, count, out=np.full(len(count), np.nan), where=count > 0)


def _layer_coords(n_layers: int) -> dict:
    return {"layer": np.arange(n_layers)}


def run_perturbations(
    model,
    token_ids: np.ndarray,
    token_strings: list[list[str]],
    *,
    rates: list[float],
    seed: int,
    dummy_distance: int,
    jitter: int = JITTER,
    kinds: tuple[str, ...] = KINDS,
    progress: bool = True,
) -> xr.Dataset:
    """Every (kind, rate) perturbation of the windows ``token_ids`` (N, T), one batched forward pass each.

    The model must be loaded with a capturing backend (``posgen.capture.backend_for``). Returns the
    perturb.nc dataset (docs/data-model.md) without provenance attrs.
    """
    token_ids = np.asarray(token_ids)
    n_samples, n_tokens = token_ids.shape
    if n_tokens < 3:
        raise ValueError(f"perturbation windows need at least 3 tokens, got {n_tokens}")
    starts = [word_starts(tokens) for tokens in token_strings]
    rates = [float(r) for r in rates]
    shape = (len(kinds), len(rates), n_samples)
    out = {
        "nll": np.empty(shape), "moved": np.empty(shape), "moved_units": np.empty(shape),
        "nll_kept": np.empty(shape), "nll_kept_ref": np.empty(shape),
        "order": np.empty(shape + (n_tokens,), dtype=np.int64),
        "position_ids": np.empty(shape + (n_tokens,), dtype=np.int64),
    }
    with capture.Capture(model) as cap:
        ref_pass = forward_pass(model, cap, token_ids)
        rope_info = cap.rope()
        n_layers = cap.n_layers
        f_corr = np.empty(shape + (n_layers,))
        g_corr = np.empty(shape + (n_layers,))
        ref = Terms(ref_pass, rope_info, dummy_distance, keep=True)
        jobs = [(ki, ri) for ki in range(len(kinds)) for ri in range(len(rates))]
        for ki, ri in tqdm(jobs, desc="perturb", unit="pass", disable=not progress):
            kind, rate = kinds[ki], rates[ri]
            draws = [
                perturb(kind, rate, n_tokens, rng_for(seed, kind, rate, s), starts[s], jitter)
                for s in range(n_samples)
            ]
            orders = np.stack([d.order for d in draws])
            positions = np.stack([d.position_ids for d in draws])
            out["order"][ki, ri], out["position_ids"][ki, ri] = orders, positions
            out["moved"][ki, ri] = [d.moved for d in draws]
            out["moved_units"][ki, ri] = [d.moved_units for d in draws]
            if all(d.is_identity for d in draws):  # rate 0: the unperturbed pass itself, r = 1
                out["nll"][ki, ri] = out["nll_kept"][ki, ri] = out["nll_kept_ref"][ki, ri] = ref_pass.nll
                f_corr[ki, ri] = g_corr[ki, ri] = 1.0
                continue
            perturbed_ids = np.take_along_axis(token_ids, orders, axis=1)
            new_pass = forward_pass(model, cap, perturbed_ids, positions)
            out["nll"][ki, ri] = new_pass.nll
            # targets whose token and position id are unchanged: only their context was perturbed
            kept = ((orders == np.arange(n_tokens)) & (positions == np.arange(n_tokens)))[:, 1:]
            out["nll_kept"][ki, ri] = _masked_mean(new_pass.token_nll, kept)
            out["nll_kept_ref"][ki, ri] = _masked_mean(ref_pass.token_nll, kept)
            f_corr[ki, ri], g_corr[ki, ri] = fg_change(ref, Terms(new_pass, rope_info, dummy_distance), orders)

    dims = ("kind", "rate", "sample")
    ds = xr.Dataset(
        {
            "nll": (dims, out["nll"]),
            "ppl_ratio": (dims, np.exp(out["nll"] - ref_pass.nll[None, None, :])),
            "nll_unperturbed": (("sample",), ref_pass.nll),
            "ppl_ratio_kept": (dims, np.exp(out["nll_kept"] - out["nll_kept_ref"])),
            "nll_kept": (dims, out["nll_kept"]),
            "moved": (dims, out["moved"]),
            "moved_units": (dims, out["moved_units"]),
            "f_corr": (dims + ("layer",), f_corr),
            "g_corr": (dims + ("layer",), g_corr),
            "order": (dims + ("token",), out["order"]),
            "position_ids": (dims + ("token",), out["position_ids"]),
        },
        coords={
            "kind": list(kinds), "rate": rates, "sample": np.arange(n_samples),
            "token": np.arange(n_tokens), **_layer_coords(n_layers),
        },
        attrs={"perturb_seed": seed, "jitter": jitter, "default_D": dummy_distance, "sink": "without",
               "seed_rule": "numpy default_rng([seed, kind_index, round(rate*1e6), sample])",
               "kinds": list(kinds)},
    )
    return ds


def run_caps(
    model,
    token_ids: np.ndarray,
    *,
    caps: list[int],
    dummy_distance: int,
    progress: bool = True,
) -> xr.Dataset:
    """Perplexity and f/g change of the windows ``token_ids`` (N, T) with RoPE distances capped at each C.

    The model must be loaded with ``attn_implementation=CAPPED_BACKEND``. Returns cap.nc without provenance.
    """
    token_ids = np.asarray(token_ids)
    n_samples, n_tokens = token_ids.shape
    identity = np.tile(np.arange(n_tokens), (n_samples, 1))
    with capture.Capture(model) as cap:
        # One uncapped pass first: it also yields the per-layer RoPE table the capped backend needs.
        ref_pass = forward_pass(model, cap, token_ids)
        rope_info = cap.rope()
        ref = Terms(ref_pass, rope_info, dummy_distance, keep=True)
        n_layers = cap.n_layers
        nll = np.empty((len(caps), n_samples))
        f_corr = np.empty((len(caps), n_samples, n_layers))
        g_corr = np.empty((len(caps), n_samples, n_layers))
        for ci, c in enumerate(tqdm(caps, desc="cap", unit="pass", disable=not progress)):
            with distance_cap(model, int(c), rope_info["inv_freq"]):
                new_pass = forward_pass(model, cap, token_ids)
            nll[ci] = new_pass.nll
            f_corr[ci], g_corr[ci] = fg_change(ref, Terms(new_pass, rope_info, dummy_distance, int(c)), identity)

    return xr.Dataset(
        {
            "nll": (("cap", "sample"), nll),
            "ppl_ratio": (("cap", "sample"), np.exp(nll - ref_pass.nll[None, :])),
            "nll_uncapped": (("sample",), ref_pass.nll),
            "f_corr": (("cap", "sample", "layer"), f_corr),
            "g_corr": (("cap", "sample", "layer"), g_corr),
        },
        coords={"cap": np.asarray(caps, dtype=np.int64), "sample": np.arange(n_samples), **_layer_coords(n_layers)},
        attrs={"default_D": dummy_distance, "sink": "without", "n_tokens": n_tokens},
    )


# --------------------------------------------------------------------------------------------------------
# Jobs (one model variant each; called by workflow_scripts/perturb.py and cap.py)


def read_windows(path: str | Path, n_samples: int, seq_len: int) -> np.ndarray:
    """The first ``n_samples`` windows of ``windows.h5``, cut to their first ``seq_len`` tokens."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such windows file")
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        if "token_id" not in ds:
            raise ValueError(f"{path}: no variable token_id")
        have_samples, have_tokens = ds.sizes["sample"], ds.sizes["token"]
        if n_samples > have_samples:
            raise ValueError(f"perturb.n_samples: {n_samples} exceeds the {have_samples} windows of {path}")
        if seq_len > have_tokens:
            raise ValueError(f"perturb.seq_len: {seq_len} exceeds the {have_tokens} tokens per window of {path}")
        return ds["token_id"].values[:n_samples, :seq_len].astype(np.int64)


def _load(model_dir, variant, dtype, device, attn_implementation=None):
    """Model, tokenizer and manifest; the capturing backend the config needs unless one is named."""
    from posgen.models import load, read_manifest

    if attn_implementation is None:
        model, tokenizer = capture.load_model(model_dir, variant, dtype=dtype, device=device)
    else:
        model, tokenizer = load(model_dir, variant, dtype=dtype, device=device,
                                attn_implementation=attn_implementation)
    return model, tokenizer, read_manifest(model_dir)


def _provenance(ds, manifest, model_name, variant, dtype, model, seconds, config_hash) -> dict:
    from posgen.config import init_seed
    from posgen.store import provenance

    return provenance(
        **ds.attrs,
        model=model_name,
        model_source=manifest["source"],
        model_revision=manifest["revision"],
        weights_sha256=manifest["files"],
        architecture=manifest.get("architecture", ""),
        variant=variant,
        init_seed=init_seed(variant),
        dtype=dtype,
        device=str(model.device),
        attn_implementation=model.config._attn_implementation,
        runtime_s=round(seconds, 2),
        config_hash=config_hash,
    )


def _run_job(experiment, model_dir, windows_path, out_path, *, model_name: str, variant: str, n_samples: int,
             seq_len: int, dtype: str, device: str, config_hash: str, attn_implementation=None) -> xr.Dataset:
    """Read the windows, load the model, run ``experiment(model, tokenizer, token_ids)``, write it with provenance."""
    from posgen.store import write_netcdf

    start = time.perf_counter()
    token_ids = read_windows(windows_path, n_samples, seq_len)
    model, tokenizer, manifest = _load(model_dir, variant, dtype, device, attn_implementation)
    ds = experiment(model, tokenizer, token_ids)
    ds.attrs = _provenance(ds, manifest, model_name, variant, dtype, model, time.perf_counter() - start, config_hash)
    write_netcdf(ds, out_path)
    return ds


def perturb_job(
    model_dir: str | Path,
    windows_path: str | Path,
    out_path: str | Path,
    *,
    model_name: str,
    variant: str,
    n_samples: int,
    seq_len: int,
    rates: list[float],
    seed: int,
    dummy_distance: int,
    jitter: int = JITTER,
    dtype: str = "float32",
    device: str = "cpu",
    config_hash: str = "",
) -> xr.Dataset:
    """Write ``perturb.nc`` of one model variant (docs/data-model.md)."""

    def experiment(model, tokenizer, token_ids):
        strings = [tokenizer.convert_ids_to_tokens(row.tolist()) for row in token_ids]
        ds = run_perturbations(model, token_ids, strings, rates=rates, seed=seed, dummy_distance=dummy_distance,
                               jitter=jitter)
        ds["token_id"] = (("sample", "token"), token_ids)
        return ds

    return _run_job(experiment, model_dir, windows_path, out_path, model_name=model_name, variant=variant,
                    n_samples=n_samples, seq_len=seq_len, dtype=dtype, device=device, config_hash=config_hash)


def cap_job(
    model_dir: str | Path,
    windows_path: str | Path,
    out_path: str | Path,
    *,
    model_name: str,
    variant: str,
    n_samples: int,
    seq_len: int,
    caps: list[int],
    dummy_distance: int,
    dtype: str = "float32",
    device: str = "cpu",
    config_hash: str = "",
) -> xr.Dataset:
    """Write ``cap.nc`` of one model variant (docs/data-model.md)."""
    return _run_job(lambda model, _, token_ids: run_caps(model, token_ids, caps=caps, dummy_distance=dummy_distance),
                    model_dir, windows_path, out_path, model_name=model_name, variant=variant, n_samples=n_samples,
                    seq_len=seq_len, dtype=dtype, device=device, config_hash=config_hash,
                    attn_implementation=CAPPED_BACKEND)
