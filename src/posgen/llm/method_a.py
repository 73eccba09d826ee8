"""Method A of docs/method.md section 3A, the one home of its term formula: f and g as full matrices, at sampled
pairs, and their change between two forward passes.

``kbar`` here is the sink-free mean key (over tokens 1..T-1; "without" in docs/data-model.md), the reading the
experiments and the figure examples use:

    f_ij = s (R_{p_i} q_i).(R_{p_j} kbar)        with the position ids p of the pass
    g_ij = s (R_D q_i).(k_j - kbar)              D: the dummy distance

Under a distance cap C (LM-Infinite), f sees min(p_i - p_j, C). (posgen.decomposition evaluates the same terms
in both sink readings from sums over all pairs, without forming them.)

f/g change
----------
For each layer the Pearson r between the perturbed and the unperturbed term is taken per head over the
matched pairs -- perturbed entry (i', j') is compared with original entry (order[i'], order[j']), using the
pairs that are causal in both, key j' >= 1 -- and then averaged over heads.
"""

from __future__ import annotations

import numpy as np
import torch

from posgen import rope
from posgen.layer_types import used_dummy_distance
from posgen.rope_table import RopeTable
from posgen.stats import pearson


def sink_free_mean_key(k: torch.Tensor) -> torch.Tensor:
    """kbar (..., 1, d): the mean of keys ``k`` (..., T, d) over tokens 1..T-1."""
    return k[..., 1:, :].mean(dim=-2, keepdim=True)


def turned(x: torch.Tensor, distance: int, inv_freq: torch.Tensor, attention_scaling: float = 1.0) -> torch.Tensor:
    """A^2 R_{-a} x for a = ``distance``, so that (A R_a q).(A x) = q.turned(x, a) with A = attention_scaling:
    a fixed rotation goes onto the (fewer, KV-head) key side."""
    return rope.rotate(x, torch.tensor(-distance), inv_freq, attention_scaling) * attention_scaling


def method_a_terms(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    scaling: float,
    attention_scaling: float = 1.0,
    dummy_distance: int = 1000,
    distance_cap: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Method A's f and g, each (..., H, T, T), with the sink-free kbar.

    ``q`` (..., H, T, d) and ``k`` (..., H_kv, T, d) are pre-RoPE; query head h reads KV head
    h // (H / H_kv) as in transformers' ``repeat_kv``. ``positions`` (T,) are the position ids of the pass.
    With ``distance_cap`` C the positional term sees min(p_i - p_j, C).
    """
    q, k = q.float(), k.float()
    *lead, n_heads, n_tokens, dim = q.shape
    n_kv = k.shape[-3]
    q_grouped = q.reshape(*lead, n_kv, n_heads // n_kv, n_tokens, dim)  # GQA without expanding the keys
    kbar = sink_free_mean_key(k)  # (..., H_kv, 1, d)

    def scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """s a_i.b_j for grouped queries a (..., H_kv, rep, T, d) and keys b (..., H_kv, T', d): (..., H, T, T')."""
        return (a @ (b * scaling).unsqueeze(-3).transpose(-1, -2)).reshape(*lead, n_heads, n_tokens, b.shape[-2])

    # f_ij = s (R_{p_i} q_i).(R_{p_j} kbar); rotate() applies attention_scaling to each side
    q_rot = rope.rotate(q_grouped, positions, inv_freq, attention_scaling)  # (..., H_kv, rep, T, d)
    kbar_rot = rope.rotate(kbar.expand_as(k), positions, inv_freq, attention_scaling)  # (..., H_kv, T, d)
    f = scores(q_rot, kbar_rot)  # (..., H, T, T)
    if distance_cap is not None:
        far = (positions[:, None] - positions[None, :]) > distance_cap  # (T, T)
        f_far = scores(q_grouped, turned(kbar, distance_cap, inv_freq, attention_scaling))  # (..., H, T, 1)
        f = torch.where(far, f_far, f)
    g = scores(q_grouped, turned(k - kbar, dummy_distance, inv_freq, attention_scaling))  # (..., H, T, T)
    return f, g


def method_a_pairs(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    scaling: float,
    attention_scaling: float,
    dummy_distance: int,
    ii: torch.Tensor,
    jj: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The true logit W and Method A's f and g at the entries (ii, jj) only, each (head, pair).

    ``q`` and ``k`` (head, T, d) are pre-RoPE, keys already expanded to the query heads. The terms of
    :func:`method_a_terms` without forming (T, T) matrices: a few thousand sampled entries per head cost
    O(pairs * d) instead of O(T^2 * d).
    """
    q, k = q.float(), k.float()
    kbar = sink_free_mean_key(k)  # (H, 1, d)
    q_rot = rope.rotate(q, positions, inv_freq, attention_scaling)[:, ii]  # (H, P, d)
    k_rot = rope.rotate(k, positions, inv_freq, attention_scaling)[:, jj]  # (H, P, d)
    kbar_rot = rope.rotate(kbar.expand_as(k), positions, inv_freq, attention_scaling)[:, jj]  # (H, P, d)
    delta_turned = turned(k - kbar, dummy_distance, inv_freq, attention_scaling)[:, jj]  # (H, P, d)
    w = (q_rot * k_rot).sum(-1) * scaling  # (H, P)
    f = (q_rot * kbar_rot).sum(-1) * scaling  # (H, P)
    g = (q[:, ii] * delta_turned).sum(-1) * scaling  # (H, P)
    return w, f, g


def matched_pairs(order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat (i' T + j') indices of the perturbed pairs and of their original pairs (order[i'], order[j']).

    Kept: pairs causal in both sequences, key j' >= 1 (position 0 is never moved, so also original j >= 1).
    """
    n = len(order)
    mask = rope.causal_mask(n) & rope.causal_mask(n)[order][:, order]
    mask[:, 0] = False
    i, j = mask.nonzero(as_tuple=True)
    return i * n + j, order[i] * n + order[j]


class Terms:
    """Method A f/g of one pass for one sample and all layers at once, each (layer, H, T, T)."""

    def __init__(self, p, table: RopeTable, dummy_distance: int, distance_cap: int | None = None, keep: bool = False):
        """``p``: a :class:`posgen.llm.capture.Pass`; ``table``: ``Capture.rope()``; ``keep``: cache each sample.

        ``dummy_distance`` is D of global layers; a sliding-window layer uses ``min(D, window - 1)``.
        """
        self.positions = p.positions  # (N, T)
        self.dummy_distance, self.distance_cap, self.keep = dummy_distance, distance_cap, keep
        self.q = torch.stack(p.q)  # (layer, N, H, T, d)
        self.k = torch.stack(p.k)  # (layer, N, H_kv, T, d)
        n_heads, n_kv = self.q.shape[2], self.k.shape[2]
        if not np.array_equal(table.kv_group, np.arange(n_heads) // (n_heads // n_kv)):
            raise NotImplementedError("query heads must read KV heads in contiguous groups (as repeat_kv does)")
        # Layers sharing one RoPE table, scale and dummy distance are handled in one batch (Gemma 3 has two
        # tables; its sliding-window layers are scored at a D inside their window, posgen.layer_types).
        n_tokens = self.q.shape[-2]
        self.groups = {}
        self.dummy_distance_used = np.empty(len(p.q), dtype=np.int64)  # (layer,)
        for layer in range(len(p.q)):
            key = (
                table.inv_freq[layer].tobytes(),
                float(table.scaling[layer]),
                float(table.attention_scaling[layer]),
                used_dummy_distance(dummy_distance, int(table.sliding_window[layer]), n_tokens),
            )
            self.groups.setdefault(key, []).append(layer)
            self.dummy_distance_used[layer] = key[3]
        self.inv_freq = {key: torch.as_tensor(table.inv_freq[layers[0]]) for key, layers in self.groups.items()}
        self._cache = {}

    def __call__(self, sample: int) -> tuple[torch.Tensor, torch.Tensor]:
        if sample in self._cache:
            return self._cache[sample]
        terms = {
            key: method_a_terms(
                self.q[layers, sample],
                self.k[layers, sample],
                self.positions[sample],
                self.inv_freq[key],
                key[1],
                key[2],
                key[3],
                self.distance_cap,
            )
            for key, layers in self.groups.items()
        }  # {key: (f, g)} of each group's layers
        if len(terms) == 1:  # every layer alike (the common case): no copy
            ((f, g),) = terms.values()
        else:
            fl, gl = next(iter(terms.values()))
            f = fl.new_empty((len(self.q),) + fl.shape[1:])
            g = gl.new_empty((len(self.q),) + gl.shape[1:])
            for key, layers in self.groups.items():
                f[layers], g[layers] = terms[key]
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
