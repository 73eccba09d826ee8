"""Absolute position in the pre-RoPE vectors, and Method A with a mean key that drifts with it (docs/method.md
section 3C).

The causal averaging of a network writes absolute position into its hidden states, so a key can drift with
the position it sits at. Method A's constant mean key ``kbar`` leaves that drift in the semantic term g, scored
at the dummy distance D. Two measurements here:

* the **position share** of q and of k: the share of a vector's variance over the window that a function of
  its absolute position explains, by least squares on a polynomial basis of the position (:data:`BASES`:
  degree 1 and Legendre polynomials up to :data:`SMOOTH_DEGREE`);
* **Method A-drift**: Method A with the mean key replaced by the key's fit on the smooth basis, ``kbar(j)``:
  ``f_ij = s (R_i q_i).(R_j kbar(j))`` and ``g_ij = s (R_D q_i).(R_0 (k_j - kbar(j)))``. With g written as
  Method A's g minus the drift seen at D, ``c_ij = s (R_D q_i).(R_0 (kbar(j) - kbar)) = sum_m u_im P_jm``, a
  rank-M term (M basis functions), every sum over the counted entries that involves c takes O(T M d) per key
  set (:func:`drift_corrections`); the rest comes from the key sets of the masked moments (:func:`drift_moments`).

The fit of ``kbar(j)`` leaves the sink token out in both sink handlings (:func:`drift_basis`): the first key
of a trained model is an outlier (the attention sink) that would bend a smooth fit. 'with' scores key column 0
against the fit's value at j = 0; 'without' drops column 0. One drift key set then serves both handlings, and
the correction sums of 'without' are those of 'with' less column 0's, an O(T) step.
"""

from __future__ import annotations

import numpy as np
import torch

from posgen.decomposition.mask import SINKS
from posgen.decomposition.moments import Blocks, MaskedMoments, Moments

# Polynomial degree of the smooth basis. A fit of M = degree + 1 functions explains a share (M - 1) / (T - 1) of
# pure noise (0.7 % at T = 1200), and on SmolLM2's random-init keys the share grows by 1.6 points from degree 8
# to 16 (docs/method.md section 3C): the drift is smooth, and degree 8 holds it.
SMOOTH_DEGREE = 8
BASES = {"linear": 1, "smooth": SMOOTH_DEGREE}  # basis name -> polynomial degree in the position


def position_basis(n_tokens: int, degree: int, sink: str, device=None) -> torch.Tensor:
    """(T, M) float64: an orthonormal basis, over the counted tokens, of the polynomials of degree <= ``degree``
    in the position (Legendre polynomials of 2 j / (T - 1) - 1, orthonormalised by QR). Sink 'without' counts
    tokens 1..T-1: its row 0 is zero. The degree is capped so that M stays below the number of counted tokens."""
    first = SINKS.index(sink)  # 0 ('with') or 1 ('without'): the first counted token
    rows = n_tokens - first
    degree = max(0, min(degree, rows - 2))
    x = np.linspace(-1.0, 1.0, n_tokens) if n_tokens > 1 else np.zeros(1)
    vander = np.polynomial.legendre.legvander(x[first:], degree)  # (rows, M)
    ortho, _ = np.linalg.qr(vander)  # (rows, M): orthonormal columns, the same span
    basis = np.zeros((n_tokens, degree + 1))
    basis[first:] = ortho
    return torch.from_numpy(basis).to(device)


def drift_basis(n_tokens: int, degree: int, device=None) -> torch.Tensor:
    """(T, M) float64: the basis of Method A-drift's fit, :func:`position_basis` over tokens 1..T-1 (orthonormal
    there) extended to token 0 by the same polynomials, so that ``basis @ (basis[1:].T @ k[1:])`` is the fit over
    tokens 1..T-1 evaluated at every token."""
    degree = max(0, min(degree, n_tokens - 3))
    x = np.linspace(-1.0, 1.0, n_tokens) if n_tokens > 1 else np.zeros(1)
    vander = np.polynomial.legendre.legvander(x, degree)  # (T, M)
    _, upper = np.linalg.qr(vander[1:])  # vander[1:] = Q R, Q orthonormal
    basis = np.linalg.solve(upper.T, vander.T).T  # vander R^-1: rows 1.. are Q, row 0 the same polynomials at j = 0
    return torch.from_numpy(basis).to(device)


def position_share(x: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Share of the variance of ``x (..., T, d)`` over the counted tokens (rows of ``basis`` not all zero) that
    the least-squares fit on the first m + 1 columns of ``basis (T, M)`` explains, for every degree m:
    float64 ``(..., M)``, 0 at m = 0.

    ``basis`` is :func:`position_basis`: orthonormal, its first column constant over the counted tokens, and its
    first m + 1 columns spanning the polynomials of degree <= m (QR keeps the spans of a Vandermonde matrix
    nested), so one projection serves every degree: the fit's coefficients ``P^T x``, less the constant's."""
    x64 = x.double()  # (..., T, d)
    coef = basis.T @ x64  # (..., M, d): coef[0] = sqrt(n) x the mean over the counted tokens
    power = (coef * coef).sum(-1)  # (..., M)
    counted = basis.abs().sum(-1) > 0  # (T,)
    total = (x64[..., counted, :] ** 2).sum((-1, -2)) - power[..., 0]  # the variance, times n
    explained = power.cumsum(-1) - power[..., :1]  # (..., M): degrees 0, 1, ..., M - 1
    return explained / total[..., None]


def drift_fit(k64: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """The keys' fit over tokens 1..T-1 on :func:`drift_basis`, evaluated at every token: ``kbar(j) (..., T, d)``."""
    return basis @ (basis[1:].T @ k64[..., 1:, :])


def drift_corrections(q_rot, q0, keys, u, basis, blocks: Blocks, ragged_values) -> dict[str, dict]:
    """Sums over the counted entries of ``c_ij = sum_m u_im P_jm`` alone, squared, and times each x-like term
    ``a_i . v_j`` of one KV head, for both sink handlings.

    ``q_rot, q0 (h, T, d)``: the queries of the x-like terms (s R_i q_i) and of g (s R_0 q_i); ``keys``: name ->
    ``(query side, v (T, d), index)`` with query side ``"rot"`` or ``"g"`` and ``index`` the term's place among
    ``ragged_values (b, h, a | D, r, j)``, the values of every term at the ragged entries that the masked moments
    computed (:attr:`posgen.decomposition.moments.MaskedMoments.ragged`, one KV head); ``u (h, T, M)``;
    ``basis (T, M)``, its functions at every token (:func:`drift_basis`); ``blocks``: the token blocks of the
    masked moments. Returns ``{sink: sums}``, (h,) float64 sums ``c``, ``cc`` and ``<name>`` for each key set;
    'without' is 'with' less key column 0.

    No (T x T) matrix, as in :func:`posgen.decomposition.moments.masked_moments`: a key block that a query block
    counts in full enters through per-block sums, ``sum_(i in b) u_im a_i`` against ``sum_(j in c) P_jm v_j``
    (M x d each), summed over the query blocks that count it; the ragged columns (the diagonal block, a window's
    start) through their values, masked. O(T M d) per key set.
    """
    h, T, d = q_rot.shape
    B, nb = blocks.block, blocks.nb
    pad = nb * B - T

    def by_block(x):  # (..., T, e) -> (..., nb, B, e), zero-padded
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.view(*x.shape[:-2], nb, B, x.shape[-1])

    def full(query_sums, key_sums):  # (h, nb, F) per query block, (nb, F) per key block -> (h,)
        return (blocks.over_full(query_sums, 1) * key_sums).sum((-1, -2))

    cols, valid = blocks.ragged()  # (nb, j), (nb, B, j)
    u_b, p_b = by_block(u), by_block(basis)  # (h, nb, B, M), (nb, B, M)
    p_ragged = torch.nn.functional.pad(basis, (0, 0, 0, pad))[cols.clamp(min=0)]  # (nb, j, M)
    c_ragged = (u_b @ p_ragged.transpose(-1, -2)) * valid  # (h, nb, B, j): c at the ragged entries
    # key column 0, in the rows that count it: what 'without' leaves out
    counts0 = (torch.arange(T, device=u.device) < (blocks.window or T)).to(u.dtype)  # (T,)
    c0 = (u @ basis[0]) * counts0  # (h, T)
    out = {
        "c": full(u_b.sum(2), p_b.sum(1)) + c_ragged.sum((1, 2, 3)),
        "cc": full(
            torch.einsum("hbrm,hbrn->hbmn", u_b, u_b).flatten(2),  # (h, nb, M M)
            torch.einsum("brm,brn->bmn", p_b, p_b).flatten(1),  # (nb, M M)
        )
        + (c_ragged * c_ragged).sum((1, 2, 3)),
    }
    col0 = {"c": c0.sum(-1), "cc": (c0 * c0).sum(-1)}
    for side, a in (("rot", q_rot), ("g", q0)):  # the key sets of one query side together
        names = [name for name, key in keys.items() if key[0] == side]
        if not names:
            continue
        v = torch.stack([keys[name][1] for name in names])  # (n, T, d)
        query_sums = torch.einsum("hbrm,hbre->hbme", u_b, by_block(a)).flatten(2)  # (h, nb, M d)
        query_sums = blocks.over_full(query_sums, 1)  # (h, c, M d): over the query blocks that count key block c
        key_sums = torch.einsum("brm,nbre->nbme", p_b, by_block(v)).flatten(2)  # (n, nb, M d)
        zero = torch.einsum("hte,ne->nht", a, v[:, 0]) * c0  # (n, h, T): column 0, in the rows that count it
        for i, name in enumerate(names):
            x_ragged = ragged_values[:, :, keys[name][2]].transpose(0, 1)  # (h, nb, B, j)
            out[name] = (query_sums * key_sums[i]).sum((-1, -2)) + (x_ragged * c_ragged).sum((1, 2, 3))
            col0[name] = zero[i].sum(-1)
    return {"with": out, "without": {name: out[name] - col0[name] for name in out}}


def drift_moments(m: MaskedMoments, corrections: dict, a: int, i_dummy: int) -> dict[str, Moments]:
    """Method A-drift's sums of x = W, f = s (R_i q_i).(R_j kbar(j)) and g - c at the dummy distance (index
    ``i_dummy`` of the rotations), per sink, from :func:`posgen.decomposition.moments.masked_moments` over the
    'with' mask and :func:`drift_corrections` (``corrections[sink]``).

    ``a``: the index of the drift key set R_j kbar(j) among the masked moments' key sets (the W set is 0). g is Method A's ``s (R_D q_i).(R_0 (k_j - kbar))`` without its sink-free offset: the drift
    fit carries the whole mean. 'without' subtracts key column 0's products, as
    :func:`posgen.decomposition.moments.moments_by_sink` does. Returns ``{sink: Moments}`` with g terms (1, ...)."""
    c0, g0 = m.q_col0, m.g_col0[i_dummy]  # (n, h, a, T), (n, h, T)
    plain = {
        "with": (m.q_rows, m.g_rows[i_dummy], m.qq, m.qg[i_dummy], m.gg[i_dummy]),
        "without": (
            m.q_rows - c0,
            m.g_rows[i_dummy] - g0,
            m.qq - torch.einsum("nhat,nhbt->nhab", c0, c0),
            m.qg[i_dummy] - torch.einsum("nhat,nht->nha", c0, g0),
            m.gg[i_dummy] - (g0 * g0).sum(-1),
        ),
    }
    out = {}
    for sink in SINKS:
        rows, g_rows, qq, qg, gg = plain[sink]
        c = corrections[sink]
        out[sink] = Moments(
            s_x=rows[..., 0, :].sum(-1),
            s_f=rows[..., a, :].sum(-1),
            s_g=(g_rows.sum(-1) - c["c"])[None],
            s_xx=qq[..., 0, 0],
            s_xf=qq[..., 0, a],
            s_ff=qq[..., a, a],
            s_xg=(qg[..., 0] - c["x"])[None],
            s_fg=(qg[..., a] - c["f"])[None],
            s_gg=(gg - 2 * c["g"] + c["cc"])[None],
        )
    return out
