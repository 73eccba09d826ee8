"""Absolute position in the pre-RoPE vectors, and Method A with a mean key that drifts with it (docs/method.md
section 3C).

The causal averaging of a network writes absolute position into its hidden states, so a key can drift with
the position it sits at. Method A's constant mean key ``kbar`` leaves that drift in the semantic term g, scored
at the dummy distance D. Two measurements here:

* the **position share** of q and of k: the share of a vector's variance over the window that a function of
  its absolute position explains, by least squares on a polynomial basis of the position (:data:`BASES`:
  degree 1 and Legendre polynomials up to :data:`SMOOTH_DEGREE`);
* **Method A-drift**: Method A with the mean key replaced by the key's fit on the smooth basis, ``kbar(j)``:
  ``f_ij = s (R_i q_i).(R_j kbar(j))`` and ``g_ij = s (R_D q_i).(R_0 (k_j - kbar(j)))``. f is one more key set
  of the masked moments, g one key set scored against the unrotated queries (``R_D^T R_0 (k_j - kbar(j))``), so
  every sum comes from the same pass as Method A's (:func:`drift_moments` assembles them).
* **Method A-shared**: the same, with ``kbar(j) = kbar' + s(j)``: the window's own mean key over tokens 1..T-1
  plus a function of position shared by every window, ``s(j)``, estimated from held-out windows
  (:func:`shared_drift`). A-drift's per-window fit absorbs absolute position and prefix content alike; s(j)
  carries only what is common to windows at the same absolute position. :func:`shared_shares` splits the key's
  position share into that shared part and the per-window rest, and lets each window scale s(j) by its own
  amplitude (a diagnostic of a shared profile with per-window sizes).

The fit of ``kbar(j)`` leaves the sink token out in both sink handlings (:func:`drift_basis`): the first key
of a trained model is an outlier (the attention sink) that would bend a smooth fit. 'with' scores key column 0
against the fit's value at j = 0; 'without' drops column 0. One drift key set then serves both handlings, and
the correction sums of 'without' are those of 'with' less column 0's, an O(T) step.
"""

from __future__ import annotations

import numpy as np
import torch

from posgen.decomposition.mask import SINKS
from posgen.decomposition.moments import MaskedMoments, Moments
from posgen.numerics import SMOOTH_DEGREE

# Polynomial degree of the smooth basis. A fit of M = degree + 1 functions explains a share (M - 1) / (T - 1) of
# pure noise (0.7 % at T = 1200), and on SmolLM2's random-init keys the share grows by 1.6 points from degree 8
# to 16 (docs/method.md section 3C): the drift is smooth, and degree 8 holds it.
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
    float64 ``(..., M)``, 0 at m = 0. A stack of bases ``(S, T, M)`` (one per sink) gives ``(..., S, M)`` from
    one product.

    ``basis`` is :func:`position_basis`: orthonormal, its first column constant over the counted tokens, and its
    first m + 1 columns spanning the polynomials of degree <= m (QR keeps the spans of a Vandermonde matrix
    nested), so one projection serves every degree: the fit's coefficients ``P^T x``, less the constant's."""
    x64 = x.double()  # (..., T, d)
    T, M = basis.shape[-2:]
    flat = basis.movedim(-2, 0).reshape(T, -1)  # (T, (S, M))
    coef = flat.T @ x64  # (..., (S, M), d): coef[0] = sqrt(n) x the mean over the counted tokens
    power = (coef * coef).sum(-1)  # (..., (S, M))
    power = power.unflatten(-1, (*basis.shape[:-2], M))  # (..., S, M)
    counted = (basis.abs().sum(-1) > 0).to(x64.dtype)  # (S, T)
    squares = torch.einsum("...te,...te->...t", x64, x64)  # (..., T): no (..., T, d) temporary
    total = squares @ counted.movedim(-1, 0) - power[..., 0]  # (..., S): the variance, times n
    explained = power.cumsum(-1) - power[..., :1]  # (..., S, M): degrees 0, 1, ..., M - 1
    return explained / total[..., None]


def drift_fit(k64: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """The keys' fit over tokens 1..T-1 on :func:`drift_basis`, evaluated at every token: ``kbar(j) (..., T, d)``."""
    T = k64.shape[-2]
    k_t = k64[..., 1:, :].movedim(-2, 0).reshape(T - 1, -1)  # (T - 1, (..., d)): every vector a column
    fit = basis @ (basis[1:].T @ k_t)  # (T, (..., d)): two plain products, not one per head
    return fit.view(T, *k64.shape[:-2], k64.shape[-1]).movedim(0, -2)


def heldout_coefficients(mean_k, n_tokens: int) -> torch.Tensor:
    """The coefficients of the held-out mean keys ``mean_k (..., T, d)`` on :func:`drift_basis` (over tokens
    1..T-1): ``(..., M, d)`` float64, what qk.h5 stores for Method A-shared (``k_heldout_coef``): its shared function
    reads the mean keys only through this fit, ``drift_basis @ coefficients`` (:func:`heldout_fit`)."""
    basis = drift_basis(n_tokens, SMOOTH_DEGREE)  # (T, M)
    mean_k = mean_k if torch.is_tensor(mean_k) else torch.from_numpy(np.asarray(mean_k))
    return basis[1:].T @ mean_k.double()[..., 1:, :]  # (..., M, d)


def heldout_fit(coefficients, basis: torch.Tensor) -> torch.Tensor:
    """The held-out mean keys' fit at every token from :func:`heldout_coefficients`: ``(..., T, d)`` float64, on
    ``basis (T, M)``, the window's :func:`drift_basis` (the caller's, built once: Decomposer.basis)."""
    coefficients = coefficients if torch.is_tensor(coefficients) else torch.from_numpy(np.asarray(coefficients))
    if coefficients.shape[-2] != basis.shape[1]:
        raise ValueError(
            f"held-out key coefficients: {coefficients.shape[-2]} basis functions, the {basis.shape[0]}-token basis "
            f"has {basis.shape[1]}"
        )
    return basis @ coefficients.to(basis.device, torch.float64)


def shared_drift(mean_k: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Method A-shared's shared function of position, ``s(j) (..., T, d)`` float64, from ``mean_k (..., T, d)``,
    the mean key at every position over held-out windows: its fit on :func:`drift_basis` (the basis of
    A-drift's fit, over tokens 1..T-1), centred over tokens 1..T-1, so that the window's own mean key carries the
    constant (docs/method.md section 3C)."""
    fit = drift_fit(mean_k.double(), basis)  # (..., T, d)
    return fit - fit[..., 1:, :].mean(-2, keepdim=True)


def shared_shares(x: torch.Tensor, shared: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The shares of the variance of ``x (..., T, d)`` over the counted tokens of each sink handling that the
    shared function ``shared (..., T, d)`` explains, float64 ``(..., sink)`` each (docs/method.md 3C):

    * ``shared_share``, as it is (coefficient 1, as Method A-shared uses it): ``1 - sum_j ||x_j - xbar - s_j||^2 /
      sum_j ||x_j - xbar||^2``, s centred over the same tokens; negative where s is further from the window's
      drift than no drift at all;
    * ``scaled_share``, with one fitted amplitude per window and KV head, ``a = <x - xbar, s> / <s, s>`` (least
      squares): ``<x - xbar, s>^2 / (<s, s> sum_j ||x_j - xbar||^2)``, in [0, 1] and at least the first. A shared
      shape whose size differs from window to window (a trajectory whose profile is common and whose amplitude
      is not) shows here and not in the fixed-amplitude share.

    Both handlings at once: 'without' weighs token 0 by 0."""
    T = x.shape[-2]
    tok = torch.arange(T, device=x.device)
    first = torch.arange(len(SINKS), device=x.device)  # each handling's first counted token: 0 'with', 1 'without'
    counted = (tok >= first[:, None]).double()  # (sink, T)
    batch = max(x.dim(), shared.dim()) - 2  # the leading dims x and s broadcast to
    w = counted.view(len(SINKS), *[1] * batch, T, 1)  # (sink, ..., T, 1)
    n = w.sum(-2, keepdim=True)  # (sink, ..., 1, 1): the counted tokens
    x64, s64 = x.double(), shared.double()
    xs = (x64 - (x64 * w).sum(-2, keepdim=True) / n) * w  # (sink, ..., T, d): centred, token 0 out where dropped
    ss = (s64 - (s64 * w).sum(-2, keepdim=True) / n) * w  # (sink, ..., T, d)
    total = (xs * xs).sum((-2, -1))  # (sink, ...)
    power = (ss * ss).sum((-2, -1))
    cross = (xs * ss).sum((-2, -1))
    fixed = 1 - ((xs - ss) ** 2).sum((-2, -1)) / total
    scaled = torch.where(power > 0, cross * cross / (power * total), torch.zeros_like(total))
    return fixed.movedim(0, -1), scaled.movedim(0, -1)


def drift_moments(m: MaskedMoments, first: int) -> Moments:
    """Method A-drift's sums of x = W, f = s (R_i q_i).(R_j kbar(j)) and g = s (R_D q_i).(R_0 (k_j - kbar(j)))
    at the layer's dummy distance, per sink, from :func:`posgen.decomposition.moments.masked_moments` over the
    'with' mask: pair i's f is the key set ``first + i`` (the W set is 0) and its g the set ``i`` scored against
    q0 (``v``), one pair per v set (A-drift's, then A-shared's: the same sums from its own pair of sets).

    g has no sink-free offset (the drift fit carries the whole mean, and is the same in both handlings), so
    'without' is 'with' less key column 0's products, as in
    :func:`posgen.decomposition.moments.moments_by_sink`. Returns one :class:`Moments`, both handlings stacked
    first: ``s_x``, ``s_xx`` ``(sink, n, h)``, every other ``(sink, pair, n, h)``."""
    n_pairs = m.vv.shape[-1]
    a = slice(first, first + n_pairs)  # the f sets; the g sets are every v set
    c0, v0 = m.q_col0, m.v_col0  # (n, h, a, T), (n, h, p, T)
    s_q = m.q_rows.sum(-1)  # (n, h, a)
    s_v = m.v_rows.sum(-1)  # (n, h, p)
    s_q = torch.stack([s_q, s_q - c0.sum(-1)])  # (sink, n, h, a)
    s_v = torch.stack([s_v, s_v - v0.sum(-1)])  # (sink, n, h, p)
    k, V = m.qq.shape[-1], slice(m.col0_gram.shape[-1] - m.vv.shape[-1], None)  # the x_a, then the v_p's place
    qq = torch.stack([m.qq, m.qq - m.col0_gram[..., :k, :k]])  # (sink, n, h, a, b)
    qv = torch.stack([m.qv, m.qv - m.col0_gram[..., :k, V]])  # (sink, n, h, a, p)
    vv = torch.stack([m.vv, m.vv - m.col0_gram[..., V, V]])  # (sink, n, h, p, p')

    def by_pair(x):  # (sink, n, h, pair) -> (sink, pair, n, h)
        return x.movedim(-1, 1)

    def pairs(x):  # (..., a, p) of a pair's f set against its g set: the diagonal of the block
        return by_pair(x.diagonal(dim1=-2, dim2=-1))

    return Moments(
        s_x=s_q[..., 0],
        s_f=by_pair(s_q[..., a]),
        s_g=by_pair(s_v),
        s_xx=qq[..., 0, 0],
        s_xf=by_pair(qq[..., 0, a]),
        s_ff=pairs(qq[..., a, a]),
        s_xg=by_pair(qv[..., 0, :]),
        s_fg=pairs(qv[..., a, :]),
        s_gg=pairs(vv),
    )
