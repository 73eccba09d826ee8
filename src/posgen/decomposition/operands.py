"""One (sample, layer) made ready for the decomposition: pre-RoPE q/k rotated once, the mean keys, the key sets
and the rotations R_D (docs/method.md sections 1 and 3A), with the query heads grouped by the KV head they read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from posgen.decomposition.drift import drift_fit, shared_drift
from posgen.decomposition.mask import SINKS, MaskInfo
from posgen.device import constant
from posgen.layer_types import effective_window, used_dummy_distance
from posgen.rope import rotate
from posgen.rope_table import LayerRope

# The x-like key sets of the masked moments, in order (W first), before the g set R_0 (k_j - kbar):
# x = R_j k_j, f = R_j kbar, phi = R_j (kbar' - kbar), Method A-drift's R_j kbar(j) and Method A-shared's.
KEY_SETS = ("x", "f", "phi", "f_drift", "f_shared")
DRIFT_SET = KEY_SETS.index("f_drift")  # the first set without g_D products
SHARED_SET = KEY_SETS.index("f_shared")


class KVGroups:
    """Query heads grouped by the KV head they read (GQA); every KV head serves the same number of query heads."""

    def __init__(self, kv_group: np.ndarray, device):
        used, per_kv = np.unique(kv_group, return_counts=True)
        if (per_kv != per_kv[0]).any():
            raise ValueError(f"kv_group {kv_group.tolist()}: every KV head must serve the same number of query heads")
        self.n_heads = len(kv_group)
        self.per_kv = int(per_kv[0])
        order = np.argsort(kv_group, kind="stable")
        self.order = constant(order.tolist(), torch.int64, device)  # query heads by KV head
        self.from_order = constant(np.argsort(order).tolist(), torch.int64, device)  # back to the original order
        self.used = constant(used.tolist(), torch.int64, device)  # (kv_head,) the KV heads some query head reads

    def by_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(..., head, token, e) -> (..., kv_head, h, token, e): the h query heads of each KV head together."""
        x = x[..., self.order, :, :]
        return x.reshape(*x.shape[:-3], len(self.used), self.per_kv, *x.shape[-2:])

    def to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(..., kv_head, h) -> (..., head), in the original head order."""
        return x.reshape(*x.shape[:-2], self.n_heads).index_select(-1, self.from_order)


@dataclass(frozen=True)
class UnitOperands:
    """One (sample, layer), rotated once (method.md sections 1 and 3A); shapes in the comments.

    H query heads, H_kv KV heads, T tokens, d dims, nD dummy distances (``distances``). ``kbar`` is
    the mean key, ``kbar_wo`` the mean key over tokens 1..T-1 (sink 'without'); ``g_drift`` the g keys of Method
    A-drift, against its fit ``kbar(j)``, ``g_shared`` those of Method A-shared, against ``kbar' + s(j)``
    (posgen.decomposition.drift); ``shared`` is s(j) (zero where no held-out trajectory was given).
    """

    q: torch.Tensor  # (H, T, d) pre-RoPE queries, float32
    k: torch.Tensor  # (H_kv, T, d) pre-RoPE keys, float32
    k64: torch.Tensor  # (H_kv, T, d) the keys in float64
    kv: torch.Tensor  # (H,) the KV head of each query head
    groups: KVGroups
    rope: LayerRope
    theta: torch.Tensor  # (L,) inv_freq on the device, float32
    window: int  # 0: every j <= i counts
    counts: dict  # sink -> number of counted entries
    kbar: torch.Tensor  # (H_kv, d) float64
    kbar_wo: torch.Tensor  # (H_kv, d) float64
    shift: torch.Tensor  # (H_kv, d) float64, R_0 (kbar - kbar'): the sink-free g's row-constant offset
    q_rot: torch.Tensor  # (H, T, d) s R_i q_i
    q0: torch.Tensor  # (H, T, d) s R_0 q_i
    k_rot: torch.Tensor  # (H_kv, T, d) R_j k_j
    keys: torch.Tensor  # (H_kv, T, 6 d) the key sets KEY_SETS, then the g set R_0 (k_j - kbar)
    g_drift: torch.Tensor  # (H_kv, T, d) float64, R_0 (k_j - kbar(j)): Method A-drift's g set
    g_shared: torch.Tensor  # (H_kv, T, d) float64, R_0 (k_j - kbar' - s(j)): Method A-shared's g set
    shared: torch.Tensor  # (H_kv, T, d) float64, s(j)
    has_shared: bool  # whether s(j) came from held-out windows (else A-shared is not computed: NaN)
    rotations: torch.Tensor  # (nD, d, d) R_D, without attention_scaling
    dummy_distance: int  # this layer's D of Method A's r, r_g and the bound (Decomposer.layer_distance)
    distances: list  # the nD dummy distances of ``rotations``: the sweep (inside the window) and ``dummy_distance``


def shared_function(heldout_k, k64: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Method A-shared's s(j) (H_kv, T, d) from ``heldout_k`` (H_kv, T, d), the held-out windows' mean key at every
    position (zeros without held-out windows): :func:`posgen.decomposition.drift.shared_drift`."""
    if heldout_k is None:
        return torch.zeros_like(k64)
    heldout = heldout_k if torch.is_tensor(heldout_k) else torch.from_numpy(np.asarray(heldout_k))
    if heldout.shape != k64.shape:
        raise ValueError(f"held-out mean keys {tuple(heldout.shape)} and k {tuple(k64.shape)}: shapes disagree")
    return shared_drift(heldout.to(k64.device), basis)


def unit_operands(
    q, k, kv_group, rope: LayerRope, dummy_distance: int, sweep, drift_basis: torch.Tensor, device, heldout_k=None
) -> UnitOperands:
    """Checks the shapes and rotates once: method.md section 1 (R_m, s), section 3A (kbar, R_D) and 3C (kbar(j)).

    ``dummy_distance`` is the D of global layers (a sliding-window layer takes its own,
    :func:`posgen.layer_types.used_dummy_distance`), ``sweep`` the dummy distances of the sweep, ``drift_basis``
    the basis of Method A-drift's fit (:func:`posgen.decomposition.drift.drift_basis`, T rows), ``heldout_k``
    (H_kv, T, d) the mean key at every position over held-out windows (None: no Method A-shared).
    """
    dev = device
    q = (q if torch.is_tensor(q) else torch.from_numpy(np.asarray(q))).to(dev, torch.float32)
    k = (k if torch.is_tensor(k) else torch.from_numpy(np.asarray(k))).to(dev, torch.float32)
    kv_np = np.asarray(kv_group, dtype=np.int64)
    H, T, d = q.shape
    if k.shape[1:] != (T, d) or d % 2 or kv_np.shape != (H,) or kv_np.max() >= k.shape[0] or kv_np.min() < 0:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, kv_group {kv_np.shape}: shapes disagree")
    window = effective_window(T, rope.sliding_window)
    dummy_distance = used_dummy_distance(dummy_distance, rope.sliding_window, T)  # this layer's D
    # every D the moments are contracted for; a sliding-window layer's sweep at min(D, window - 1), as its own D
    distances = sorted({used_dummy_distance(D, rope.sliding_window, T) for D in sweep} | {dummy_distance})
    s, amp = float(rope.scaling), float(rope.attention_scaling)
    theta = constant(np.asarray(rope.inv_freq, dtype=np.float32).tolist(), torch.float32, dev)  # (L,)
    pos = torch.arange(T, device=dev)

    k64 = k.double()
    kbar = k64.mean(1)  # (H_kv, d)
    kbar_wo = k64[:, 1:].mean(1)  # (H_kv, d), sink dropped

    k_fit = drift_fit(k64, drift_basis)  # (H_kv, T, d): kbar(j), fitted over tokens 1..T-1
    shared = shared_function(heldout_k, k64, drift_basis)  # (H_kv, T, d): s(j)
    k_shared = kbar_wo[:, None] + shared  # (H_kv, T, d): Method A-shared's kbar(j)
    # everything turned to its own position in one rotation: q, then k and the key sets' means (H_kv each)
    n_kv = k.shape[0]
    turned = torch.cat(
        [
            q,
            k,
            kbar.float()[:, None].expand(-1, T, -1),
            (kbar_wo - kbar).float()[:, None].expand(-1, T, -1),
            k_fit.float(),
            k_shared.float(),
        ]
    )  # (H + 5 H_kv, T, d)
    turned = rotate(turned, pos, theta, amp)
    q_rot, k_sets = turned.split([H, 5 * n_kv])  # (H, T, d), (5 H_kv, T, d)
    k_sets = k_sets.view(5, n_kv, T, d)  # (set, H_kv, T, d): R_j k_j, R_j kbar, R_j (kbar' - kbar), the two fits
    k_rot = k_sets[0]
    keys = torch.cat([*k_sets, (k64 - kbar[:, None]).float() * amp], -1)  # (H_kv, T, 6 d)
    eye = torch.eye(d, device=dev).expand(len(distances), d, d)  # (nD, d, d)
    # rotate() turns each row, so the rotated identity is R_D^T (every D at once: a position per D); transposed, R_D
    rotations = rotate(eye, constant(distances, torch.int64, dev)[:, None], theta).transpose(-1, -2)  # (nD, d, d)
    return UnitOperands(
        q=q,
        k=k,
        k64=k64,
        kv=constant(kv_np.tolist(), torch.int64, dev),
        groups=KVGroups(kv_np, dev),
        rope=rope,
        theta=theta,
        window=window,
        counts={sink: MaskInfo(T, window).count(sink) for sink in SINKS},
        kbar=kbar,
        kbar_wo=kbar_wo,
        shift=(kbar - kbar_wo) * amp,
        q_rot=q_rot * s,
        q0=q * (s * amp),
        k_rot=k_rot,
        keys=keys,
        g_drift=(k64 - k_fit) * amp,
        g_shared=(k64 - k_shared) * amp,
        shared=shared,
        has_shared=heldout_k is not None,
        rotations=rotations,
        dummy_distance=dummy_distance,
        distances=distances,
    )
