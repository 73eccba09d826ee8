"""Sums and second moments of W, f and every g_D over the counted entries, without (T x T) matrices
(docs/method.md sections 3A and 4).

Every x in {W, f, phi, g_D} is a rank-d matrix ``x_ij = a_i . u_j``, so ``sum_ij x_ij y_ij = sum_j u_j^T (sum_i
a_i b_i^T) v_j`` over the counted (i, j): :func:`masked_moments` over the 'with' mask, then
:func:`moments_by_sink` for both sink handlings (dropping the sink column is an O(T) correction).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import torch

from posgen.decomposition.mask import window_prefix
from posgen.numerics import TOKEN_BLOCK


@dataclass(frozen=True)
class MaskedMoments:
    """What :func:`masked_moments` returns, float64: sums over the counted entries of ``x_a`` (a key set K_a),
    ``g_D`` (a dummy distance D) and ``v_p`` (a key set V_p scored against q0 as it is) and of their products,
    their row sums and key column 0 (0 where it does not count), for n KV heads with h query heads each."""

    qq: torch.Tensor  # (n, h, a, b): sum x_a x_b
    qg: torch.Tensor  # (D, n, h, a): sum x_a g_D, for the first ``g_sets`` key sets
    gg: torch.Tensor  # (D, n, h): sum g_D^2
    qv: torch.Tensor  # (n, h, a, p): sum x_a v_p
    vv: torch.Tensor  # (n, h, p, p'): sum v_p v_p'
    q_rows: torch.Tensor  # (n, h, a, T): row sums of x_a
    g_rows: torch.Tensor  # (D, n, h, T): row sums of g_D
    v_rows: torch.Tensor  # (n, h, p, T): row sums of v_p
    q_col0: torch.Tensor  # (n, h, a, T): x_a in key column 0
    g_col0: torch.Tensor  # (D, n, h, T): g_D in key column 0
    v_col0: torch.Tensor  # (n, h, p, T): v_p in key column 0
    col0_gram: torch.Tensor  # (n, h, F, G): sum over rows of the forms' products in key column 0 (a | D | p)
    rows: torch.Tensor  # (n, h, T, F): row sums of every form (a | D | p), the three above side by side
    col0: torch.Tensor  # (n, h, T, F): every form in key column 0 (0 where it does not count)


@dataclass(frozen=True)
class Moments:
    """Sums over the counted entries of x = W, f, g_D and their products, both sink handlings stacked first and
    per query head: ``(sink, ..., H)``, the g terms ``(sink, D, ..., H)``, one per dummy distance (or per column of
    the r's, :meth:`posgen.decomposition.Decomposer.moments`)."""

    s_x: torch.Tensor
    s_f: torch.Tensor
    s_g: torch.Tensor
    s_xx: torch.Tensor
    s_xf: torch.Tensor
    s_ff: torch.Tensor
    s_xg: torch.Tensor
    s_fg: torch.Tensor
    s_gg: torch.Tensor
    # the row-centring corrections (posgen.decomposition.rows.row_moments), (sink, xy | yy, column + 1, ..., H);
    # set by Decomposer.moments over every column of the r's, None in a term's own moments
    c_rows: torch.Tensor | None = None


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
        self.ends_t = self.last[:-1] + 1  # per key block c < nb - 1: the first query block past last[c]
        self.ends = self.ends_t.tolist()
        self.cols, self.valid = self._ragged()

    def _ragged(self) -> tuple[torch.Tensor, torch.Tensor]:
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

    def at_ragged(self, x: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """``x (n, (c, r), e)`` (zero-padded to whole blocks) at the ragged key columns ``cols (b, j)`` of
        :attr:`cols`: ``(n, b, j, e)``. Without a window they are the diagonal blocks themselves: a view."""
        if not self.window:
            return x.view(x.shape[0], self.nb, self.block, x.shape[-1])
        return x[:, cols.clamp(min=0)]

    def over_full(self, x: torch.Tensor, dim: int, scan: bool = False) -> torch.Tensor:
        """Per key block c < nb - 1 (the last is counted in full by no query block): the sum of x over the query
        blocks c < b <= last[c], along dim. Sums in place: x is overwritten. ``scan``: the suffix sums as one
        cumulative sum and the differences as two gathers, a fixed handful of operations (a GPU's launches)
        where the loop takes 2 nb; the loop is faster on a CPU (``python -m posgen.bench ops`` counts both)."""
        nb = self.nb
        if scan:
            return self._over_full_scan(x, dim)
        for b in range(nb - 2, -1, -1):  # suffix sums, in place; a loop of adds beats torch.cumsum on CPU
            x.select(dim, b).add_(x.select(dim, b + 1))
        if not self.window:
            return x.narrow(dim, 1, nb - 1)  # key block c: the query blocks b > c
        # key block c: the suffix sum at c + 1 less that at ends[c], written into slot c in ascending c; that
        # reads only slots above c (ends[c] > c), so no temporary of x's size
        for c, end in enumerate(self.ends):
            if end < nb:
                torch.sub(x.select(dim, c + 1), x.select(dim, end), out=x.select(dim, c))
            else:
                x.select(dim, c).copy_(x.select(dim, c + 1))
        return x.narrow(dim, 0, nb - 1)

    def _over_full_scan(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """:meth:`over_full` in a fixed number of operations: suffix[b] = sum of x over blocks b' >= b."""
        suffix = x.flip(dim).cumsum(dim).flip(dim)  # (..., b, ...)
        if not self.window:
            return suffix.narrow(dim, 1, self.nb - 1)  # key block c: the query blocks b > c
        shape = list(suffix.shape)
        shape[dim] = 1
        padded = torch.cat([suffix, suffix.new_zeros(shape)], dim)  # slot nb: the empty suffix
        # key block c: the suffix at c + 1 less that at ends[c]
        return padded.index_select(dim, self.b_idx[1:]) - padded.index_select(dim, self.ends_t)


KEY_CHUNK = 256  # keys per product of _full_blocks' q-g sums, in the products' dtype; summed over chunks in float64


@functools.lru_cache(maxsize=16)
def _blocks(n_tokens: int, window: int, block: int, device) -> Blocks:
    """:class:`Blocks` of one mask, with its ragged columns: the same for every head and layer that share it."""
    return Blocks(n_tokens, window, block, device)


def masked_moments(
    q: torch.Tensor,
    q0: torch.Tensor,
    rotations: torch.Tensor,
    keys: torch.Tensor,
    q0_keys: torch.Tensor,
    window: int,
    block: int = TOKEN_BLOCK,
    g_sets: int | None = None,
    dtype: torch.dtype = torch.float64,
    batched: bool = False,
    w: torch.Tensor | None = None,
) -> MaskedMoments:
    """Sums over the counted entries of ``x_a = q Ka^T``, ``g_D = (q0 R_D^T) Kg^T`` and ``v_p = q0 Vp^T`` and
    of their products.

    ``q, q0 (n, h, T, d)``: n KV heads with h query heads each; ``rotations (nD, d, d)``, the R_D
    (block-diagonal per RoPE band, dims l and l + d/2); ``keys (n, T, (k + 1) d) = [K1 | ... | Kk | Kg]``;
    ``q0_keys (n, T, p d) = [V1 | ... | Vp]``, key sets scored against q0 as they are (Method A-drift's g at its
    dummy distance). Returns float64 sums of products, row sums and column 0 (:class:`MaskedMoments`), so that
    sums without column 0 follow in O(T); products among the V sets and with the K sets, not with g_D. Only the
    first ``g_sets`` key sets (default: all) get their products with g_D: each costs a (d x d) contraction per
    query head over every key.

    No (T x T) matrix: ``sum_ij (a_i.u_j)(b_i.v_j) = sum_j u_j^T (sum_i a_i b_i^T) v_j``. Tokens go in blocks;
    a key block that a query block counts in full enters through the query block's Gram matrices, summed
    over every such query block; the rest (the diagonal block and, with a window, its ragged start: under 3
    blocks) through explicit products, masked. The dummy distance enters only through R_D, so the g terms
    are contracted once for every D (for g^2, per pair of bands).

    ``dtype`` is that of the products. float64 takes them raw. float32 takes them on centred queries (each less
    its mean over tokens), whose products carry no large mean to cancel, and adds the mean parts, a column
    function per form, exactly in float64 (:func:`_mean_parts`); block sums, sums over keys and the row sums
    are float64 either way. method.md sections 3A (Method A's terms), 3C (A-drift's) and 4 (the
    sums, "Precision").

    Index names in the shape comments: a, b key sets K_a (a = k: Kg); p, p' the V sets; D dummy distances; e, f
    dims; l, m bands and x, y, z, w in {0, 1} the two dims (l and l + d/2) of a band; b query blocks, c key
    blocks, r rows of a block; j ragged key columns; F, G every form (the x_a, then the g_D, then the v_p).

    ``batched``: loops over token blocks and key chunks as single operations (:meth:`Blocks.over_full`'s scan;
    every key chunk in one batched product), the device layout (``Decomposer(batched=...)``); the same sums in
    another order. ``w``: ``band_factors(rotations)`` computed and checked already (the caller's, once per layer),
    else they are here.
    """
    f64 = torch.float64
    q, q0, rotations = q.to(f64), q0.to(f64), rotations.to(f64)
    keys, q0_keys = keys.to(f64), q0_keys.to(f64)
    k = keys.shape[-1] // q.shape[-1] - 1
    g_sets = k if g_sets is None else g_sets
    n, T, d = keys.shape[0], keys.shape[1], q.shape[-1]
    kg_rot = keys[..., k * d :] @ rotations.transpose(0, 1).reshape(d, -1)  # (n, T, (D, e)): R_D^T kg_j, every D
    kg_rot = kg_rot.view(n, T, -1, d)  # (n, T, D, e)
    rows, col0 = _rows_and_column0(q, q0, kg_rot, keys, q0_keys, window)  # (n, h, T, F) each
    G = slice(k, k + rotations.shape[0])  # the g_D among the forms
    q_rows, g_rows, v_rows = rows[..., :k].transpose(2, 3), rows[..., G].permute(3, 0, 1, 2), rows[..., G.stop :]
    q_col0, g_col0, v_col0 = col0[..., :k].transpose(2, 3), col0[..., G].permute(3, 0, 1, 2), col0[..., G.stop :]
    v_rows, v_col0 = v_rows.transpose(2, 3), v_col0.transpose(2, 3)  # (n, h, p, T)
    col0_gram = col0.transpose(-1, -2) @ col0  # (n, h, F, G): what dropping column 0 takes from every product
    if dtype == f64:
        qq, qg, gg, qv, vv = _products(q, q0, rotations, keys, q0_keys, window, block, g_sets, batched, w)
    else:
        q_mean, q0_mean = q.mean(2, keepdim=True), q0.mean(2, keepdim=True)  # (n, h, 1, e): means over tokens
        q_c, q0_c = q - q_mean, q0 - q0_mean  # centred queries
        qq, qg, gg, qv, vv = _products(
            q_c.to(dtype),
            q0_c.to(dtype),
            rotations,
            keys.to(dtype),
            q0_keys.to(dtype),
            window,
            block,
            g_sets,
            batched,
            w,
        )
        means = _mean_parts((q_mean, q_c), (q0_mean, q0_c), kg_rot, keys, q0_keys, window)  # (n, h, F, G)
        G, V = slice(k, k + rotations.shape[0]), slice(k + rotations.shape[0], means.shape[-1])
        qq = qq + means[..., :k, :k]
        qg = qg + means[..., G, :g_sets].permute(2, 0, 1, 3)
        gg = gg + means[..., G, G].diagonal(dim1=-2, dim2=-1).permute(2, 0, 1)
        qv = qv + means[..., :k, V]
        vv = vv + means[..., V, V]
    return MaskedMoments(
        qq=qq,
        qg=qg,
        gg=gg,
        qv=qv,
        vv=vv,
        q_rows=q_rows,
        g_rows=g_rows,
        v_rows=v_rows,
        q_col0=q_col0,
        g_col0=g_col0,
        v_col0=v_col0,
        col0_gram=col0_gram,
        rows=rows,
        col0=col0,
    )


def _products(q, q0, rotations, keys, q0_keys, window: int, block: int, g_sets: int, batched=False, w=None):
    """qq, qg, gg, qv, vv over the counted entries, products in the dtype of q, sums float64; ``rotations``
    float64 (the contractions with R_D after the sums over keys are float64); ``batched`` and ``w`` as in
    :func:`masked_moments`."""
    blocks = _blocks(q.shape[2], window, block, q.device)
    qb = _by_block(q, block)  # (n, b, (h, r), e)
    q0b = _by_block(q0, block)  # (n, b, (h, r), e)
    pad = (0, 0, 0, blocks.nb * block - q.shape[2])
    kp = torch.nn.functional.pad(keys, pad)  # (n, (c, r), (k + 1) d), zero-padded
    vp = torch.nn.functional.pad(q0_keys, pad)  # (n, (c, r), p d), zero-padded
    full = _full_blocks(qb, q0b, q0, kp, vp, rotations, blocks, g_sets, batched, w)
    return _add_ragged(*full, qb, q0b, kp, vp, rotations, blocks)


def _mean_parts(q, q0, kg_rot, keys, q0_keys, window: int) -> torch.Tensor:
    """``sum x_F x_G`` over the counted entries less that of their parts with centred queries, float64, for
    every pair of forms F, G (the x_a, the g_D, the v_p): ``(n, h, F, G)``. method.md section 4, "Precision".

    A form ``x_ij = a_i . u_j`` with the queries' mean ``abar`` over tokens is ``C(j) + z_ij``: the column
    function ``C(j) = abar . u_j``, which carries the mean, and ``z_ij = (a_i - abar) . u_j``. So
    ``sum x y - sum z_x z_y = sum_j n_col(j) C_x C_y + C_x Z_y + Z_x C_y`` with ``Z(j)`` the sum of z over the
    queries that count key j: O(T d) per form. ``q`` and ``q0`` are each (mean ``(n, h, 1, e)``, centred
    queries ``(n, h, T, e)``); ``kg_rot (n, T, D, e)`` the g keys rotated, R_D^T kg_j.
    """
    n, h, T, d = q[1].shape
    k = keys.shape[-1] // d - 1
    groups = [
        (q, keys[..., : k * d].reshape(n, T, k, d)),  # the x_a read q
        (q0, torch.cat([kg_rot, q0_keys.view(n, T, -1, d)], 2)),  # the g_D and v_p read q0
    ]
    C, Z = [], []
    for (a_mean, beta), u in groups:  # u (n, T, F, e): the forms' keys
        after = window_prefix(beta.flip(2), window, dim=2).flip(2)  # (n, h, T, e): over the queries key j counts
        c = u.reshape(n, -1, d) @ a_mean[:, :, 0].transpose(1, 2)  # (n, (T, F), h)
        C.append(c.view(n, T, -1, h).permute(0, 3, 1, 2))  # (n, h, T, F)
        z = after.transpose(1, 2) @ u.transpose(-1, -2)  # (n, T, h, F): per key j, its queries' sums against u_j
        Z.append(z.transpose(1, 2))  # (n, h, T, F)
    C, Z = torch.cat(C, -1), torch.cat(Z, -1)  # (n, h, T, F) each
    tok = torch.arange(T, device=keys.device)
    n_col = (T - tok).clamp(max=window or T).to(keys.dtype)[:, None]  # (T, 1): queries that count key j
    cross = torch.einsum("nhtf,nhtg->nhfg", C, Z)  # sum_j C_F Z_G
    return torch.einsum("nhtf,nhtg->nhfg", C * n_col, C) + cross + cross.transpose(-1, -2)


def _rows_and_column0(q, q0, kg_rot, keys, q0_keys, window: int):
    """Row sums of every x_a, g_D and v_p from prefix sums of the keys, and their key column 0 where it counts,
    each ``(n, h, T, a | D | p)``;
    ``kg_rot (n, T, D, e)`` the g keys rotated, R_D^T kg_j (g_D's row i: (R_D q0_i) . kg_j = q0_i . R_D^T kg_j)."""
    n, h, T, d = q.shape
    k = keys.shape[-1] // d - 1
    p = q0_keys.shape[-1] // d
    nd = window or T
    q_keys = keys[..., : k * d]  # (n, T, (a, e))
    pre_q = window_prefix(q_keys, window, dim=1).view(n, 1, T, k, d)  # (n, 1, T, a, e): the keys row i counts
    u0 = torch.cat([kg_rot, q0_keys.view(n, T, p, d)], 2)  # (n, T, D | p, e): the forms that read q0
    pre_0 = window_prefix(u0, window, dim=1).unsqueeze(1)  # (n, 1, T, D | p, e)
    q_rows = torch.einsum("nhte,nutae->nhta", q, pre_q)  # (n, h, T, a); no (n, h, T, a, e) temporary
    rows_0 = torch.einsum("nhte,nutFe->nhtF", q0, pre_0)  # (n, h, T, D | p)
    del pre_q, pre_0  # temporaries go as soon as they are used: the working set stays small
    counts0 = (torch.arange(T, device=q.device) < nd).to(torch.float64)[:, None]  # (T, 1): rows that count column 0
    k0_q = q_keys[:, None, 0].reshape(n, 1, k, d)  # (n, 1, a, e): key column 0
    q_col0 = (q @ k0_q.transpose(-1, -2)) * counts0  # (n, h, T, a)
    col0_0 = (q0 @ u0[:, None, 0].transpose(-1, -2)) * counts0  # (n, h, T, D | p): R_D^T kg_0 and V_p[0]
    rows = torch.cat([q_rows, rows_0], -1)  # (n, h, T, a | D | p)
    col0 = torch.cat([q_col0, col0_0], -1)  # (n, h, T, a | D | p)
    return rows, col0


def _full_blocks(qb, q0b, q0, kp, vp, rotations, blocks: Blocks, g_sets: int, batched=False, w=None):
    """qq, qg, gg, qv, vv over the key blocks that query blocks count in full: the query blocks' Gram matrices,
    summed over the query blocks that count each key block, against the keys. The last key block is counted in
    full by no query block, so c runs over the first nc = nb - 1."""
    n, nb, hr, d = qb.shape
    block = blocks.block
    nc = nb - 1
    h = hr // block
    k = kp.shape[-1] // d - 1
    p = vp.shape[-1] // d
    nD = rotations.shape[0]
    r_flat = rotations.reshape(nD, d * d)  # (D, (f, e)): R_D[f, e]
    # q against q and q0 per query block and head, summed over the query blocks: the q rows and q g terms
    q_t = qb.view(n * nb * h, block, d).transpose(1, 2).contiguous()  # ((n, b, h), e, r) (strided operands are slow)
    s_qq = torch.bmm(q_t, qb.view(n * nb * h, block, d))  # ((n, b, h), e, e')
    s_q0 = torch.bmm(q_t, q0b.view(n * nb * h, block, d))  # ((n, b, h), e, e')
    del q_t
    s_q = torch.stack([s.view(n, nb, h, d, d).transpose(2, 3) for s in (s_qq, s_q0)], 3)  # (n, b, e, q | q0, h, e')
    del s_qq, s_q0
    s_q = s_q.view(n, nb, d, 2 * h * d)  # (n, b, e, (q | q0, h, e'))
    s_q = blocks.over_full(s_q.double(), 1, batched).to(qb.dtype)  # (n, c, e, (q | q0, h, e')): summed in float64
    s_q = s_q.reshape(n * nc, d, 2 * h * d)  # ((n, c), e, (q | q0, h, e'))
    # q0 against q0 per query block and head (blocks of each head's own tokens, so no copy), summed likewise
    q0_blocks = torch.nn.functional.pad(q0, (0, 0, 0, nb * block - q0.shape[2]))  # (n, h, (b, r), e)
    q0_blocks = q0_blocks.view(n * h * nb, block, d)  # ((n, h, b), r, e)
    s_00 = torch.bmm(q0_blocks.transpose(1, 2).contiguous(), q0_blocks)  # ((n, h, b), e, e')
    s_00 = s_00.view(n, h, nb, d * d)  # (n, h, b, (e, e'))
    s_00 = blocks.over_full(s_00.double(), 2, batched)  # (n, h, c, (e, e')), float64
    # key side: y = K_a[j]^T (summed query Grams) for key j = (c, r), the q and the q0 half apart (each
    # contiguous, so that the contractions below are plain batched products)
    kb = kp[:, : nc * block].reshape(n, nc, block, k + 1, d)  # (n, c, r, a, e)
    vb = vp[:, : nc * block].reshape(n * nc * block, p, d)  # ((n, c, r), p, e)
    k_sets = kb[..., :k, :].reshape(n * nc, block * k, d)  # ((n, c), (r, a), e)
    y_q = torch.bmm(k_sets, s_q[..., : h * d])  # ((n, c), (r, a), (h, e'))
    y_q = y_q.view(n * nc * block, k * h, d)  # ((n, c, r), (a, h), e')
    k_t = k_sets.view(n * nc * block, k, d).transpose(1, 2)  # ((n, c, r), e', b)
    qq = torch.bmm(y_q, k_t)  # ((n, c, r), (a, h), b)
    qq = qq.view(n, nc * block, k, h, k).sum(1, dtype=torch.float64)  # (n, a, h, b)
    qq = qq.transpose(1, 2)  # (n, h, a, b)
    del y_q
    y_0 = torch.bmm(k_sets, s_q[..., h * d :])  # ((n, c), (r, a), (h, e))
    del k_sets
    # sum x_a v_p = sum_j K_a[j]^T (summed q q0^T Grams) V_p[j]
    qv = torch.bmm(y_0.view(n * nc * block, k * h, d), vb.transpose(1, 2))  # ((n, c, r), (a, h), p)
    qv = qv.view(n, nc * block, k, h, p).sum(1, dtype=torch.float64)  # (n, a, h, p)
    qv = qv.transpose(1, 2)  # (n, h, a, p)
    # sum_i (q_i^T G_ag) . R_D q0_i = <R_D, m_a>, m_a = sum_j kg_j (K_a[j]^T summed q q0^T Grams)
    y_0 = y_0.view(n, nc * block, k * h * d)  # (n, (c, r), (a, h, e))
    kg = kb[..., k, :]  # (n, c, r, f)
    kg_t = kg.reshape(n, nc * block, d).transpose(1, 2)  # (n, f, (c, r))
    if batched:
        m = _key_chunks_batched(kg_t, y_0[..., : g_sets * h * d])  # (n, f, (a, h, e)): a < g_sets
    else:
        m = torch.zeros(n, d, g_sets * h * d, dtype=torch.float64, device=qb.device)  # (n, f, (a, h, e))
        for j0 in range(0, nc * block, KEY_CHUNK):  # products over a chunk of keys, their sums over chunks float64
            m += torch.bmm(kg_t[..., j0 : j0 + KEY_CHUNK], y_0[:, j0 : j0 + KEY_CHUNK, : g_sets * h * d])
    del y_0
    m = m.view(n, d, g_sets, h, d)  # (n, f, a, h, e)
    m = m.permute(0, 3, 2, 1, 4)  # (n, h, a, f, e)
    m = m.reshape(n * h * g_sets, d * d)  # ((n, h, a), (f, e))
    qg = (r_flat @ m.T).view(nD, n, h, g_sets)  # (D, n, h, a)
    # g^2 = sum_c <R_D^T G_c R_D, S_c>, G_c = sum_(j in c) kg_j kg_j^T and S_c the summed q0 Grams. R_D multiplies
    # band l as a complex number (u_l + i u_(l + d/2)) by w_Dl, so g_D = Re z, z = sum_l conj(w_l a_l) b_l for
    # a = q0_i, b = kg_j, and g^2 = (|z|^2 + Re z^2) / 2: the sum over c comes first, entrywise per pair of bands
    # (l, m), on the Hermitian and the symmetric complex Grams; then w_D on both sides, once for every D
    kg_blocks = kg.reshape(n * nc, block, d)  # ((n, c), r, f)
    g_c = torch.bmm(kg_blocks.transpose(1, 2).contiguous(), kg_blocks).double()  # ((n, c), f, f')
    herm_k, sym_k = _complex_grams(g_c.view(n, 1, nc, d, d))  # (n, 1, c, l, m) each
    herm_q, sym_q = _complex_grams(s_00.view(n, h, nc, d, d))  # (n, h, c, l, m) each
    p_abs = (herm_q * herm_k.conj()).sum(2)  # (n, h, l, m): sum_c over the products of |z|^2
    p_sq = (sym_q.conj() * sym_k).sum(2)  # (n, h, l, m): the same of z^2
    w = band_factors(rotations) if w is None else w  # (D, l)
    # sum |z|^2 = conj(w_D)^T p_abs w_D and sum z^2 = conj(w_D)^T p_sq conj(w_D), per D, head: both from one product
    wp = w.conj() @ torch.stack([p_abs, p_sq])  # (2, n, h, D, m): conj(w_D)^T p
    w_right = torch.stack([w, w.conj()])[:, None, None]  # (2, 1, 1, D, m)
    z = (wp * w_right).sum(-1)  # (2, n, h, D): sum |z|^2, sum z^2
    gg = 0.5 * z.real.sum(0).permute(2, 0, 1)  # (D, n, h)
    # sum v_p v_p' = sum_c sum_(j in c) V_p[j]^T S_c V_p'[j], float64 (few keys): V^T S_c per head first, so
    # no (p d x p d) block Gram of the V keys per block
    v = vb.view(n, 1, nc, block * p, d).double()  # (n, 1, c, (r, p), e)
    y = torch.matmul(v, s_00.view(n, h, nc, d, d))  # (n, h, c, (r, p), f)
    y = y.view(n, h, nc, block, p, d)  # (n, h, c, r, p, f)
    vv = torch.einsum("nhcrpf,ncrqf->nhpq", y, v.view(n, nc, block, p, d))  # (n, h, p, p')
    return qq, qg, gg, qv, vv


def _key_chunks_batched(kg_t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``kg_t (n, f, keys) @ y (n, keys, X)`` as :data:`KEY_CHUNK`-key products in the operands' dtype, every chunk
    in one batched product, summed over chunks in float64: ``(n, f, X)``."""
    n, f, nk = kg_t.shape
    nch = -(-nk // KEY_CHUNK)
    pad = nch * KEY_CHUNK - nk
    a = torch.nn.functional.pad(kg_t, (0, pad))  # (n, f, (ch, K)), zero keys past the end
    a = a.view(n, f, nch, KEY_CHUNK).transpose(1, 2)  # (n, ch, f, K)
    a = a.reshape(n * nch, f, KEY_CHUNK)  # ((n, ch), f, K)
    b = torch.nn.functional.pad(y, (0, 0, 0, pad))  # (n, (ch, K), X)
    b = b.reshape(n * nch, KEY_CHUNK, y.shape[-1])  # ((n, ch), K, X)
    m = torch.bmm(a, b)  # ((n, ch), f, X)
    return m.view(n, nch, f, y.shape[-1]).sum(1, dtype=torch.float64)  # (n, f, X)


def band_factors(rotations: torch.Tensor) -> torch.Tensor:
    """R_D per band as a complex factor: R_D multiplies ``u_l + i u_(l + d/2)`` by ``w_Dl``; ``(nD, l)``.

    ``rotations (nD, d, d)``; a ValueError where an R_D is not such a product per band (RoPE's rotations are;
    method.md section 3A)."""
    nD, d = rotations.shape[0], rotations.shape[-1]
    r = rotations.view(nD, 2, d // 2, 2, d // 2).diagonal(dim1=2, dim2=4)  # (D, x, z, l): R_D[(x, l), (z, l)]
    cos, sin = r[:, 0, 0], r[:, 1, 0]  # (D, l)
    rebuilt = torch.cat(
        [
            torch.cat([torch.diag_embed(cos), -torch.diag_embed(sin)], -1),
            torch.cat([torch.diag_embed(sin), torch.diag_embed(cos)], -1),
        ],
        -2,
    )  # (D, d, d)
    if not torch.allclose(rebuilt, rotations, rtol=0, atol=1e-9 * float(rotations.abs().max())):
        raise ValueError("rotations: an R_D is not a rotation (times a scale) per RoPE band, dims l and l + d/2")
    return torch.complex(cos, sin)


def _complex_grams(gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Hermitian ``sum conj(u_l) u_m`` and the symmetric ``sum u_l u_m`` (l, m bands) of the complex vectors
    ``u_l = x_l + i x_(l + d/2)`` whose real Gram ``sum x x^T`` is ``gram (..., d, d)``: ``(..., l, m)`` each."""
    L = gram.shape[-1] // 2
    g = gram.unflatten(-1, (2, L)).unflatten(-3, (2, L))  # (..., x, l, y, m)
    g00, g11 = g[..., 0, :, 0, :], g[..., 1, :, 1, :]  # (..., l, m)
    g01, g10 = g[..., 0, :, 1, :], g[..., 1, :, 0, :]  # (..., l, m)
    return torch.complex(g00 + g11, g01 - g10), torch.complex(g00 - g11, g01 + g10)


def _add_ragged(qq, qg, gg, qv, vv, qb, q0b, kp, vp, rotations, blocks: Blocks) -> tuple:
    """qq, qg, gg, qv, vv plus the key columns a query block takes one by one: the values of every x_a, g_D and
    v_p, masked, and all their products from one Gram matrix."""
    n, nb, hr, d = qb.shape
    block = blocks.block
    h = hr // block
    k = kp.shape[-1] // d - 1
    p = vp.shape[-1] // d
    nD = rotations.shape[0]
    dev = qb.device
    rot_t = rotations.to(qb.dtype).transpose(0, 1).reshape(d, nD * d)  # (f, (D, e)): u @ rot_t = R_D^T u, every D
    cols, valid = blocks.cols, blocks.valid  # (b, j), (b, r, j)
    vm = valid.to(qb.dtype)[:, None, None]  # (b, 1, 1, r, j)
    C = cols.shape[1]
    kc = blocks.at_ragged(kp, cols)  # (n, b, j, (k + 1) d)
    kc = kc.view(n, nb, C, k + 1, d)  # (n, b, j, a, e)
    kc_q = kc[..., :k, :].permute(0, 1, 4, 3, 2)  # (n, b, e, a, j)
    kc_q = kc_q.reshape(n * nb, d, k * C)  # ((n, b), e, (a, j))
    # (n, b, h, a | D | p, r, j)
    vals = torch.empty(n, nb, h, k + nD + p, block, C, dtype=qb.dtype, device=dev)
    x = torch.bmm(qb.reshape(n * nb, h * block, d), kc_q)  # ((n, b), (h, r), (a, j))
    x = x.view(n, nb, h, block, k, C)  # (n, b, h, r, a, j)
    torch.mul(x.transpose(3, 4), vm, out=vals[:, :, :, :k])
    # g_D at (i, j) = q0_i . R_D^T kg_j: rotate the few ragged keys rather than every query; v_p beside them
    kg_rot = kc[..., k, :].reshape(-1, d) @ rot_t  # ((n, b, j), (D, e))
    kg_rot = kg_rot.view(n * nb, C, nD, d)  # ((n, b), j, D, e)
    vc = blocks.at_ragged(vp, cols)  # (n, b, j, p d)
    vc = vc.view(n * nb, C, p, d)  # ((n, b), j, p, e)
    q0_side = torch.cat([kg_rot, vc], 2)  # ((n, b), j, D | p, e)
    q0_side = q0_side.permute(0, 3, 2, 1)  # ((n, b), e, D | p, j)
    q0_side = q0_side.reshape(n * nb, d, (nD + p) * C)  # ((n, b), e, (D | p, j))
    x0 = torch.bmm(q0b.reshape(n * nb, h * block, d), q0_side)  # ((n, b), (h, r), (D | p, j))
    x0 = x0.view(n, nb, h, block, nD + p, C)  # (n, b, h, r, D | p, j)
    torch.mul(x0.transpose(3, 4), vm, out=vals[:, :, :, k:])
    t = k + nD + p
    flat = vals.view(n * nb * h, t, block * C)  # ((n, b, h), a | D | p, (r, j))
    prod = torch.bmm(flat, flat.transpose(1, 2))  # ((n, b, h), a | D | p, a | D | p)
    prod = prod.view(n, nb, h, t, t).sum(1, dtype=torch.float64)  # (n, h, a | D | p, a | D | p)
    G, V = slice(k, k + nD), slice(k + nD, t)
    qq = qq + prod[..., :k, :k]
    qg = qg + prod[..., G, : qg.shape[-1]].permute(2, 0, 1, 3)
    gg = gg + prod[..., G, G].diagonal(dim1=-2, dim2=-1).permute(2, 0, 1)
    qv = qv + prod[..., :k, V]
    vv = vv + prod[..., V, V]
    return qq, qg, gg, qv, vv


def moments_by_sink(m: MaskedMoments, gamma: torch.Tensor, window: int) -> Moments:
    """Sums of x = W, f, g_D and their products for both sink handlings, from :func:`masked_moments` over the
    'with' mask with keys ``[x | f | phi | g]``.

    'without' drops column 0 and takes the mean key over tokens 1..T-1, kbar': f' = f + phi with
    ``phi_ij = s (R_i q_i).(R_j (kbar' - kbar))`` and g' = g + gamma with the row constant
    ``gamma_i = s (R_D q_i).(R_0 (kbar - kbar'))``, ``gamma (nD, ..., T)``. Sums without column 0 subtract its
    products, an O(T) correction. Returns one :class:`Moments`, both handlings stacked first (:data:`SINKS`
    order): ``(sink, n, h)``, the g terms ``(sink, D, n, h)``. method.md sections 3A (the sink-free terms) and 4.
    """
    T = m.q_rows.shape[-1]
    n_rows = rows_without(T, window, gamma.device)  # (T,) counted entries per row, no column 0
    c0, g0 = m.q_col0, m.g_col0  # column 0: (n, h, a, T), (D, n, h, T)
    # without column 0; a indexes the key sets [x | f | phi]
    rows = m.q_rows - c0  # (n, h, a, T)
    g_rows = m.g_rows - g0  # (D, n, h, T)
    k, nD = m.qq.shape[-1], m.gg.shape[0]
    qq = m.qq - m.col0_gram[..., :k, :k]  # (n, h, a, b)
    qg = m.qg - m.col0_gram[..., k : k + nD, : m.qg.shape[-1]].permute(2, 0, 1, 3)  # (D, n, h, a)
    gg = m.gg - (g0 * g0).sum(-1)  # (D, n, h)
    x_rows = rows[..., 0, :]  # (n, h, T)
    f_rows = rows[..., 1, :] + rows[..., 2, :]  # (n, h, T): rows of f' = f + phi
    # gamma against each term over a row's counted entries: (4, D, n, h) for 1, x, f', g
    with_gamma = torch.stack([gamma * n_rows, gamma * x_rows, gamma * f_rows, gamma * (g_rows + 0.5 * gamma * n_rows)])
    with_gamma = with_gamma.sum(-1)  # the last: sum gamma g + gamma^2 / 2, so that s_gg takes it twice
    s_with = m.q_rows[..., :2, :].sum(-1)  # (n, h, x | f)
    s_without = torch.stack([x_rows, f_rows], -2).sum(-1)  # (n, h, x | f')
    s = torch.stack([s_with, s_without])  # (sink, n, h, x | f)
    return Moments(
        s_x=s[..., 0],
        s_f=s[..., 1],
        s_g=torch.stack([m.g_rows.sum(-1), g_rows.sum(-1) + with_gamma[0]]),
        s_xx=torch.stack([m.qq[..., 0, 0], qq[..., 0, 0]]),
        s_xf=torch.stack([m.qq[..., 0, 1], qq[..., 0, 1] + qq[..., 0, 2]]),
        s_ff=torch.stack([m.qq[..., 1, 1], qq[..., 1, 1] + 2 * qq[..., 1, 2] + qq[..., 2, 2]]),
        s_xg=torch.stack([m.qg[..., 0], qg[..., 0] + with_gamma[1]]),
        s_fg=torch.stack([m.qg[..., 1], qg[..., 1] + qg[..., 2] + with_gamma[2]]),
        s_gg=torch.stack([m.gg, gg + 2 * with_gamma[3]]),
    )


@functools.lru_cache(maxsize=16)
def rows_with(n_tokens: int, window: int, device) -> torch.Tensor:
    """(T,) float64: the counted entries of each query row, key column 0 included (the same for every layer)."""
    tok = torch.arange(n_tokens, device=device)
    return (tok + 1).clamp(max=window or n_tokens).to(torch.float64)


@functools.lru_cache(maxsize=16)
def rows_without(n_tokens: int, window: int, device) -> torch.Tensor:
    """(T,) float64: the counted entries of each query row without key column 0 (the same for every layer)."""
    tok = torch.arange(n_tokens, device=device)
    nd = window or n_tokens
    return ((tok + 1).clamp(max=nd) - (tok < nd).long()).to(torch.float64)
