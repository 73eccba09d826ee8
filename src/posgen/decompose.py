"""Positional + semantic split of attention logits, per (sample, layer, head) (docs/method.md sections 3-5).

Method A (mean-key construction): ``f_ij = s (R_i q_i).(R_j kbar)``, ``g_ij = s (R_D q_i).(R_0 (k_j - kbar))``,
``A = f + g``. ``R_0`` is the identity times the model's ``attention_scaling`` (1 for plain RoPE), so that
``R_D^T R_0 = R_i^T R_(i-D)`` exactly as for a real pair at distance D. Method B: exact least-squares fit
``W_ij ~ a(i-j) + b(i) + c(j)`` over the counted entries.

``Decomposer.unit`` runs the steps in order: ``operands`` (rotations, mean keys; section 1 and 3A), ``moments``
(sums over the counted entries), ``method_a`` (section 3A and 4), ``method_b`` (section 3B), and on the first
``bound_samples`` samples ``error_and_bound`` and ``check_bound`` (section 5).

Everything is exact (no sampling, no truncated iterations). W, f and every g_D are rank-d matrices
(``x_ij = a_i . u_j``), so only the error of A and its bound need every entry:

* sums and second moments over the causal (or windowed) mask, ``sum_ij (a_i.u_j)(b_i.v_j)``, in float64 from
  query-block Gram matrices summed over the query blocks that count a key block in full, times the keys, plus
  the ragged diagonal blocks entry by entry (``masked_moments``); dropping the sink column is an O(T)
  correction (``moments_by_sink``); D enters only through the fixed rotation R_D, applied after the sums over
  tokens;
* Method B: the normal matrix depends only on the mask; b is eliminated, the 3-dim gauge fixed, and the
  reduced matrix Cholesky-factorised and inverted once per mask in float64 (cached). A head needs only the
  diagonal sums of its masked W (a cross-correlation along tokens, FFT), row and column sums (``w_sums``)
  and one matrix product; the normal residual is evaluated from the mask structure in O(T) and refined if
  needed;
* the error of A and the section 5 bound (on the first ``bound_samples`` samples): the mean bound is a causal
  convolution per band (FFT); the error ``W - f - g = [q_rot | p_D] . [R_j (k_j - kbar) | -R_0 (k_j - kbar)]``
  is one product per cache-sized row block; the bound per entry is one more product times a sign for the
  'slow' bands (no sign change of ``sin(theta (i-j-D)/2)`` except at i - j = D) and, for the 'fast' ones, a
  product of the query factors with Hankel factors times the key factors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr
from tqdm import tqdm

from posgen.layer_types import effective_window, layer_types, used_dummy_distance
from posgen.models import resolve_device
from posgen.rope import causal_mask, rotate
from posgen.stats import pearson_from_sums
from posgen.store import carried_attrs, open_dataset, provenance, write_netcdf

SINKS = ("with", "without")
METHODS = ("A", "B")
SUMS = ("n", "sum_x", "sum_y", "sum_xx", "sum_yy", "sum_xy")  # sufficient statistics of r(x = W, y = A or B)
LSTSQ_TOL = 1e-8  # max relative normal-equation residual of Method B (float64 solves reach ~1e-13)
BOUND_RTOL = 1e-4  # bound check: slack may dip below 0 by this times s |q|max |k|max (float32 rounding)


@dataclass(frozen=True)
class LayerRope:
    """RoPE parameters of one layer, as stored in qk.h5."""

    inv_freq: torch.Tensor  # (band,)
    scaling: float
    attention_scaling: float = 1.0
    sliding_window: int = 0  # 0 = global


# ------------------------------------------------------------------------------------------- masks


def window_prefix(x: torch.Tensor, window: int, dim: int = 0) -> torch.Tensor:
    """``out_i = sum of x_j over lo_i <= j <= i`` along ``dim``, lo_i = max(0, i - window + 1) (0: all j <= i)."""
    c = torch.cumsum(x, dim)
    n = x.shape[dim]
    if window and window < n:
        lagged = torch.zeros_like(c)
        lagged.narrow(dim, window, n - window).copy_(c.narrow(dim, 0, n - window))
        c = c - lagged
    return c


@dataclass(frozen=True)
class MaskInfo:
    """The entries that count: j <= i, within the window, and for ``without`` not in key column 0."""

    n_tokens: int
    window: int

    def count(self, sink: str) -> float:
        """Number of counted entries (computed on the host: no device round trip)."""
        T, W = self.n_tokens, self.window or self.n_tokens
        n = sum(min(i + 1, W) for i in range(T))
        return float(n - min(T, W) if sink == "without" else n)

    def bool(self, sink: str = "with", device=None) -> torch.Tensor:
        mask = causal_mask(self.n_tokens, self.window, device)
        if sink == "without":
            mask[:, 0] = False
        return mask


def _by_block(x: torch.Tensor, block: int) -> torch.Tensor:
    """(g, n, T, e) -> (g, nb, n * block, e): tokens in blocks of ``block`` (zero-padded), the n sets stacked."""
    g, n, T, e = x.shape
    nb = -(-T // block)
    x = torch.nn.functional.pad(x, (0, 0, 0, nb * block - T))  # (g, n, (nb, block), e)
    x = x.view(g, n, nb, block, e)
    x = x.transpose(1, 2)  # (g, nb, n, block, e)
    return x.reshape(g, nb, n * block, e)


def masked_moments(
    q: torch.Tensor, q0: torch.Tensor, rotations: torch.Tensor, keys: torch.Tensor, window: int, block: int = 32
) -> dict:
    """Sums over the counted entries of ``x_a = q Ka^T`` and ``g_D = (q0 R_D^T) Kg^T`` and of their products.

    ``q, q0 (n, h, T, d)``: n KV heads with h query heads each; ``rotations (nD, d, d)``, the R_D
    (block-diagonal per RoPE band, dims l and l + d/2); ``keys (n, T, (k + 1) d) = [K1 | ... | Kk | Kg]``.
    Returns float64 ``qq (n, h, k, k)``, ``qg (nD, n, h, k)``, ``gg (nD, n, h)`` (sums of products), the row sums
    ``q_rows (n, h, k, T)``, ``g_rows (nD, n, h, T)`` and column 0 where it counts, ``q_col0 (n, h, k, T)``,
    ``g_col0 (nD, n, h, T)`` (so that sums without column 0 follow in O(T)).

    No (T x T) matrix: ``sum_ij (a_i.u_j)(b_i.v_j) = sum_j u_j^T (sum_i a_i b_i^T) v_j``. Tokens go in blocks;
    a key block that a query block counts in full enters through the query block's Gram matrices, summed
    over every such query block; the rest (the diagonal block and, with a window, its ragged start: under 3
    blocks) through explicit products, masked. The dummy distance enters only through R_D, so the g terms
    are contracted once for every D (for g^2, per pair of bands). Everything in float64: raw second moments
    then need no shifting against cancellation. method.md sections 3A (Method A's terms) and 4 (the sums).
    """
    f64 = torch.float64
    q, q0, rotations, keys = q.to(f64), q0.to(f64), rotations.to(f64), keys.to(f64)
    n, h, T, d = q.shape
    k = keys.shape[-1] // d - 1
    nD, L = rotations.shape[0], d // 2
    dev = q.device
    nb = -(-T // block)
    Q, G = slice(0, k * d), slice(k * d, (k + 1) * d)
    r_flat = rotations.reshape(nD, d * d)  # (D, (f, e)): R_D[f, e]
    rot_t = rotations.transpose(0, 1).reshape(d, nD * d)  # (f, (D, e)): u @ rot_t = R_D^T u for every D
    nd = window or T
    # Index names in the shape comments: a, b key sets K_a (a = k: Kg); D dummy distances; e, f dims; l, m bands
    # and x, y, z, w in {0, 1} the two dims (l and l + d/2) of a band; b query blocks, c key blocks, r rows of a
    # block; j ragged key columns.

    # row sums from prefix sums of the keys; g_D rows: (R_D q0_i) . u = q0_i . (R_D^T u)
    pre = window_prefix(keys, window, dim=1)  # (n, T, (k + 1) d): sum of the keys that row i counts
    pre_q = pre[:, None, :, Q].reshape(n, 1, T, k, d)  # (n, 1, T, a, e)
    pre_g = pre[..., G] @ rot_t  # (n, T, (D, e))
    pre_g = pre_g.view(n, 1, T, nD, d)  # (n, 1, T, D, e): R_D^T u
    q_rows = (q[:, :, :, None] * pre_q).sum(-1)  # (n, h, T, a)
    g_rows = (q0[:, :, :, None] * pre_g).sum(-1)  # (n, h, T, D)
    del pre_q  # temporaries go as soon as they are used: the working set stays small
    out = {"q_rows": q_rows.transpose(2, 3), "g_rows": g_rows.permute(3, 0, 1, 2)}  # (n, h, a, T), (D, n, h, T)
    counts0 = (torch.arange(T, device=dev) < nd).to(f64)[:, None]  # (T, 1): rows that count column 0
    k0_q = keys[:, None, 0, Q].reshape(n, 1, k, d)  # (n, 1, a, e): key column 0
    k0_g = torch.einsum("Dfe,nf->nDe", rotations, keys[:, 0, G])  # (n, D, e): R_D^T kg_0
    q_col0 = (q @ k0_q.transpose(-1, -2)) * counts0  # (n, h, T, a)
    g_col0 = (q0 @ k0_g[:, None].transpose(-1, -2)) * counts0  # (n, h, T, D)
    out["q_col0"] = q_col0.transpose(2, 3)  # (n, h, a, T)
    out["g_col0"] = g_col0.permute(3, 0, 1, 2)  # (D, n, h, T)

    rows = torch.arange(nb * block, device=dev).view(nb, block)
    lo = (rows - window + 1).clamp(min=0) if window else torch.zeros_like(rows)
    b_idx = torch.arange(nb, device=dev)
    # query block b counts key blocks [full_lo, b) in full: from the first block boundary at or after its last
    # row's window start; so key block c is counted in full by query blocks c < b <= last[c] (full_lo ascends)
    full_lo = torch.minimum(-(-lo[:, -1] // block), b_idx)
    last = torch.searchsorted(full_lo, b_idx, right=True) - 1  # >= c, as full_lo[c] <= c

    def over_full(x, dim):  # per key block c: sum of x over the query blocks c < b <= last[c], along dim
        acc = torch.cat([x, torch.zeros_like(x.narrow(dim, 0, 1))], dim)
        for b in range(nb - 1, -1, -1):  # suffix sums; a loop of adds beats torch.cumsum on CPU
            acc.select(dim, b).add_(acc.select(dim, b + 1))
        if not window:
            return acc.narrow(dim, 1, nb)
        return acc.index_select(dim, b_idx + 1) - acc.index_select(dim, last + 1)

    # full blocks. Query side: per block and head the Gram matrix of [q | q0], summed as above
    qb = _by_block(q, block)  # (n, b, (h, r), e)
    q0b = _by_block(q0, block)  # (n, b, (h, r), e)
    z = torch.cat([qb, q0b], -1)  # (n, b, (h, r), 2d): [q | q0]
    z = z.view(n * nb * h, block, 2 * d)  # ((n, b, h), r, 2d)
    s = torch.bmm(z.transpose(1, 2).contiguous(), z)  # ((n, b, h), 2d, 2d) (strided operands are slow)
    s = s.view(n, nb, h, 2 * d, 2 * d)  # (n, b, h, q | q0 e, q | q0 e')
    # q against [q | q0], for the q rows and q g terms
    s_q = s[:, :, :, :d]  # (n, b, h, e, 2d)
    s_q = s_q.reshape(n, nb, h, d, 2, d)  # (n, b, h, e, q | q0, e')
    s_q = s_q.permute(0, 1, 3, 4, 2, 5)  # (n, b, e, q | q0, h, e')
    s_q = s_q.reshape(n, nb, d, 2 * h * d)  # (n, b, e, (q | q0, h, e'))
    s_q = over_full(s_q, 1)  # (n, c, e, (q | q0, h, e'))
    s_q = s_q.reshape(n * nb, d, 2 * h * d)  # ((n, c), e, (q | q0, h, e'))
    # q0 against q0 per pair of bands, for g^2: s[(z, l), (w, m)]
    s_00 = s[:, :, :, d:, d:]  # (n, b, h, (z, l), (w, m))
    s_00 = s_00.reshape(n, nb, h, 2, L, 2, L)  # (n, b, h, z, l, w, m)
    s_00 = s_00.permute(0, 4, 6, 1, 3, 5, 2)  # (n, l, m, b, z, w, h)
    s_00 = s_00.reshape(n, L * L, nb, 4 * h)  # (n, (l, m), b, (z, w, h))
    s_00 = over_full(s_00, 2)  # (n, (l, m), c, (z, w, h))
    s_00 = s_00.reshape(n * L * L, nb, 4 * h)  # ((n, l, m), c, (z, w, h))
    del s, z
    # key side: y = K_a[j]^T (summed query Grams) for key j = (c, r)
    kp = torch.nn.functional.pad(keys, (0, 0, 0, nb * block - T))  # (n, (c, r), (k + 1) d), zero-padded
    kb = kp.view(n, nb, block, k + 1, d)  # (n, c, r, a, e)
    k_sets = kb[..., :k, :].reshape(n * nb, block * k, d)  # ((n, c), (r, a), e)
    y = torch.bmm(k_sets, s_q)  # ((n, c), (r, a), (q | q0, h, e'))
    y = y.view(n, nb, block, k, 2, h, d)  # (n, c, r, a, q | q0, h, e')
    del k_sets
    out["qq"] = torch.einsum("ncrahe,ncrbe->nhab", y[..., 0, :, :], kb[..., :k, :])  # (n, h, a, b)
    # sum_i (q_i^T G_ag) . R_D q0_i = <R_D, m_a>, m_a = sum_j kg_j (K_a[j]^T summed q q0^T Grams)
    kg = kb[..., k, :]  # (n, c, r, f)
    kg_t = kg.reshape(n, nb * block, d).transpose(1, 2)  # (n, f, (c, r))
    m = []
    for a in range(k):
        y_a = y[:, :, :, a, 1].reshape(n, nb * block, h * d)  # (n, (c, r), (h, e))
        m.append(torch.bmm(kg_t, y_a))  # (n, f, (h, e))
    del y_a, y
    m = torch.stack(m, 1)  # (n, a, f, (h, e))
    m = m.view(n, k, d, h, d)  # (n, a, f, h, e)
    m = m.permute(0, 3, 1, 2, 4)  # (n, h, a, f, e)
    m = m.reshape(n * h * k, d * d)  # ((n, h, a), (f, e))
    out["qg"] = (r_flat @ m.T).view(nD, n, h, k)  # (D, n, h, a)
    # g^2 = sum kg[x, l] kg[y, m] r_l[x, z] r_m[y, w] q0[z, l] q0[w, m], with R_D restricted to band pairs,
    # r[D, x, z, l] = R_D[(x, l), (z, l)]
    r = rotations.view(nD, 2, L, 2, L).diagonal(dim1=2, dim2=4)  # (D, x, z, l)
    pair = torch.einsum("Dxzl,Dywm->Dlmxyzw", r, r)  # (D, l, m, x, y, z, w)
    pair = pair.reshape(nD, -1)  # (D, (l, m, x, y, z, w))
    kg_blocks = kg.reshape(n * nb, block, d)  # ((n, c), r, f)
    g_gg = torch.bmm(kg_blocks.transpose(1, 2).contiguous(), kg_blocks)  # ((n, c), (x, l), (y, m))
    g_gg = g_gg.view(n, nb, 2, L, 2, L)  # (n, c, x, l, y, m)
    g_gg = g_gg.permute(0, 3, 5, 2, 4, 1)  # (n, l, m, x, y, c)
    g_gg = g_gg.reshape(n * L * L, 4, nb)  # ((n, l, m), (x, y), c)
    gram = torch.bmm(g_gg, s_00)  # ((n, l, m), (x, y), (z, w, h))
    gram = gram.view(n, -1, h)  # (n, (l, m, x, y, z, w), h)
    out["gg"] = torch.einsum("Dk,nkh->Dnh", pair, gram)  # (D, n, h)
    del gram, g_gg, s_00, s_q

    # ragged columns: the values of every x_a and g_D, masked, and all their products from one Gram matrix
    edge = 2 * block if window else 0
    cols = torch.cat(
        [
            full_lo[:, None] * block - edge + torch.arange(edge, device=dev),
            b_idx[:, None] * block + torch.arange(block, device=dev),
        ],
        1,
    )  # (b, j)
    valid = (cols[:, None, :] <= rows[:, :, None]) & (cols[:, None, :] >= lo[:, :, None]) & (cols >= 0)[:, None]
    valid[:, :, :edge] &= (cols[:, :edge] < full_lo[:, None] * block)[:, None]
    vm = valid.to(f64)[:, None, None]  # (b, 1, 1, r, j)
    C = cols.shape[1]
    kc = kp[:, cols.clamp(min=0)]  # (n, b, j, (k + 1) d)
    kc = kc.view(n, nb, C, k + 1, d)  # (n, b, j, a, e)
    kc_q = kc[..., :k, :].permute(0, 1, 4, 3, 2)  # (n, b, e, a, j)
    kc_q = kc_q.reshape(n * nb, d, k * C)  # ((n, b), e, (a, j))
    vals = torch.empty(n, nb, h, k + nD, block, C, dtype=f64, device=dev)  # (n, b, h, a | D, r, j)
    v = torch.bmm(qb.reshape(n * nb, h * block, d), kc_q)  # ((n, b), (h, r), (a, j))
    v = v.view(n, nb, h, block, k, C)  # (n, b, h, r, a, j)
    torch.mul(v.transpose(3, 4), vm, out=vals[:, :, :, :k])
    # g_D at (i, j) = q0_i . R_D^T kg_j: rotate the few ragged keys rather than every query
    kg_rot = kc[..., k, :].reshape(-1, d) @ rot_t  # ((n, b, j), (D, e))
    kg_rot = kg_rot.view(n * nb, C, nD, d)  # ((n, b), j, D, e)
    kg_rot = kg_rot.permute(0, 3, 2, 1)  # ((n, b), e, D, j)
    kg_rot = kg_rot.reshape(n * nb, d, nD * C)  # ((n, b), e, (D, j))
    vg = torch.bmm(q0b.reshape(n * nb, h * block, d), kg_rot)  # ((n, b), (h, r), (D, j))
    vg = vg.view(n, nb, h, block, nD, C)  # (n, b, h, r, D, j)
    torch.mul(vg.transpose(3, 4), vm, out=vals[:, :, :, k:])
    vals = vals.view(n * nb * h, k + nD, block * C)  # ((n, b, h), a | D, (r, j))
    prod = torch.bmm(vals, vals.transpose(1, 2).contiguous())  # ((n, b, h), a | D, a | D)
    prod = prod.view(n, nb, h, k + nD, k + nD).sum(1)  # (n, h, a | D, a | D)
    out["qq"] += prod[..., :k, :k]
    out["qg"] += prod[..., k:, :k].permute(2, 0, 1, 3)
    out["gg"] += prod[..., k:, k:].diagonal(dim1=-2, dim2=-1).permute(2, 0, 1)
    return out


def moments_by_sink(m: dict, gamma: torch.Tensor, window: int) -> dict:
    """Sums of x = W, f, g_D and their products for both sink handlings, from :func:`masked_moments` over the
    'with' mask with keys ``[x | f | phi | g]``.

    'without' drops column 0 and takes the mean key over tokens 1..T-1, kbar': f' = f + phi with
    ``phi_ij = s (R_i q_i).(R_j (kbar' - kbar))`` and g' = g + gamma with the row constant
    ``gamma_i = s (R_D q_i).(R_0 (kbar - kbar'))``, ``gamma (nD, ..., T)``. Sums without column 0 subtract its
    products, an O(T) correction. Returns ``{sink: {s_x, s_f, s_g, s_xx, s_xf, s_ff, s_xg, s_fg, s_gg}}``.
    method.md sections 3A (the sink-free terms) and 4.
    """
    T = m["q_rows"].shape[-1]
    nd = window or T
    tok = torch.arange(T, device=gamma.device)
    n_rows = ((tok + 1).clamp(max=nd) - (tok < nd).long()).to(gamma.dtype)  # counted entries per row, no column 0
    c0, g0 = m["q_col0"], m["g_col0"]  # column 0: (n, h, a, T), (D, n, h, T)
    # without column 0; a indexes the key sets [x | f | phi]
    rows = m["q_rows"] - c0  # (n, h, a, T)
    g_rows = m["g_rows"] - g0  # (D, n, h, T)
    qq = m["qq"] - torch.einsum("nhat,nhbt->nhab", c0, c0)  # (n, h, a, b)
    qg = m["qg"] - torch.einsum("nhat,Dnht->Dnha", c0, g0)  # (D, n, h, a)
    gg = m["gg"] - (g0 * g0).sum(-1)  # (D, n, h)
    f_rows = rows[..., 1, :] + rows[..., 2, :]  # (n, h, T): rows of f' = f + phi
    return {
        "with": {
            "s_x": m["q_rows"][..., 0, :].sum(-1),
            "s_f": m["q_rows"][..., 1, :].sum(-1),
            "s_g": m["g_rows"].sum(-1),
            "s_xx": m["qq"][..., 0, 0],
            "s_xf": m["qq"][..., 0, 1],
            "s_ff": m["qq"][..., 1, 1],
            "s_xg": m["qg"][..., 0],
            "s_fg": m["qg"][..., 1],
            "s_gg": m["gg"],
        },
        "without": {
            "s_x": rows[..., 0, :].sum(-1),
            "s_f": f_rows.sum(-1),
            "s_g": g_rows.sum(-1) + (gamma * n_rows).sum(-1),
            "s_xx": qq[..., 0, 0],
            "s_xf": qq[..., 0, 1] + qq[..., 0, 2],
            "s_ff": qq[..., 1, 1] + 2 * qq[..., 1, 2] + qq[..., 2, 2],
            "s_xg": qg[..., 0] + (gamma * rows[..., 0, :]).sum(-1),
            "s_fg": qg[..., 1] + qg[..., 2] + (gamma * f_rows).sum(-1),
            "s_gg": gg + 2 * (gamma * g_rows).sum(-1) + (gamma * gamma * n_rows).sum(-1),
        },
    }


def w_sums(q: torch.Tensor, k: torch.Tensor, window: int, shift: torch.Tensor):
    """Diagonal (delta = i - j >= 0), row and column sums and column 0 of ``W - shift`` over the counted entries.

    ``W = q k^T`` for ``q (..., T, d)`` and ``k (..., T, d)`` (broadcast: a KV head against its query heads),
    ``shift (...)``; float64, shaped (..., T). No (T x T) matrix: the diagonal sums are a cross-correlation
    along tokens (FFT), rows and columns come from window sums of the factors. Diagonals beyond the window's
    reach sum to 0. The right-hand side of Method B's normal equations, method.md section 3B.
    """
    f64 = torch.float64
    q, k, shift = q.to(f64), k.to(f64), shift.to(f64)[..., None]
    T = q.shape[-2]
    nd = window or T
    tok = torch.arange(T, device=q.device)
    spec = torch.fft.rfft(q.transpose(-1, -2).contiguous(), 2 * T)  # along tokens, per dim
    spec = (spec * torch.fft.rfft(k.transpose(-1, -2).contiguous(), 2 * T).conj()).sum(-2)
    diag = (torch.fft.irfft(spec, 2 * T)[..., :T] - shift * (T - tok)) * (tok < nd)
    rows = (q * window_prefix(k, window, dim=-2)).sum(-1) - shift * (tok + 1).clamp(max=nd)
    # column j is counted by rows j .. j + nd - 1: a window sum of q in reversed token order
    q_after = window_prefix(q.flip(-2), window, dim=-2).flip(-2)
    cols = (q_after * k).sum(-1) - shift * (T - tok).clamp(max=nd)
    col0 = ((q * k[..., :1, :]).sum(-1) - shift) * (tok < nd)
    return diag, rows, cols, col0


class AdditiveDesign:
    """Normal equations of ``W_ij ~ a(i-j) + b(i) + c(j)`` over one mask, factorised once.

    Unknowns: a_delta (delta = 0 .. n_delta - 1), b_i, c_j. The design has a 3-dim null space (constants
    moved between a, b, c, and the linear trend a + l*delta, b - l*i, c + l*j); b is eliminated exactly
    (its block is diagonal) and a_0 and c at the first and last counted key columns are fixed to 0.

    ``causal=False`` fits the full bidirectional T x T matrix (no window, no sink handling): a has one entry
    per signed distance, stored at index ``delta mod (2T - 1)`` (0 .. T-1, then -(T-1) .. -1; ``deltas``),
    so a_0 stays at index 0. Its mask products are dense matrix products (small T); the causal path is the
    O(T) prefix-sum one, unchanged.
    """

    def __init__(self, n_tokens: int, window: int, sink: str, device, causal: bool = True):
        T = n_tokens
        if T < 3 or (window and window < 2):
            raise ValueError(f"additive fit needs >= 3 tokens and a window >= 2 (got T={T}, window={window})")
        if not causal and (window or sink != "with"):
            raise ValueError(f"bidirectional additive fit takes no window and sink 'with' (got {window}, {sink!r})")
        f64 = torch.float64
        self.n_tokens, self.window, self.sink, self.causal = T, window, sink, causal
        if causal:
            self.n_delta = window or T
            self.deltas = torch.arange(self.n_delta, device=device)
            M = MaskInfo(T, window).bool(sink, device).to(f64)
        else:
            self.n_delta = 2 * T - 1
            index = torch.arange(self.n_delta, device=device)
            self.deltas = torch.where(index < T, index, index - self.n_delta)  # signed i - j per a index
            M = torch.ones(T, T, dtype=f64, device=device)
        nab = torch.zeros(self.n_delta, T, dtype=f64, device=device)  # [delta, i] = M[i, i - delta]
        nac = torch.zeros(self.n_delta, T, dtype=f64, device=device)  # [delta, j] = M[j + delta, j]
        for index, delta in enumerate(self.deltas.tolist()):
            diag = torch.diagonal(M, -delta)
            nab[index, max(delta, 0) : T + min(delta, 0)] = diag
            nac[index, max(-delta, 0) : T - max(delta, 0)] = diag
        if not causal:
            self._dense = (nab, nac, M)  # mask blocks for the products below
        self.cnt_a, self.cnt_b, self.cnt_c = nab.sum(1), M.sum(1), M.sum(0)
        self.inv_b = torch.where(self.cnt_b > 0, 1.0 / self.cnt_b.clamp(min=1), torch.zeros_like(self.cnt_b))
        # reduced system on z = (a, c) after eliminating b; e[z, i] couples z with b (dense only here)
        e = torch.cat([nab, M.T])
        n_z = self.n_delta + T
        s = torch.zeros(n_z, n_z, dtype=f64, device=device)
        s[: self.n_delta, : self.n_delta] = torch.diag(self.cnt_a)
        s[self.n_delta :, self.n_delta :] = torch.diag(self.cnt_c)
        s[: self.n_delta, self.n_delta :] = nac
        s[self.n_delta :, : self.n_delta] = nac.T
        s -= (e * self.inv_b) @ e.T
        del e, nab, nac, M
        counted = torch.cat([self.cnt_a, self.cnt_c]) > 0
        cols = torch.nonzero(self.cnt_c > 0).flatten()
        # first and last counted key columns: keeps the fitted linear trend, hence theta, small
        gauge = [0, self.n_delta + int(cols[0]), self.n_delta + int(cols[-1])]
        counted[gauge] = False
        self.keep = torch.nonzero(counted).flatten()
        chol, info_ = torch.linalg.cholesky_ex(s[self.keep][:, self.keep])
        if int(info_) != 0:
            raise RuntimeError(
                f"additive fit: reduced normal matrix not positive definite (T={T}, window={window}, "
                f"sink={sink}); the gauge does not match the mask"
            )
        # an explicit inverse turns every solve into one matrix product (trsm is slow for few right-hand
        # sides, on GPUs above all); iterative refinement in ``fit`` removes its extra rounding
        self.inverse = torch.cholesky_inverse(chol)
        # null space of the design (constants a<->b, b<->c, linear trend), on the counted unknowns
        delta = self.deltas.to(f64)
        tok = torch.arange(T, device=device, dtype=f64)
        zero_a, zero_t, one_a, one_t = (
            torch.zeros_like(delta),
            torch.zeros_like(tok),
            torch.ones_like(delta),
            torch.ones_like(tok),
        )
        null = (
            torch.stack(
                [
                    torch.cat([one_a, -one_t, zero_t]),
                    torch.cat([zero_a, one_t, -one_t]),
                    torch.cat([delta, -tok, tok]),
                ],
                1,
            )
            * (torch.cat([self.cnt_a, self.cnt_b, self.cnt_c]) > 0)[:, None]
        )
        self.null = null
        self.null_proj = torch.linalg.solve(null.T @ null, null.T)  # r -> r - (r null) null_proj

    def rhs(self, sums):
        """Normal-equation right-hand side (float64) from the diagonal, row and column sums and column 0 of
        the matrix masked for 'with' (:func:`w_sums`).

        For 'without' the key column 0 is taken out of the diagonal, row and column sums. Sums computed along
        different routes disagree at rounding level (sum of diagonals vs rows vs columns); that part, which
        lies in the design's null space and no fit can reach, is projected out, so the reported normal
        residual measures the solve.
        """
        diag, rows, cols, col0 = (t.double() for t in sums)
        ra = diag[:, : self.n_delta]  # bidirectional: every signed diagonal, in the order of ``deltas``
        if self.sink == "without":
            ra = ra - col0[:, : self.n_delta]
            rows = rows - col0
            cols = cols * (self.cnt_c > 0)
        r = torch.cat([ra, rows, cols], -1)
        r = r - (r @ self.null) @ self.null_proj
        return torch.split(r, [self.n_delta, self.n_tokens, self.n_tokens], -1)

    # products with the mask blocks in O(T) from prefix sums (float64), batched over leading dims:
    # nab[delta, i] = M[i, i - delta], nac[delta, j] = M[j + delta, j], M[i, j]
    def _prefix(self, v):
        return torch.nn.functional.pad(torch.cumsum(v, -1), (1, 0))  # [k] = sum of v[:k]

    def nab(self, b):
        if not self.causal:
            return b @ self._dense[0].T
        out = self._prefix(b)[..., -1:] - self._prefix(b)[..., : self.n_delta]  # sum_{i >= delta} b_i
        return out - b[..., : self.n_delta] if self.sink == "without" else out

    def nab_t(self, a):
        if not self.causal:
            return a @ self._dense[0]
        T, nd = self.n_tokens, self.n_delta
        idx = torch.arange(T, device=a.device).clamp(max=nd - 1) + 1
        out = self._prefix(a)[..., idx]  # sum_{delta <= min(i, nd - 1)} a_delta
        if self.sink == "without":
            out = out - torch.nn.functional.pad(a, (0, T - nd))
        return out

    def nac(self, c):
        if not self.causal:
            return c @ self._dense[1].T
        T, nd = self.n_tokens, self.n_delta
        out = self._prefix(c)[..., T - torch.arange(nd, device=c.device)]  # sum_{j <= T - 1 - delta} c_j
        return out - c[..., :1] if self.sink == "without" else out

    def nac_t(self, a):
        if not self.causal:
            return a @ self._dense[1]
        T, nd = self.n_tokens, self.n_delta
        idx = (T - 1 - torch.arange(T, device=a.device)).clamp(max=nd - 1) + 1
        out = self._prefix(a)[..., idx]  # sum_{delta <= min(T - 1 - j, nd - 1)} a_delta
        if self.sink == "without":
            out = out.clone()
            out[..., 0] = 0
        return out

    def m(self, c):
        if not self.causal:
            return c @ self._dense[2].T
        T, nd = self.n_tokens, self.n_delta
        i = torch.arange(T, device=c.device)
        pre = self._prefix(c)
        out = pre[..., i + 1] - pre[..., (i - nd + 1).clamp(min=0)]  # sum_{lo_i <= j <= i} c_j
        if self.sink == "without":
            out = out - c[..., :1] * (i < nd)
        return out

    def m_t(self, b):
        if not self.causal:
            return b @ self._dense[2]
        T, nd = self.n_tokens, self.n_delta
        j = torch.arange(T, device=b.device)
        pre = self._prefix(b)
        out = pre[..., (j + nd).clamp(max=T)] - pre[..., j]  # sum_{j <= i <= j + nd - 1} b_i
        if self.sink == "without":
            out = out.clone()
            out[..., 0] = 0
        return out

    def solve(self, ra, rb, rc):
        """Least-squares (a, b, c) for right-hand sides (h, .); gauge entries are 0."""
        rb_scaled = rb * self.inv_b
        rz = torch.cat([ra - self.nab(rb_scaled), rc - self.m_t(rb_scaled)], -1)
        z = torch.zeros_like(rz)
        z[:, self.keep] = rz[:, self.keep] @ self.inverse
        a, c = z[:, : self.n_delta], z[:, self.n_delta :]
        b = (rb - self.nab_t(a) - self.m(c)) * self.inv_b
        return a, b, c

    def normal(self, a, b, c):
        """N theta, from the mask structure (independent of the factorisation)."""
        na = a * self.cnt_a + self.nab(b) + self.nac(c)
        nb = self.nab_t(a) + b * self.cnt_b + self.m(c)
        nc = self.nac_t(a) + self.m_t(b) + c * self.cnt_c
        return na, nb, nc

    def fit(self, ra, rb, rc, tol: float = 0.0, refine: int = 2):
        """Solve and score: (a, b, c), relative normal residual, and sums over the mask (float64).

        Up to ``refine`` steps of iterative refinement (residual from the mask structure, not the factor)
        run while the residual exceeds ``tol``; the residual reported is that of the returned solution.
        ``sum_y = sum(yhat)``, ``sum_yy = sum(yhat^2) = theta.N theta``, ``sum_xy = sum(x yhat) = theta.r``.
        """
        r = torch.cat([ra, rb, rc], -1)
        r_norm = torch.linalg.vector_norm(r, dim=-1).clamp(min=1e-300)
        a, b, c = self.solve(ra, rb, rc)
        for step in range(refine + 1):
            n_theta = torch.cat(self.normal(a, b, c), -1)
            resid = torch.linalg.vector_norm(n_theta - r, dim=-1) / r_norm
            if step == refine or float(resid.max()) <= tol:
                break
            da, db, dc = self.solve(*torch.split(r - n_theta, [self.n_delta, self.n_tokens, self.n_tokens], -1))
            a, b, c = a + da, b + db, c + dc
        theta = torch.cat([a, b, c], -1)
        sums = {
            "sum_y": a @ self.cnt_a + b @ self.cnt_b + c @ self.cnt_c,
            "sum_yy": (theta * n_theta).sum(-1),
            "sum_xy": (theta * r).sum(-1),
        }
        return (a, b, c), resid, sums


# ------------------------------------------------------------------------------------ the bound


def band_norms(x: torch.Tensor) -> torch.Tensor:
    """Per-band norms ``||x^(l)||`` of ``x[..., d]``, bands pairing dims l and l + d/2 (method.md section 5)."""
    half = x.shape[-1] // 2
    return torch.hypot(x[..., :half], x[..., half:])


class BoundTable:
    """The bound's per-band factor ``|2 sin(theta_l (delta - D) / 2)|`` per layer, T, window and D (method.md 5).

    Its sum over the counted entries is a causal convolution along tokens per band (``spectrum``, FFT). Entry by
    entry: 'slow' bands keep ``theta_l (delta - D) / 2`` inside (-pi, pi) for every scored delta, where the
    factor is ``sign(delta - D) * 2 sin(theta_l (i - D) / 2 - theta_l j / 2)``, separable, so all slow bands
    together are one matrix product times a sign; 'fast' bands are summed entry by entry through ``fast_factor``
    (band, delta + T). Angles are formed in float64.
    """

    def __init__(self, inv_freq: torch.Tensor, n_tokens: int, window: int, dummy_distance: int, device):
        theta = inv_freq.to(device, torch.float64)
        n_delta = window or n_tokens
        reach = max(dummy_distance, abs(n_delta - 1 - dummy_distance))
        slow = (theta * reach < 2 * math.pi).cpu()
        self.slow, self.fast = torch.nonzero(slow).flatten(), torch.nonzero(~slow).flatten()
        th = theta[self.slow.to(device)]
        pos = torch.arange(n_tokens, device=device, dtype=torch.float64)[:, None]
        x, y = th * (pos - dummy_distance) / 2, th * pos / 2
        # U = a * u_trig, V = b * v_trig (bands repeated twice): U.V = sum 2 a b sin(theta (i - j - D) / 2)
        self.u_trig = torch.cat([2 * torch.sin(x), -2 * torch.cos(x)], -1).float()
        self.v_trig = torch.cat([torch.cos(y), torch.sin(y)], -1).float()
        self.n_tokens, self.dummy_distance = n_tokens, dummy_distance
        delta = torch.arange(-n_tokens, n_tokens + 1, device=device, dtype=torch.float64)
        factor = (2 * torch.sin(theta[:, None] * (delta[None] - dummy_distance) / 2)).abs()  # (band, delta + T)
        self.fast_factor = factor[self.fast.to(device)].float().contiguous()
        self.sign = torch.sign(delta - dummy_distance).float()  # [delta + T]
        kernel = factor[:, n_tokens : n_tokens + n_delta]  # scored distances 0 .. n_delta - 1
        self.spectrum = torch.fft.rfft(kernel, 2 * n_tokens, dim=1).T  # (freq, band)

    def slow_factors(self, a: torch.Tensor, b: torch.Tensor):
        """U (.., T, 2 n_slow) from query factors ``a (.., T, L)``, V (.., T, 2 n_slow) from key factors ``b``."""
        slow = self.slow.to(a.device)
        a_s, b_s = a[..., slow].repeat(*([1] * (a.dim() - 1)), 2), b[..., slow].repeat(*([1] * (b.dim() - 1)), 2)
        return a_s * self.u_trig, b_s * self.v_trig

    def sums(self, a: torch.Tensor, b: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Sum of the bound over the counted entries, float64: ``sum_i a_i . (b * factor)_i`` per band.

        ``a (H, T, L)`` query factors, ``b (H_kv, sink, T, L)`` key factors (a zero row drops its column),
        ``kv (H,)`` the KV head of each query head. Returns (H, sink).
        """
        T = self.n_tokens
        spec = torch.fft.rfft(b.double().transpose(-1, -2), 2 * T) * self.spectrum.T  # along tokens, per band
        conv = torch.fft.irfft(spec, 2 * T)[..., :T]  # (H_kv, sink, L, T)
        return torch.einsum("htl,hslt->hs", a.double(), conv[kv])


# ---------------------------------------------------------------------------------- one (sample, layer)


class Decomposer:
    """Computes every decomposition statistic of one (sample, layer) at a time; caches per-mask work.

    ``dummy_distances`` is the sweep (method.md section 4), ``dummy_distance`` the D of Method A's r, of r_g
    and of the bound, taken inside the window for a sliding-window layer (:func:`used_dummy_distance`); the sweep
    is scored as given on every layer. ``block_elems`` sizes the row blocks of the pass over every entry for the
    error of A and the bound (cache-sized on CPU, large on GPU); ``block`` the token blocks of
    :func:`masked_moments`.
    """

    def __init__(
        self,
        dummy_distances,
        dummy_distance: int,
        device: str = "cpu",
        lstsq_tol: float = LSTSQ_TOL,
        block_elems: int | None = None,
        block: int = 32,
    ):
        self.dummy_distances = [int(D) for D in dummy_distances]
        if not self.dummy_distances:
            raise ValueError("decomposition.dummy_distances: empty")
        self.dummy_distance = int(dummy_distance)
        self.device = resolve_device(device)
        self.lstsq_tol = float(lstsq_tol)
        self.block_elems = block_elems or (2**20 if self.device.type == "cpu" else 2**28)
        self.block = int(block)
        self._designs: dict = {}
        self._tables: dict = {}
        self.max_residual = 0.0

    def design(self, n_tokens: int, window: int, sink: str) -> AdditiveDesign:
        key = (n_tokens, window, sink)
        if key not in self._designs:
            self._designs[key] = AdditiveDesign(n_tokens, window, sink, self.device)
        return self._designs[key]

    def table(self, inv_freq: torch.Tensor, n_tokens: int, window: int, dummy_distance: int) -> BoundTable:
        key = (tuple(inv_freq.tolist()), n_tokens, window, dummy_distance)
        if key not in self._tables:
            self._tables[key] = BoundTable(inv_freq, n_tokens, window, dummy_distance, self.device)
        return self._tables[key]

    def layer_distance(self, rope: LayerRope, n_tokens: int) -> int:
        """The dummy distance of Method A's r, r_g and the bound on this layer (:func:`used_dummy_distance`)."""
        return used_dummy_distance(self.dummy_distance, rope.sliding_window, n_tokens)

    def unit(self, q, k, kv_group, rope: LayerRope, with_bound: bool = True) -> dict[str, np.ndarray]:
        """All statistics of one (sample, layer): q (H, T, d), k (H_kv, T, d) pre-RoPE; arrays per head.

        ``with_bound=False`` skips the error of A and the section 5 bound, the one pass over every entry (and,
        for the bound, every band); their statistics are then NaN.
        """
        ops = self.operands(q, k, kv_group, rope)
        moments = self.moments(ops)
        a = self.method_a(ops, moments)
        b = self.method_b(ops, moments)
        out = {
            "r": torch.stack([a["r"], b["r"]], 1),  # (H, method, sink)
            "r_f": a["r_f"],
            "r_g": a["r_g"],
            "r_sweep": a["r_sweep"],
            "lstsq_residual": b["lstsq_residual"],
            **{name: torch.stack([a[name], b[name]], 1) for name in SUMS},  # (H, method, sink)
        }
        if with_bound:
            out.update(self.error_and_bound(ops))
        else:
            H = ops.q.shape[0]
            for name in ("err_abs_mean", "bound_mean", "bound_slack_min"):
                out[name] = torch.full((H, len(SINKS)), float("nan"), dtype=torch.float64)
        result = {name: value.cpu().numpy().astype(np.float64) for name, value in out.items()}
        if with_bound:
            self.check_bound(ops, result["bound_slack_min"])
        return result

    def operands(self, q, k, kv_group, rope: LayerRope) -> UnitOperands:
        """Checks the shapes and rotates once: method.md section 1 (R_m, s) and section 3A (kbar, R_D)."""
        dev = self.device
        q = (q if torch.is_tensor(q) else torch.from_numpy(np.asarray(q))).to(dev, torch.float32)
        k = (k if torch.is_tensor(k) else torch.from_numpy(np.asarray(k))).to(dev, torch.float32)
        kv_np = np.asarray(kv_group, dtype=np.int64)
        H, T, d = q.shape
        if k.shape[1:] != (T, d) or d % 2 or kv_np.shape != (H,) or kv_np.max() >= k.shape[0] or kv_np.min() < 0:
            raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, kv_group {kv_np.shape}: shapes disagree")
        window = effective_window(T, rope.sliding_window)
        dummy_distance = self.layer_distance(rope, T)
        distances = sorted(set(self.dummy_distances) | {dummy_distance})  # every D the moments are contracted for
        s, amp = float(rope.scaling), float(rope.attention_scaling)
        theta = rope.inv_freq.to(dev, torch.float32)
        pos = torch.arange(T, device=dev)

        k64 = k.double()
        kbar = k64.mean(1)  # (H_kv, d)
        kbar_wo = k64[:, 1:].mean(1)  # (H_kv, d), sink dropped

        def rotated_const(v):  # (H_kv, d) -> R_j v for every j: (H_kv, T, d)
            return rotate(v.float()[:, None].expand(-1, T, -1), pos, theta, amp)

        k_rot = rotate(k, pos, theta, amp)
        keys = torch.cat(
            [k_rot, rotated_const(kbar), rotated_const(kbar_wo - kbar), (k64 - kbar[:, None]).float() * amp],
            -1,
        )
        eye = torch.eye(d, device=dev)
        # rotate() turns each row, so the rotated identity is R_D^T; transposed, R_D (nD, d, d)
        rotations = torch.stack([rotate(eye, torch.tensor(D), theta).T for D in distances])
        return UnitOperands(
            q=q,
            k=k,
            k64=k64,
            kv=torch.as_tensor(kv_np, device=dev),
            groups=KVGroups(kv_np, dev),
            rope=rope,
            theta=theta,
            window=window,
            counts={sink: MaskInfo(T, window).count(sink) for sink in SINKS},
            kbar=kbar,
            kbar_wo=kbar_wo,
            shift=(kbar - kbar_wo) * amp,
            q_rot=rotate(q, pos, theta, amp) * s,
            q0=q * (s * amp),
            k_rot=k_rot,
            keys=keys,
            rotations=rotations,
            dummy_distance=dummy_distance,
            distances=distances,
        )

    def moments(self, ops: UnitOperands) -> dict:
        """Sums and second moments of x = W, f and every g_D over the counted entries, per sink and head.

        method.md sections 3A (f, g_D) and 4 (with and without the sink column): :func:`masked_moments`
        over the 'with' mask, then :func:`moments_by_sink`. No (T x T) matrix; one KV head at a time keeps
        the working set small (and on a CPU, below malloc's mmap threshold). Returns
        ``{sink: {s_x, s_f, s_g, s_xx, s_xf, s_ff, s_xg, s_fg, s_gg}}``, each (H,) or (nD, H).
        """
        groups = ops.groups
        # converted to float64 once, not per KV head
        q_kv = groups.by_kv(ops.q_rot).double()  # (H_kv, h, T, d)
        q0_kv = groups.by_kv(ops.q0).double()  # (H_kv, h, T, d)
        rot64 = ops.rotations.double()  # (nD, d, d)
        chunks = []
        for i in range(len(groups.used)):
            one = groups.used[i : i + 1]  # this KV head, as a length-1 index
            part = masked_moments(q_kv[i : i + 1], q0_kv[i : i + 1], rot64, ops.keys[one], ops.window, self.block)
            r_shift = torch.einsum("Dfe,nf->neD", rot64, ops.shift[one])  # (1, d, nD): R_D^T shift
            gamma = q0_kv[i : i + 1] @ r_shift[:, None]  # (1, h, T, nD)
            gamma = gamma.permute(3, 0, 1, 2)  # (nD, 1, h, T)
            chunks.append(moments_by_sink(part, gamma, ops.window))
        return {
            sink: {name: groups.to_heads(torch.cat([c[sink][name] for c in chunks], -2)) for name in chunks[0][sink]}
            for sink in SINKS
        }

    def method_a(self, ops: UnitOperands, moments: dict) -> dict:
        """Method A's r and sums (method.md sections 3A and 4): r(W, f + g_D) for the sweep and the dummy
        distance, r(W, f) and r(W, g_D) alone, by ``pearson_from_sums``.

        Returns (H, sink) arrays ``r``, ``r_f``, ``r_g`` and :data:`SUMS` of A = f + g_D at the dummy distance,
        and ``r_sweep`` (H, sink, D).
        """
        i_dummy = ops.distances.index(ops.dummy_distance)
        i_sweep = [ops.distances.index(D) for D in self.dummy_distances]
        cols = {name: [] for name in ("r", "r_f", "r_g", "r_sweep", *SUMS)}
        for sink in SINKS:
            m, n = moments[sink], ops.counts[sink]
            s_y = m["s_f"] + m["s_g"]  # (nD, H): y = A = f + g_D
            s_yy = m["s_ff"] + 2 * m["s_fg"] + m["s_gg"]
            s_xy = m["s_xf"] + m["s_xg"]
            r_all = pearson_from_sums(n, m["s_x"], s_y, m["s_xx"], s_yy, s_xy)  # (nD, H)
            cols["r"].append(r_all[i_dummy])
            cols["r_sweep"].append(r_all[i_sweep].T)  # (H, D)
            cols["r_f"].append(pearson_from_sums(n, m["s_x"], m["s_f"], m["s_xx"], m["s_ff"], m["s_xf"]))
            cols["r_g"].append(
                pearson_from_sums(n, m["s_x"], m["s_g"][i_dummy], m["s_xx"], m["s_gg"][i_dummy], m["s_xg"][i_dummy])
            )
            sums = {
                "n": torch.full_like(m["s_x"], n),
                "sum_x": m["s_x"],
                "sum_y": s_y[i_dummy],
                "sum_xx": m["s_xx"],
                "sum_yy": s_yy[i_dummy],
                "sum_xy": s_xy[i_dummy],
            }
            for name in SUMS:
                cols[name].append(sums[name])
        out = {name: torch.stack(parts, -1) for name, parts in cols.items() if name != "r_sweep"}  # (H, sink)
        out["r_sweep"] = torch.stack(cols["r_sweep"], 1)  # (H, sink, D)
        return out

    def method_b(self, ops: UnitOperands, moments: dict) -> dict:
        """Method B (method.md section 3B): the exact least-squares fit ``W_ij ~ a(i-j) + b(i) + c(j)`` per head
        and sink, its r (section 4) and sums, and the relative normal residual of the solve.

        The fit runs on x = W - mean(W) for conditioning (all heads in one solve, from the diagonal, row and column
        sums of :func:`w_sums`); its sums are shifted back to W. Raises if the residual exceeds ``lstsq_tol``.
        Returns (H, sink) arrays ``r``, ``lstsq_residual`` and :data:`SUMS`.
        """
        groups, T = ops.groups, ops.q.shape[1]
        mu_w = moments["with"]["s_x"] / ops.counts["with"]  # (H,) the mean of W
        w_parts = w_sums(
            groups.by_kv(ops.q_rot),  # (H_kv, h, T, d)
            ops.k_rot[groups.used, None],  # (H_kv, 1, T, d)
            ops.window,
            mu_w[groups.order].view(len(groups.used), -1),  # (H_kv, h)
        )
        b_sums = [groups.to_heads(part.permute(2, 0, 1)).T for part in w_parts]  # diag, rows, cols, col0: (H, T)
        cols = {name: [] for name in ("r", "lstsq_residual", *SUMS)}
        for sink in SINKS:
            m, n = moments[sink], ops.counts[sink]
            design = self.design(T, ops.window, sink)
            _, resid, bs = design.fit(*design.rhs(b_sums), tol=self.lstsq_tol * 1e-3)  # bs: sums of x, yhat
            worst = float(resid.max())
            self.max_residual = max(self.max_residual, worst)
            if not worst < self.lstsq_tol:
                raise RuntimeError(
                    f"additive fit: relative normal residual {worst:.3g} above tolerance "
                    f"{self.lstsq_tol:.3g} (T={T}, window={ops.window}, sink={sink})"
                )
            # y = yhat + mu_w: sums of y and of x y from those of yhat and x - mu_w
            sums = {
                "n": torch.full_like(mu_w, n),
                "sum_x": m["s_x"],
                "sum_xx": m["s_xx"],
                "sum_y": bs["sum_y"] + n * mu_w,
                "sum_yy": bs["sum_yy"] + 2 * mu_w * bs["sum_y"] + n * mu_w * mu_w,
                "sum_xy": bs["sum_xy"] + mu_w * (bs["sum_y"] + m["s_x"]),
            }
            cols["r"].append(
                pearson_from_sums(n, sums["sum_x"], sums["sum_y"], sums["sum_xx"], sums["sum_yy"], sums["sum_xy"])
            )
            cols["lstsq_residual"].append(resid)
            for name in SUMS:
                cols[name].append(sums[name])
        return {name: torch.stack(parts, -1) for name, parts in cols.items()}  # (H, sink)

    def error_and_bound(self, ops: UnitOperands) -> dict:
        """The error of A and the bound of method.md section 5, entry by entry, per head and sink.

        ``E = W - f - g = [q_rot | p_D] . [R_j (k_j - kbar) | -R_0 (k_j - kbar)]`` and the bound
        ``s sum_l a_il b_jl |2 sin(theta_l (i - j - D) / 2)|`` with ``a = |q^(l)|``, ``b = |k^(l) - kbar^(l)|``
        (0 for a dropped column). Returns (H, sink) float64 ``err_abs_mean`` (mean |E|), ``bound_mean`` and
        ``bound_slack_min`` (min of bound - |E|).
        """
        dev, f64 = self.device, torch.float64
        groups, rope = ops.groups, ops.rope
        T, d = ops.q.shape[1:]
        s, amp = float(rope.scaling), float(rope.attention_scaling)
        used = groups.used
        a_norm = band_norms(ops.q) * (s * amp * amp)  # (H, T, L)
        b_norm = torch.stack([band_norms((ops.k64 - mean[:, None]).float()) for mean in (ops.kbar, ops.kbar_wo)], 1)
        b_norm[:, SINKS.index("without"), 0] = 0  # (H_kv, sink, T, L)
        counts = torch.tensor([ops.counts[sink] for sink in SINKS], device=dev, dtype=f64)  # (sink,)
        table = self.table(rope.inv_freq, T, ops.window, ops.dummy_distance)
        kx, kf, kphi, kg = ops.keys[used].split(d, -1)  # (H_kv, T, d) each
        e_with = torch.cat([kx - kf, -kg], -1)  # (H_kv, T, 2d)
        e_without = torch.cat([kx - kf - kphi, -kg - ops.shift[used, None].float()], -1)  # (H_kv, T, 2d)
        e_keys = torch.stack([e_with, e_without], 1)  # (H_kv, sink, T, 2d)
        e_keys[:, 1, 0] = 0  # 'without' drops column 0
        p_dummy = rotate(ops.q, torch.tensor(ops.dummy_distance), ops.theta, amp) * s  # (H, T, d) s R_D q_i
        err_sum, slack_min = self._error_pass(
            groups.by_kv(torch.cat([ops.q_rot, p_dummy], -1)),  # (H_kv, h, T, 2d)
            e_keys,
            groups.by_kv(a_norm),  # (H_kv, h, T, L)
            b_norm[used],
            table,
            ops.window,
        )  # (H_kv, h, sink) each
        err_sum = groups.to_heads(err_sum.permute(2, 0, 1)).T  # (H, sink)
        slack_min = groups.to_heads(slack_min.permute(2, 0, 1)).T  # (H, sink)
        return {
            "err_abs_mean": err_sum / counts,
            "bound_mean": table.sums(a_norm, b_norm, ops.kv) / counts,
            "bound_slack_min": slack_min.double(),
        }

    def check_bound(self, ops: UnitOperands, slack_min: np.ndarray) -> None:
        """Raises unless the bound of method.md section 5 holds: ``slack_min (H, sink)`` >= -tolerance.

        float32 error carries rounding of order eps * s |q| |k| sqrt(d): the tolerance is ``BOUND_RTOL`` times
        ``s |q|max |k|max`` per head.
        """
        rope = ops.rope
        s, amp = float(rope.scaling), float(rope.attention_scaling)
        q_max = ops.q.norm(dim=-1).amax(-1)  # (H,)
        k_max = ops.k.norm(dim=-1).amax(-1)[ops.kv]  # (H,)
        scale = s * amp * amp * q_max * k_max  # (H,)
        tol = (BOUND_RTOL * scale.double()[:, None]).cpu().numpy()
        worst = slack_min + tol
        if (worst < 0).any():
            h_bad, s_bad = np.unravel_index(int(np.argmin(worst / tol)), worst.shape)
            raise RuntimeError(
                f"bound of method.md section 5 violated: head {h_bad}, sink {SINKS[s_bad]}, min(bound - |error|) = "
                f"{slack_min[h_bad, s_bad]:.3g} below the rounding tolerance -{tol[h_bad, 0]:.3g}"
            )

    def _error_pass(self, e_queries, e_keys, a, b, table: BoundTable, window: int):
        """Per query head and sink: sum over the counted entries of |W - A|, and min (bound - |W - A|).

        Per KV head: ``e_queries (n, h, T, 2d)``, ``e_keys (n, sink, T, 2d)``, bound factors ``a (n, h, T, L)`` and
        ``b (n, sink, T, L)``. Returns (n, h, sink) each. The one pass over (T x T) entries, in row blocks that
        keep the working set in cache. In a block the columns are taken in reverse order, where a Toeplitz
        factor f(i - j) becomes a Hankel view of one stored vector. Slow bands of the bound: one matrix product
        times sign(i - j - D); fast bands: per row, one product of the query factors with the Hankel factors
        times the key factors. Layout (row, head, sink, column). method.md section 5.
        """
        dev = self.device
        n, h, T, _ = e_queries.shape
        nf, stride = len(table.fast), 2 * T + 1
        fast = table.fast.to(dev)
        err_sum = torch.zeros(n, h, 2, dtype=torch.float64, device=dev)
        slack_min = torch.full((n, h, 2), float("inf"), device=dev)
        u, v = table.slow_factors(a, b)  # (n, h, T, 2 n_slow), (n, sink, T, 2 n_slow)
        # rows first; keys in reversed token order
        q_rows, u_rows = e_queries.transpose(1, 2).contiguous(), u.transpose(1, 2).contiguous()
        a_rows = a[..., fast].transpose(1, 2).contiguous()  # (n, T, h, nf)
        k_rev, v_rev = e_keys.flip(2), v.flip(2)
        b_rev = b[..., fast].flip(2).permute(0, 3, 1, 2).contiguous()  # (n, nf, sink, T)
        rows = max(1, min(T, self.block_elems // (2 * T * max(h, nf))))
        for i0 in range(0, T, rows):
            i1 = min(T, i0 + rows)
            j0 = max(0, i0 - window + 1) if window else 0
            t, w = i1 - i0, i1 - j0
            ii = torch.arange(i0, i1, device=dev)[:, None]
            jj = torch.arange(i1 - 1, j0 - 1, -1, device=dev)[None, :]  # reversed columns
            keep = jj <= ii
            if window:
                keep &= ii - jj < window
            keep = torch.stack([keep, keep & (jj > 0)], 1)[:, None]  # (t, 1, sink, w)
            keep_f, drop = keep.float(), ~keep
            base = i0 - i1 + 1 + T  # [r, u] -> delta + T = base + r + u
            rev = slice(T - i1, T - j0)  # columns i1 - 1 down to j0 in reversed token order
            sign = table.sign.as_strided((t, 1, 1, w), (1, 0, 0, 1), base)
            hank = table.fast_factor.as_strided((t, nf, 1, w), (1, stride, 0, 1), base)
            factors = torch.empty(t, nf, 2, w, device=dev)
            for g in range(n):
                q_block = q_rows[g, i0:i1].view(t * h, -1)  # ((row, head), 2d)
                k_block = k_rev[g, :, rev].reshape(2 * w, -1)  # ((sink, column), 2d)
                err = torch.mm(q_block, k_block.T)  # ((row, head), (sink, column)): W - A
                err = err.view(t, h, 2, w).abs_().mul_(keep_f)  # |W - A|, 0 where not counted
                err_sum[g] += err.sum((0, 3)).double()  # a block's float32 sum is exact enough
                u_block = u_rows[g, i0:i1].view(t * h, -1)  # ((row, head), 2 n_slow)
                v_block = v_rev[g, :, rev].reshape(2 * w, -1)  # ((sink, column), 2 n_slow)
                bound = torch.mm(u_block, v_block.T)  # ((row, head), (sink, column)): slow bands, unsigned
                bound = bound.view(t, h, 2, w).mul_(sign)
                bound = bound.view(t, h, 2 * w)  # (row, head, (sink, column))
                torch.mul(hank, b_rev[g, :, :, rev], out=factors)  # (row, band, sink, column)
                bound = torch.baddbmm(bound, a_rows[g, i0:i1], factors.view(t, nf, 2 * w))  # plus the fast bands
                bound = bound.view(t, h, 2, w)  # (row, head, sink, column)
                slack = bound.sub_(err).masked_fill_(drop, float("inf"))
                slack_min[g] = torch.minimum(slack_min[g], slack.amin((0, 3)))
        return err_sum, slack_min


class KVGroups:
    """Query heads grouped by the KV head they read (GQA); every KV head serves the same number of query heads."""

    def __init__(self, kv_group: np.ndarray, device):
        used, per_kv = np.unique(kv_group, return_counts=True)
        if (per_kv != per_kv[0]).any():
            raise ValueError(f"kv_group {kv_group.tolist()}: every KV head must serve the same number of query heads")
        self.n_heads = len(kv_group)
        self.per_kv = int(per_kv[0])
        self.order = torch.as_tensor(np.argsort(kv_group, kind="stable"), device=device)  # query heads by KV head
        self.used = torch.as_tensor(used, device=device)  # (kv_head,) the KV heads that some query head reads

    def by_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(..., head, token, e) -> (..., kv_head, h, token, e): the h query heads of each KV head together."""
        x = x[..., self.order, :, :]
        return x.reshape(*x.shape[:-3], len(self.used), self.per_kv, *x.shape[-2:])

    def to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(..., kv_head, h) -> (..., head), in the original head order."""
        out = torch.empty(x.shape[:-2] + (self.n_heads,), dtype=x.dtype, device=x.device)
        out[..., self.order] = x.reshape(*x.shape[:-2], self.n_heads)
        return out


@dataclass(frozen=True)
class UnitOperands:
    """One (sample, layer), rotated once (method.md sections 1 and 3A); shapes in the comments.

    H query heads, H_kv KV heads, T tokens, d dims, nD dummy distances (``distances``). ``kbar`` is
    the mean key, ``kbar_wo`` the mean key over tokens 1..T-1 (sink 'without').
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
    keys: torch.Tensor  # (H_kv, T, 4 d) [R_j k_j | R_j kbar | R_j (kbar' - kbar) | R_0 (k_j - kbar)]
    rotations: torch.Tensor  # (nD, d, d) R_D, without attention_scaling
    dummy_distance: int  # this layer's D of Method A's r, r_g and the bound (Decomposer.layer_distance)
    distances: list  # the nD dummy distances of ``rotations``: the sweep and ``dummy_distance``, ascending


# ------------------------------------------------------------------------------------------ the store


def layer_rope(ds: xr.Dataset, layer: int) -> LayerRope:
    return LayerRope(
        inv_freq=torch.as_tensor(np.asarray(ds["inv_freq"].isel(layer=layer).values, dtype=np.float32)),
        scaling=float(ds["scaling"].isel(layer=layer)),
        attention_scaling=float(ds["attention_scaling"].isel(layer=layer)),
        sliding_window=int(ds["sliding_window"].isel(layer=layer)),
    )


def _check_store(ds: xr.Dataset, path) -> None:
    need = ["q", "k", "inv_freq", "attention_scaling", "scaling", "sliding_window", "kv_group"]
    missing = [v for v in need if v not in ds]
    if missing:
        raise KeyError(f"{path}: missing variable(s) {', '.join(missing)}")


class DecompositionTable:
    """The statistics of :meth:`Decomposer.unit`, (sample, layer) unit by unit, and the decomposition.nc they make.

    ``rope`` is a dataset with qk.h5's per-layer RoPE variables (``inv_freq``, ``scaling``, ``attention_scaling``,
    ``sliding_window``, ``kv_group``): qk.h5 itself (the store path) or :func:`posgen.fused.rope_dataset` (the
    fused path); ``samples`` the windows' global indices. The error of A and the bound run on windows with a
    global index below ``bound_samples`` (0: all), so every shard of a sharded run agrees with the unsharded one.
    """

    def __init__(self, dec: Decomposer, rope: xr.Dataset, samples, n_tokens: int, bound_samples: int = 0):
        self.dec = dec
        self.rope = rope
        self.samples = np.asarray(samples, dtype=np.int64)
        self.n_tokens = int(n_tokens)
        self.bound_samples = int(bound_samples)
        self.kv_group = rope["kv_group"].values
        self.layers = [layer_rope(rope, layer) for layer in range(rope.sizes["layer"])]
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, sample: int, layer: int, q, k) -> None:
        """One unit: window ``sample`` (global index), q (H, T, d) and k (H_kv, T, d) of ``layer``, pre-RoPE."""
        with_bound = not self.bound_samples or sample < self.bound_samples
        result = self.dec.unit(q, k, self.kv_group, self.layers[layer], with_bound=with_bound)
        position = int(np.flatnonzero(self.samples == sample)[0])
        for name, value in result.items():
            if name not in self.arrays:
                self.arrays[name] = np.full((len(self.samples), len(self.layers)) + value.shape, np.nan)
            self.arrays[name][position, layer] = value

    def dataset(self, attrs: dict) -> xr.Dataset:
        """decomposition.nc (docs/data-model.md); ``attrs`` are added to the provenance."""
        dec, n_samples = self.dec, len(self.samples)
        used = np.array([dec.layer_distance(rope, self.n_tokens) for rope in self.layers], dtype=np.int64)
        coords = {
            "sample": self.samples,
            "layer": self.rope["layer"].values,
            "head": self.rope["head"].values,
            "method": list(METHODS),
            "sink": list(SINKS),
            "D": np.asarray(dec.dummy_distances, dtype=np.int64),
            # per layer, carried along by every variable with a layer dim: what the statistics split by and scored at
            "layer_type": ("layer", layer_types(self.rope)),
            "dummy_distance_used": ("layer", used),
        }
        base = ("sample", "layer", "head")
        dims = {
            "r": base + ("method", "sink"),
            "r_f": base + ("sink",),
            "r_g": base + ("sink",),
            "r_sweep": base + ("sink", "D"),
            "err_abs_mean": base + ("sink",),
            "bound_mean": base + ("sink",),
            "bound_slack_min": base + ("sink",),
            "lstsq_residual": base + ("sink",),
            **{name: base + ("method", "sink") for name in SUMS},
        }
        data = {name: (dims[name], self.arrays[name]) for name in dims}
        data["r2_f"] = (dims["r_f"], self.arrays["r_f"] ** 2)
        data["r2_g"] = (dims["r_g"], self.arrays["r_g"] ** 2)
        bound_samples = int((self.samples < self.bound_samples).sum()) if self.bound_samples else n_samples
        return xr.Dataset(
            data,
            coords=coords,
            attrs=provenance(
                dummy_distance=int(dec.dummy_distance),
                lstsq_tol=float(dec.lstsq_tol),
                bound_samples=bound_samples,
                lstsq_residual_max=float(dec.max_residual),
                device=str(dec.device),
                **attrs,
            ),
        )


def decompose_store(
    qk_path,
    out_path,
    *,
    dummy_distances,
    dummy_distance: int,
    device: str = "auto",
    lstsq_tol: float = LSTSQ_TOL,
    bound_samples: int = 0,
    config_hash: str = "",
    progress: bool = True,
) -> xr.Dataset:
    """decomposition.nc from qk.h5, one (sample, layer) at a time (see docs/data-model.md); the store path.

    Every layer carries its ``layer_type`` (:func:`layer_types`) and ``dummy_distance_used`` (the D of its
    Method A r, r_g and bound: :func:`used_dummy_distance`) as coordinates; ``r_sweep`` is the raw sweep.

    The error of A and the section 5 bound (checked entry by entry) are evaluated on the windows with a global
    index below ``bound_samples`` (0: all); elsewhere their statistics are NaN. Every r statistic covers every
    sample.
    """
    # without dask: xarray's lazy indexing reads exactly the (sample, layer) slice asked for
    ds = open_dataset(qk_path, lazy=False)
    _check_store(ds, qk_path)
    dec = Decomposer(dummy_distances, dummy_distance, device=device, lstsq_tol=lstsq_tol)
    table = DecompositionTable(dec, ds, ds["sample"].values, ds.sizes["token"], bound_samples)
    units = [(s_, l_) for s_ in range(ds.sizes["sample"]) for l_ in range(ds.sizes["layer"])]
    label = f"decompose {ds.attrs.get('model', '')}/{ds.attrs.get('variant', '')}"
    for s_, l_ in tqdm(units, desc=label, unit="layer", disable=not progress):
        q = ds["q"].isel(sample=s_, layer=l_).values
        k = ds["k"].isel(sample=s_, layer=l_).values
        table.add(int(table.samples[s_]), l_, q, k)
    out = table.dataset({"config_hash": config_hash, "analysis": "store", "source": str(qk_path), **carried_attrs(ds)})
    ds.close()
    write_netcdf(out, out_path)
    return out


# ------------------------------------------------------------------------------ Toeplitz shares


def toeplitz_shares(logits: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Variance shares of the best ``a(i-j)`` and of the best ``a(i-j) + b(i) + c(j)`` fit of logit matrices.

    ``logits (..., T, T)``; with ``causal`` only the entries j <= i count, else all (bidirectional). Shares are
    ``1 - SSE / SST`` over the counted entries, float64, shaped ``logits.shape[:-2]``; NaN for a constant
    matrix. The best Toeplitz fit is the mean of each diagonal; the additive fit is :class:`AdditiveDesign`.
    """
    T = logits.shape[-1]
    lead = logits.shape[:-2]
    design = AdditiveDesign(T, 0, "with", logits.device, causal=causal)
    mask = causal_mask(T, 0, logits.device) if causal else torch.ones(T, T, dtype=torch.bool, device=logits.device)
    n = mask.sum().double()
    w = logits.reshape(-1, T, T).double() * mask  # (m, T, T), zero outside the mask
    # shares are shift invariant; centring keeps the sums of squares below from cancelling
    w = (w - (w.sum((-1, -2)) / n)[:, None, None]) * mask
    sst = (w * w).sum((-1, -2))  # (m,)
    diag = torch.stack([torch.diagonal(w, -d, dim1=-2, dim2=-1).sum(-1) for d in design.deltas.tolist()], -1)
    rows, cols, col0 = w.sum(-1), w.sum(-2), w[..., :, 0]  # (m, T) each
    # diagonal means: explained sum of squares sum_delta (diagonal sum)^2 / count (the overall mean is 0)
    toeplitz_ss = (diag * diag / design.cnt_a.clamp(min=1)).sum(-1)  # (m,)
    _, _, sums = design.fit(*design.rhs((diag, rows, cols, col0)))
    additive_ss = sums["sum_yy"] - sums["sum_y"] ** 2 / n  # (m,)
    nan = torch.full_like(sst, float("nan"))
    positive = sst > 1e-300
    toeplitz = torch.where(positive, toeplitz_ss / sst.clamp(min=1e-300), nan)
    additive = torch.where(positive, additive_ss / sst.clamp(min=1e-300), nan)
    return toeplitz.reshape(lead), additive.reshape(lead)
