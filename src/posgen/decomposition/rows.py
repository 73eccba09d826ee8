"""Row-centring: the sums that make r softmax-invariant (docs/method.md section 4, "Row-centred r").

Softmax over a query row's keys ignores a constant added to the row, so what attention sees of W is each row less
its mean over the row's scored keys. For x = W and y = a construction, with ``R^x_i``, ``R^y_i`` their sums over
row i's ``n_i`` scored entries,

    sum_ij (x_ij - xbar_i)(y_ij - ybar_i) = sum_ij x_ij y_ij - sum_i R^x_i R^y_i / n_i,

so the row-centred r needs only the corrections ``c_xy = sum_i R^x_i R^y_i / n_i`` (and c_xx, c_yy) beside the
plain sums: O(T) per head from the row sums that :func:`posgen.decomposition.moments.masked_moments` already
returns. Row-centred entries have mean 0 in every row, so their pooled r over heads (and windows) is
``sum (s_xy - c_xy) / sqrt(sum (s_xx - c_xx) * sum (s_yy - c_yy))``.
"""

from __future__ import annotations

import functools

import torch

from posgen.decomposition.moments import MaskedMoments, rows_with, rows_without


@functools.lru_cache(maxsize=16)
def _combinations(k: int, nD: int, p: int, first: int, device) -> torch.Tensor:
    """``(sink, F, column + 1)`` float64: the row sums of every construction's y = f + g and of x = W as sums of
    the forms ``a | D | p`` (:func:`posgen.decomposition.moments.masked_moments`). Method A at D is f (form 1, and
    for 'without' f' = f + phi, form 2) plus g_D; drift pair i is the f set ``first + i`` plus the v set i; x,
    form 0, comes last, in the place of Method B's column (whose row sums are W's)."""
    F = k + nD + p
    out = torch.zeros(2, F, nD + p + 1, dtype=torch.float64)
    for D in range(nD):
        out[:, 1, D] = 1.0
        out[1, 2, D] = 1.0  # phi: the sink-free mean key's f correction
        out[:, k + D, D] = 1.0
    for i in range(p):
        out[:, first + i, nD + i] = 1.0
        out[:, k + nD + i, nD + i] = 1.0
    out[:, 0, -1] = 1.0
    return out.to(device)


@functools.lru_cache(maxsize=16)
def _weights(n_tokens: int, window: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``1 / n_i`` per sink handling and row (0 for a row without entries) as ``(sink, 1, T, 1)``, and the
    'without' rows' counts ``(T,)``."""
    counts = torch.stack([rows_with(n_tokens, window, device), rows_without(n_tokens, window, device)])  # (sink, T)
    weight = torch.where(counts > 0, 1.0 / counts.clamp(min=1), 0.0)
    return weight[:, None, :, None], counts[1]


def row_moments(m: MaskedMoments, gamma: torch.Tensor, window: int, first: int) -> torch.Tensor:
    """The row-centring corrections ``c_ab = sum_i R^a_i R^b_i / n_i`` of W against every construction, from the
    row sums and key column 0 of ``m`` (:func:`masked_moments` over the 'with' mask); ``gamma (D, n, h, T)`` the
    sink-free g's row constant (:func:`posgen.decomposition.moments.moments_by_sink`), ``first`` the first drift f
    set. 'without' drops key column 0 from every row sum.

    Returns ``(sink, xy | yy, column + 1, n, h)`` over the columns of the r's (Method A at every dummy distance,
    then the drift pairs: A-drift, A-shared), then x: at ``xy`` every c_xy, at ``yy`` every c_yy, and c_xx last in
    both (Method B's, whose row sums are W's)."""
    n, h, T, F = m.rows.shape
    nD, p = gamma.shape[0], m.v_rows.shape[-2]
    weight, n_without = _weights(T, window, m.rows.device)
    forms = torch.stack([m.rows, m.rows - m.col0]).view(2, n * h * T, F)  # (sink, (n, h, T), F)
    z = torch.bmm(forms, _combinations(F - nD - p, nD, p, first, m.rows.device))  # (sink, (n, h, T), column + 1)
    z = z.view(2, n * h, T, -1)  # (sink, (n, h), T, column + 1)
    g_rows = (gamma * n_without).view(nD, n * h, T).permute(1, 2, 0)  # ((n, h), T, D)
    z[1, ..., :nD].add_(g_rows)  # 'without': g' = g + gamma in every counted entry
    zw = (z * weight).view(2 * n * h, T, -1).transpose(1, 2)  # ((sink, n, h), column + 1, T)
    gram = torch.bmm(zw, z.view(2 * n * h, T, -1)).view(2, n, h, nD + p + 1, -1)  # (sink, n, h, F', F')
    c = torch.stack([gram[..., -1, :], gram.diagonal(dim1=-2, dim2=-1)], 1)  # (sink, xy | yy, n, h, column + 1)
    return c.permute(0, 1, 4, 2, 3)  # (sink, xy | yy, column + 1, n, h)
