"""Sums and second moments of W, f and every g_D over the counted entries, without (T x T) matrices
(docs/method.md sections 3A and 4).

Every x in {W, f, phi, g_D} is a rank-d matrix ``x_ij = a_i . u_j``, so ``sum_ij x_ij y_ij = sum_j u_j^T (sum_i
a_i b_i^T) v_j`` over the counted (i, j): :func:`masked_moments` over the 'with' mask, then
:func:`moments_by_sink` for both sink handlings (dropping the sink column is an O(T) correction).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from posgen.decomposition.mask import window_prefix


@dataclass(frozen=True)
class MaskedMoments:
    """What :func:`masked_moments` returns, float64: sums over the counted entries of ``x_a`` (a key set K_a) and
    ``g_D`` (a dummy distance D) and of their products, their row sums and key column 0 (0 where it does not
    count), for n KV heads with h query heads each."""

    qq: torch.Tensor  # (n, h, a, b): sum x_a x_b
    qg: torch.Tensor  # (D, n, h, a): sum x_a g_D
    gg: torch.Tensor  # (D, n, h): sum g_D^2
    q_rows: torch.Tensor  # (n, h, a, T): row sums of x_a
    g_rows: torch.Tensor  # (D, n, h, T): row sums of g_D
    q_col0: torch.Tensor  # (n, h, a, T): x_a in key column 0
    g_col0: torch.Tensor  # (D, n, h, T): g_D in key column 0
    # (n, b, h, a | D, r, j): x_a and g_D at the ragged entries of Blocks.ragged (0 where not counted), for the
    # low-rank terms of posgen.decomposition.drift, which need the same values
    ragged: torch.Tensor


@dataclass(frozen=True)
class Moments:
    """Sums over the counted entries of one sink handling of x = W, f, g_D and their products, per query head
    (``(..., H)``; the g terms ``(D, ..., H)``, one per dummy distance)."""

    s_x: torch.Tensor
    s_f: torch.Tensor
    s_g: torch.Tensor
    s_xx: torch.Tensor
    s_xf: torch.Tensor
    s_ff: torch.Tensor
    s_xg: torch.Tensor
    s_fg: torch.Tensor
    s_gg: torch.Tensor


MOMENT_NAMES = tuple(field.name for field in fields(Moments))


def _by_block(x: torch.Tensor, block: int) -> torch.Tensor:
    """(g, n, T, e) -> (g, nb, n * block, e): tokens in blocks of ``block`` (zero-padded), the n sets stacked."""
    g, n, T, e = x.shape
    nb = -(-T // block)
    x = torch.nn.functional.pad(x, (0, 0, 0, nb * block - T))  # (g, n, (nb, block), e)
    x = x.view(g, n, nb, block, e)
    x = x.transpose(1, 2)  # (g, nb, n, block, e)
    return x.reshape(g, nb, n * block, e)


class Blocks:
    """Token blocks of ``block`` rows: which key blocks each query block counts in full, and which key columns
    it takes one by one (the diagonal block and, with a window, its ragged start)."""

    def __init__(self, n_tokens: int, window: int, block: int, device):
        self.window, self.block = window, block
        self.nb = nb = -(-n_tokens // block)
        self.rows = torch.arange(nb * block, device=device).view(nb, block)
        self.lo = (self.rows - window + 1).clamp(min=0) if window else torch.zeros_like(self.rows)
        self.b_idx = torch.arange(nb, device=device)
        # query block b counts key blocks [full_lo, b) in full: from the first block boundary at or after its last
        # row's window start; so key block c is counted in full by query blocks c < b <= last[c] (full_lo ascends)
        self.full_lo = torch.minimum(-(-self.lo[:, -1] // block), self.b_idx)
        self.last = torch.searchsorted(self.full_lo, self.b_idx, right=True) - 1  # >= c, as full_lo[c] <= c

    def ragged(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The key columns each query block takes one by one, ``cols (b, j)`` (negative: none), and which of its
        entries count, ``valid (b, r, j)``: the diagonal block and, with a window, the ragged start before the
        first key block it counts in full."""
        block, dev = self.block, self.rows.device
        edge = 2 * block if self.window else 0
        cols = torch.cat(
            [
                self.full_lo[:, None] * block - edge + torch.arange(edge, device=dev),
                self.b_idx[:, None] * block + torch.arange(block, device=dev),
            ],
            1,
        )  # (b, j)
        valid = (
            (cols[:, None, :] <= self.rows[:, :, None])
            & (cols[:, None, :] >= self.lo[:, :, None])
            & (cols >= 0)[:, None]
        )
        valid[:, :, :edge] &= (cols[:, :edge] < self.full_lo[:, None] * block)[:, None]
        return cols, valid

    def over_full(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Per key block c: sum of x over the query blocks c < b <= last[c], along dim."""
        nb = self.nb
        acc = torch.cat([x, torch.zeros_like(x.narrow(dim, 0, 1))], dim)
        for b in range(nb - 1, -1, -1):  # suffix sums; a loop of adds beats torch.cumsum on CPU
            acc.select(dim, b).add_(acc.select(dim, b + 1))
        if not self.window:
            return acc.narrow(dim, 1, nb)
        return acc.index_select(dim, self.b_idx + 1) - acc.index_select(dim, self.last + 1)


def masked_moments(
    q: torch.Tensor, q0: torch.Tensor, rotations: torch.Tensor, keys: torch.Tensor, window: int, block: int = 32
) -> MaskedMoments:
    """Sums over the counted entries of ``x_a = q Ka^T`` and ``g_D = (q0 R_D^T) Kg^T`` and of their products.

    ``q, q0 (n, h, T, d)``: n KV heads with h query heads each; ``rotations (nD, d, d)``, the R_D
    (block-diagonal per RoPE band, dims l and l + d/2); ``keys (n, T, (k + 1) d) = [K1 | ... | Kk | Kg]``.
    Returns float64 sums of products, row sums and column 0 (:class:`MaskedMoments`), so that sums without
    column 0 follow in O(T).

    No (T x T) matrix: ``sum_ij (a_i.u_j)(b_i.v_j) = sum_j u_j^T (sum_i a_i b_i^T) v_j``. Tokens go in blocks;
    a key block that a query block counts in full enters through the query block's Gram matrices, summed
    over every such query block; the rest (the diagonal block and, with a window, its ragged start: under 3
    blocks) through explicit products, masked. The dummy distance enters only through R_D, so the g terms
    are contracted once for every D (for g^2, per pair of bands). Everything in float64: raw second moments
    then need no shifting against cancellation. method.md sections 3A (Method A's terms) and 4 (the sums).

    Index names in the shape comments: a, b key sets K_a (a = k: Kg); D dummy distances; e, f dims; l, m bands
    and x, y, z, w in {0, 1} the two dims (l and l + d/2) of a band; b query blocks, c key blocks, r rows of a
    block; j ragged key columns.
    """
    f64 = torch.float64
    q, q0, rotations, keys = q.to(f64), q0.to(f64), rotations.to(f64), keys.to(f64)
    T = q.shape[2]
    q_rows, g_rows, q_col0, g_col0 = _rows_and_column0(q, q0, rotations, keys, window)
    blocks = Blocks(T, window, block, q.device)
    qb = _by_block(q, block)  # (n, b, (h, r), e)
    q0b = _by_block(q0, block)  # (n, b, (h, r), e)
    kp = torch.nn.functional.pad(keys, (0, 0, 0, blocks.nb * block - T))  # (n, (c, r), (k + 1) d), zero-padded
    qq, qg, gg = _full_blocks(qb, q0b, kp, rotations, blocks)
    ragged = _add_ragged(qq, qg, gg, qb, q0b, kp, rotations, blocks)
    return MaskedMoments(qq=qq, qg=qg, gg=gg, q_rows=q_rows, g_rows=g_rows, q_col0=q_col0, g_col0=g_col0, ragged=ragged)


def _rows_and_column0(q, q0, rotations, keys, window: int):
    """Row sums of every x_a and g_D from prefix sums of the keys, and their key column 0 where it counts."""
    n, h, T, d = q.shape
    k = keys.shape[-1] // d - 1
    nD = rotations.shape[0]
    Q, G = slice(0, k * d), slice(k * d, (k + 1) * d)
    rot_t = rotations.transpose(0, 1).reshape(d, nD * d)  # (f, (D, e)): u @ rot_t = R_D^T u for every D
    nd = window or T
    # g_D rows: (R_D q0_i) . u = q0_i . (R_D^T u)
    pre = window_prefix(keys, window, dim=1)  # (n, T, (k + 1) d): sum of the keys that row i counts
    pre_q = pre[:, None, :, Q].reshape(n, 1, T, k, d)  # (n, 1, T, a, e)
    pre_g = pre[..., G] @ rot_t  # (n, T, (D, e))
    pre_g = pre_g.view(n, 1, T, nD, d)  # (n, 1, T, D, e): R_D^T u
    q_rows = (q[:, :, :, None] * pre_q).sum(-1)  # (n, h, T, a)
    g_rows = (q0[:, :, :, None] * pre_g).sum(-1)  # (n, h, T, D)
    del pre_q  # temporaries go as soon as they are used: the working set stays small
    counts0 = (torch.arange(T, device=q.device) < nd).to(torch.float64)[:, None]  # (T, 1): rows that count column 0
    k0_q = keys[:, None, 0, Q].reshape(n, 1, k, d)  # (n, 1, a, e): key column 0
    k0_g = torch.einsum("Dfe,nf->nDe", rotations, keys[:, 0, G])  # (n, D, e): R_D^T kg_0
    q_col0 = (q @ k0_q.transpose(-1, -2)) * counts0  # (n, h, T, a)
    g_col0 = (q0 @ k0_g[:, None].transpose(-1, -2)) * counts0  # (n, h, T, D)
    # (n, h, a, T), (D, n, h, T) each
    return q_rows.transpose(2, 3), g_rows.permute(3, 0, 1, 2), q_col0.transpose(2, 3), g_col0.permute(3, 0, 1, 2)


def _full_blocks(qb, q0b, kp, rotations, blocks: Blocks):
    """qq, qg, gg over the key blocks that query blocks count in full: the query blocks' Gram matrices of
    [q | q0], summed over the query blocks that count each key block, times the keys."""
    n, nb, hr, d = qb.shape
    block = blocks.block
    h = hr // block
    k = kp.shape[-1] // d - 1
    nD, L = rotations.shape[0], d // 2
    r_flat = rotations.reshape(nD, d * d)  # (D, (f, e)): R_D[f, e]
    # query side: per block and head the Gram matrix of [q | q0], summed over the query blocks
    z = torch.cat([qb, q0b], -1)  # (n, b, (h, r), 2d): [q | q0]
    z = z.view(n * nb * h, block, 2 * d)  # ((n, b, h), r, 2d)
    s = torch.bmm(z.transpose(1, 2).contiguous(), z)  # ((n, b, h), 2d, 2d) (strided operands are slow)
    s = s.view(n, nb, h, 2 * d, 2 * d)  # (n, b, h, q | q0 e, q | q0 e')
    # q against [q | q0], for the q rows and q g terms
    s_q = s[:, :, :, :d]  # (n, b, h, e, 2d)
    s_q = s_q.reshape(n, nb, h, d, 2, d)  # (n, b, h, e, q | q0, e')
    s_q = s_q.permute(0, 1, 3, 4, 2, 5)  # (n, b, e, q | q0, h, e')
    s_q = s_q.reshape(n, nb, d, 2 * h * d)  # (n, b, e, (q | q0, h, e'))
    s_q = blocks.over_full(s_q, 1)  # (n, c, e, (q | q0, h, e'))
    s_q = s_q.reshape(n * nb, d, 2 * h * d)  # ((n, c), e, (q | q0, h, e'))
    # q0 against q0 per pair of bands, for g^2: s[(z, l), (w, m)]
    s_00 = s[:, :, :, d:, d:]  # (n, b, h, (z, l), (w, m))
    s_00 = s_00.reshape(n, nb, h, 2, L, 2, L)  # (n, b, h, z, l, w, m)
    s_00 = s_00.permute(0, 4, 6, 1, 3, 5, 2)  # (n, l, m, b, z, w, h)
    s_00 = s_00.reshape(n, L * L, nb, 4 * h)  # (n, (l, m), b, (z, w, h))
    s_00 = blocks.over_full(s_00, 2)  # (n, (l, m), c, (z, w, h))
    s_00 = s_00.reshape(n * L * L, nb, 4 * h)  # ((n, l, m), c, (z, w, h))
    del s, z  # temporaries go as soon as they are used: the working set stays small
    # key side: y = K_a[j]^T (summed query Grams) for key j = (c, r)
    kb = kp.view(n, nb, block, k + 1, d)  # (n, c, r, a, e)
    k_sets = kb[..., :k, :].reshape(n * nb, block * k, d)  # ((n, c), (r, a), e)
    y = torch.bmm(k_sets, s_q)  # ((n, c), (r, a), (q | q0, h, e'))
    y = y.view(n, nb, block, k, 2, h, d)  # (n, c, r, a, q | q0, h, e')
    del k_sets
    qq = torch.einsum("ncrahe,ncrbe->nhab", y[..., 0, :, :], kb[..., :k, :])  # (n, h, a, b)
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
    qg = (r_flat @ m.T).view(nD, n, h, k)  # (D, n, h, a)
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
    gg = torch.einsum("Dk,nkh->Dnh", pair, gram)  # (D, n, h)
    return qq, qg, gg


def _add_ragged(qq, qg, gg, qb, q0b, kp, rotations, blocks: Blocks) -> torch.Tensor:
    """Adds to qq, qg, gg the key columns a query block takes one by one: the values of every x_a and g_D,
    masked, and all their products from one Gram matrix."""
    n, nb, hr, d = qb.shape
    block = blocks.block
    h = hr // block
    k = kp.shape[-1] // d - 1
    nD = rotations.shape[0]
    dev = qb.device
    rot_t = rotations.transpose(0, 1).reshape(d, nD * d)  # (f, (D, e)): u @ rot_t = R_D^T u for every D
    cols, valid = blocks.ragged()  # (b, j), (b, r, j)
    vm = valid.to(torch.float64)[:, None, None]  # (b, 1, 1, r, j)
    C = cols.shape[1]
    kc = kp[:, cols.clamp(min=0)]  # (n, b, j, (k + 1) d)
    kc = kc.view(n, nb, C, k + 1, d)  # (n, b, j, a, e)
    kc_q = kc[..., :k, :].permute(0, 1, 4, 3, 2)  # (n, b, e, a, j)
    kc_q = kc_q.reshape(n * nb, d, k * C)  # ((n, b), e, (a, j))
    vals = torch.empty(n, nb, h, k + nD, block, C, dtype=torch.float64, device=dev)  # (n, b, h, a | D, r, j)
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
    flat = vals.view(n * nb * h, k + nD, block * C)  # ((n, b, h), a | D, (r, j))
    prod = torch.bmm(flat, flat.transpose(1, 2).contiguous())  # ((n, b, h), a | D, a | D)
    prod = prod.view(n, nb, h, k + nD, k + nD).sum(1)  # (n, h, a | D, a | D)
    qq += prod[..., :k, :k]
    qg += prod[..., k:, :k].permute(2, 0, 1, 3)
    gg += prod[..., k:, k:].diagonal(dim1=-2, dim2=-1).permute(2, 0, 1)
    return vals


def moments_by_sink(m: MaskedMoments, gamma: torch.Tensor, window: int) -> dict[str, Moments]:
    """Sums of x = W, f, g_D and their products for both sink handlings, from :func:`masked_moments` over the
    'with' mask with keys ``[x | f | phi | g]``.

    'without' drops column 0 and takes the mean key over tokens 1..T-1, kbar': f' = f + phi with
    ``phi_ij = s (R_i q_i).(R_j (kbar' - kbar))`` and g' = g + gamma with the row constant
    ``gamma_i = s (R_D q_i).(R_0 (kbar - kbar'))``, ``gamma (nD, ..., T)``. Sums without column 0 subtract its
    products, an O(T) correction. Returns ``{sink: Moments}``. method.md sections 3A (the sink-free terms) and 4.
    """
    T = m.q_rows.shape[-1]
    nd = window or T
    tok = torch.arange(T, device=gamma.device)
    n_rows = ((tok + 1).clamp(max=nd) - (tok < nd).long()).to(gamma.dtype)  # counted entries per row, no column 0
    c0, g0 = m.q_col0, m.g_col0  # column 0: (n, h, a, T), (D, n, h, T)
    # without column 0; a indexes the key sets [x | f | phi]
    rows = m.q_rows - c0  # (n, h, a, T)
    g_rows = m.g_rows - g0  # (D, n, h, T)
    qq = m.qq - torch.einsum("nhat,nhbt->nhab", c0, c0)  # (n, h, a, b)
    qg = m.qg - torch.einsum("nhat,Dnht->Dnha", c0, g0)  # (D, n, h, a)
    gg = m.gg - (g0 * g0).sum(-1)  # (D, n, h)
    f_rows = rows[..., 1, :] + rows[..., 2, :]  # (n, h, T): rows of f' = f + phi
    return {
        "with": Moments(
            s_x=m.q_rows[..., 0, :].sum(-1),
            s_f=m.q_rows[..., 1, :].sum(-1),
            s_g=m.g_rows.sum(-1),
            s_xx=m.qq[..., 0, 0],
            s_xf=m.qq[..., 0, 1],
            s_ff=m.qq[..., 1, 1],
            s_xg=m.qg[..., 0],
            s_fg=m.qg[..., 1],
            s_gg=m.gg,
        ),
        "without": Moments(
            s_x=rows[..., 0, :].sum(-1),
            s_f=f_rows.sum(-1),
            s_g=g_rows.sum(-1) + (gamma * n_rows).sum(-1),
            s_xx=qq[..., 0, 0],
            s_xf=qq[..., 0, 1] + qq[..., 0, 2],
            s_ff=qq[..., 1, 1] + 2 * qq[..., 1, 2] + qq[..., 2, 2],
            s_xg=qg[..., 0] + (gamma * rows[..., 0, :]).sum(-1),
            s_fg=qg[..., 1] + qg[..., 2] + (gamma * f_rows).sum(-1),
            s_gg=gg + 2 * (gamma * g_rows).sum(-1) + (gamma * gamma * n_rows).sum(-1),
        ),
    }
