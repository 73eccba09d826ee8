"""Absolute position in q and k (position shares) and Method A-drift (docs/method.md section 3C): known answers.

The explicit (T x T) check of Method A-drift's r, r_f and r_g is in tests/test_decompose.py (``direct``), the
fused and store paths' agreement on every variable in tests/test_fused.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posgen.decomposition import SINKS, Decomposer
from posgen.decomposition.drift import BASES, position_basis, position_share
from posgen.rope_table import LayerRope

METHOD = {"A": 0, "B": 1, "A-drift": 2}


def inv_freq(d: int, base: float = 10000.0) -> torch.Tensor:
    return base ** (-torch.arange(d // 2, dtype=torch.float32) / (d // 2))


def legendre(T: int, degree: int) -> np.ndarray:
    return np.polynomial.legendre.Legendre.basis(degree)(np.linspace(-1, 1, T))


@pytest.mark.parametrize("sink", SINKS)
def test_basis_is_orthonormal_over_the_counted_tokens_and_spans_the_polynomials(sink):
    T = 50
    basis = position_basis(T, 8, sink).numpy()
    first = SINKS.index(sink)
    assert basis.shape == (T, 9) and np.all(basis[:first] == 0)
    np.testing.assert_allclose(basis.T @ basis, np.eye(9), atol=1e-12)
    cubic = legendre(T, 3)[first:]  # a polynomial of degree <= 8 is reproduced exactly by the projection
    np.testing.assert_allclose(basis[first:] @ (basis[first:].T @ cubic), cubic, atol=1e-10)


def test_position_share_of_a_known_smooth_drift_plus_noise():
    """k_j = c + u P_2(x_j) + e_j: the smooth basis explains the drift's share of the variance, the linear basis
    (orthogonal to P_2 on a symmetric grid) almost none of it; pure noise leaves about (M - 1) / (T - 1)."""
    T, d = 2000, 8
    g = np.random.default_rng(0)
    u = g.standard_normal(d) * 2
    drift = legendre(T, 2)[:, None] * u  # (T, d)
    noise = g.standard_normal((T, d))
    keys = torch.from_numpy(3 + drift + noise)
    expected = (drift - drift.mean(0)).var(0).sum() / ((drift - drift.mean(0)).var(0).sum() + d)
    shares = position_share(keys, position_basis(T, BASES["smooth"], "with"))  # (M,): every degree
    smooth, linear = float(shares[BASES["smooth"]]), float(shares[BASES["linear"]])
    # the nested columns of the smooth basis give the linear basis's own share
    assert linear == pytest.approx(float(position_share(keys, position_basis(T, 1, "with"))[1]), abs=1e-12)
    assert abs(smooth - expected) < 0.02, (smooth, expected)
    assert linear < 0.01
    floor = float(position_share(torch.from_numpy(noise), position_basis(T, 8, "with"))[8])
    # the fit's explained sum of squares is chi-square with 8 d degrees of freedom: 3 standard deviations
    assert abs(floor - 8 / (T - 1)) < 3 * np.sqrt(2 / (8 * d)) * 8 / (T - 1)


def test_position_share_without_the_sink_ignores_token_0():
    T, d = 300, 4
    g = np.random.default_rng(1)
    keys = g.standard_normal((T, d))
    shares = {}
    for outlier in (0.0, 1e3):
        k = keys.copy()
        k[0] += outlier  # the sink key
        shares[outlier] = float(position_share(torch.from_numpy(k), position_basis(T, 8, "without"))[8])
    assert shares[0.0] == pytest.approx(shares[1e3], abs=1e-12)


def _no_drift_keys(H_kv, T, d, seed=0):
    """Keys whose fit over tokens 1..T-1 on the smooth basis is their mean there: no drift to remove."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(H_kv, T, d, generator=g, dtype=torch.float64)
    basis = position_basis(T, BASES["smooth"], "without")
    k[:, 1:] -= basis[1:] @ (basis[1:].T @ k[:, 1:])  # remove every polynomial of degree <= 8, constants included
    k[:, 0] *= 5  # the sink key: an outlier, outside the fit
    return (k + torch.randn(H_kv, 1, d, generator=g, dtype=torch.float64)).float()


def test_without_drift_method_a_drift_equals_method_a():
    """The fit of kbar(j) leaves the sink out, so with no drift kbar(j) is Method A's sink-free mean key
    kbar': A-drift without the sink is Method A without the sink."""
    H, H_kv, T, d = 4, 2, 40, 8
    q = torch.randn(H, T, d, generator=torch.Generator().manual_seed(3)) + 0.5
    k = _no_drift_keys(H_kv, T, d)
    res = Decomposer([0, 30], 30).unit(q, k, [0, 0, 1, 1], LayerRope(inv_freq(d), d**-0.5))
    si = SINKS.index("without")
    for name in ("r", "r_f", "r_g", "sum_y", "sum_yy", "sum_xy"):
        np.testing.assert_allclose(
            res[name][:, METHOD["A-drift"], si], res[name][:, METHOD["A"], si], rtol=1e-5, atol=1e-6, err_msg=name
        )
    assert np.all(res["k_position_share"][:, :, si] < 0.02)  # float32 rounding of the keys only


def test_drift_keys_lift_method_a_drift_above_method_a():
    """Keys that are mostly a smooth function of position: Method A scores the drift at the dummy distance and
    loses it; Method A-drift takes it into f at the true distance and its r is close to 1."""
    H, H_kv, T, d = 2, 1, 120, 8
    g = torch.Generator().manual_seed(5)
    q = torch.randn(H, T, d, generator=g) + 1.0
    x = torch.linspace(-1, 1, T)[:, None]
    k = torch.randn(1, 1, d, generator=g) * 3 * torch.cos(2 * x) + 0.05 * torch.randn(H_kv, T, d, generator=g)
    res = Decomposer([1000], 1000).unit(q, k, [0, 0], LayerRope(inv_freq(d), d**-0.5))
    assert np.all(res["k_position_share"][:, list(BASES).index("smooth")] > 0.95)  # (H, sink)
    assert np.all(res["r"][:, METHOD["A-drift"]] > 0.99)
    assert np.all(res["r"][:, METHOD["A-drift"]] > res["r"][:, METHOD["A"]] + 0.05)
