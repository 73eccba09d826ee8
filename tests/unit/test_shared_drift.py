"""Method A-shared and the split of the key's position share into a shared and a per-window part
(docs/method.md section 3C): known answers, and an explicit (T x T) check of A-shared's r, r_f and r_g."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posgen.decomposition import METHODS, SINKS, Decomposer
from posgen.decomposition.drift import BASES, SMOOTH_DEGREE
from posgen.decomposition.mask import causal_mask
from posgen.rope import rotate
from posgen.rope_table import LayerRope

SMOOTH = list(BASES).index("smooth")
A, A_DRIFT, A_SHARED = (METHODS.index(m) for m in ("A", "A-drift", "A-shared"))


def inv_freq(d: int, base: float = 10000.0) -> torch.Tensor:
    return base ** (-torch.arange(d // 2, dtype=torch.float32) / (d // 2))


def legendre(T: int, degree: int) -> np.ndarray:
    return np.polynomial.legendre.Legendre.basis(degree)(np.linspace(-1, 1, T))


def windows(n: int, T: int, d: int, shared: float, own: float, seed: int) -> np.ndarray:
    """(n, T, d) keys: a constant per window + a shared smooth drift P_2(x) u (the same u in every window) +
    a per-window smooth drift P_3(x) v_n (its own v_n) + unit noise. ``shared`` and ``own`` scale the drifts."""
    g = np.random.default_rng(seed)
    u = np.random.default_rng(99).standard_normal(d)  # the shared direction: the same for every call
    out = []
    for _ in range(n):
        v = g.standard_normal(d)
        k = g.standard_normal(d) + shared * legendre(T, 2)[:, None] * u + own * legendre(T, 3)[:, None] * v
        out.append(k + g.standard_normal((T, d)))
    return np.stack(out)


def smooth_variance(T: int, d: int, scale: float, degree: int, direction=None) -> float:
    """The per-token variance, summed over dims, of scale * P_degree(x) times a standard normal vector (or times
    ``direction``)."""
    p = legendre(T, degree)
    norm2 = d if direction is None else float(direction @ direction)
    return scale**2 * p.var() * norm2


def unit(q, k, heldout, D=1000):
    kv = [0] * q.shape[0]
    return Decomposer([D], D).unit(q, k, kv, LayerRope(inv_freq(q.shape[-1]), q.shape[-1] ** -0.5), heldout_k=heldout)


def test_the_shared_and_per_window_shares_are_recovered():
    """Keys = shared drift + per-window drift + noise, and a held-out mean over 200 other windows: the shared share
    is the shared drift's share of the variance, the smooth share less it the per-window drift's."""
    T, d, n_heldout = 400, 8, 200
    u = np.random.default_rng(99).standard_normal(d)
    window = torch.from_numpy(windows(1, T, d, shared=2.0, own=2.0, seed=1)[0])[None].float()  # (1, T, d)
    heldout = torch.from_numpy(windows(n_heldout, T, d, shared=2.0, own=2.0, seed=2).mean(0))[None].float()
    q = torch.randn(2, T, d, generator=torch.Generator().manual_seed(0))
    res = unit(q, window, heldout)
    k = window[0].double().numpy()
    total = ((k - k.mean(0)) ** 2).sum(1).mean()  # the window's variance per token, summed over dims
    expected_shared = smooth_variance(T, d, 2.0, 2, u) / total
    shared = res["k_shared_share"][:, SINKS.index("with")]
    smooth = res["k_position_share"][:, SMOOTH, SINKS.index("with")]
    own = smooth - shared
    assert np.allclose(shared, expected_shared, atol=0.03), (shared, expected_shared)
    assert np.all(own > 0.1) and np.all(own < smooth)
    # the per-window rest is this window's P_3 drift (shared and own drifts are orthogonal on the grid)
    p3 = legendre(T, 3)
    coef = np.linalg.lstsq(p3[:, None], k - k.mean(0), rcond=None)[0]  # (1, d): v, fitted
    expected_own = (p3.var() * (coef**2).sum()) / total
    assert np.allclose(own, expected_own, atol=0.03), (own, expected_own)


def test_without_shared_drift_method_a_shared_equals_method_a_without_the_sink():
    """A held-out mean with no drift (a constant) gives s(j) = 0, so A-shared's mean key is kbar', Method A's
    sink-free mean key: A-shared without the sink is Method A without the sink, whatever the window's drift."""
    T, d = 60, 8
    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, T, d, generator=g) + 0.5
    k = torch.from_numpy(windows(1, T, d, shared=3.0, own=3.0, seed=4)).float()  # (1, T, d): drifting keys
    flat = torch.ones(1, T, d) * 0.7  # a held-out mean with no drift
    res = unit(q, k, flat, D=30)
    si = SINKS.index("without")
    for name in ("r", "r_f", "r_g", "sum_y", "sum_yy", "sum_xy"):
        np.testing.assert_allclose(res[name][:, A_SHARED, si], res[name][:, A, si], rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.all(np.abs(res["k_shared_share"]) < 1e-9)  # s = 0 explains nothing


def test_a_window_that_is_its_own_held_out_mean_makes_a_shared_equal_a_drift():
    """When the held-out mean is the window itself, s(j) + kbar' is A-drift's own fit kbar(j): equal r."""
    T, d = 60, 8
    q = torch.randn(2, T, d, generator=torch.Generator().manual_seed(5)) + 0.3
    k = torch.from_numpy(windows(1, T, d, shared=2.0, own=2.0, seed=6)).float()
    res = unit(q, k, k, D=30)
    for name in ("r", "r_f", "r_g"):
        np.testing.assert_allclose(res[name][:, A_SHARED], res[name][:, A_DRIFT], rtol=1e-5, atol=1e-6, err_msg=name)


def test_method_a_shared_against_explicit_logits():
    """r, r_f and r_g of A-shared from (T x T) matrices: f = s (R_i q_i).(R_j (kbar' + s_j)), g = s (R_D q_i).(k_j -
    kbar' - s_j), s_j the held-out mean's fit on the Legendre polynomials of degree <= 8 over tokens 1..T-1,
    centred there."""
    T, d, D = 50, 8, 37
    g = torch.Generator().manual_seed(7)
    q = torch.randn(3, T, d, generator=g) + 0.4
    k = torch.from_numpy(windows(1, T, d, shared=1.5, own=1.5, seed=8)).float()  # (1, T, d)
    heldout = torch.from_numpy(windows(5, T, d, shared=1.5, own=1.5, seed=9).mean(0))[None].float()
    res = unit(q, k, heldout, D=D)
    th, s = inv_freq(d), d**-0.5
    pos = torch.arange(T)
    V = np.polynomial.legendre.legvander(np.linspace(-1, 1, T), SMOOTH_DEGREE)
    fit = V @ np.linalg.lstsq(V[1:], heldout[0].double().numpy()[1:], rcond=None)[0]  # (T, d)
    shared = torch.from_numpy(fit - fit[1:].mean(0))
    kh = k[0].double()
    kS = kh[1:].mean(0) + shared  # (T, d)
    q_rot = rotate(q, pos, th).double()  # (H, T, d)
    W = q_rot @ rotate(k[0], pos, th).double().T * s  # (H, T, T)
    f = q_rot @ rotate(kS.float(), pos, th).double().T * s
    gg = rotate(q, torch.tensor(D), th).double() @ (kh - kS).T * s
    for si, sink in enumerate(SINKS):
        M = causal_mask(T, 0).numpy().copy()
        if sink == "without":
            M[:, 0] = False
        for h in range(3):
            w = W[h].numpy()[M]
            for name, y in (("r", f[h] + gg[h]), ("r_f", f[h]), ("r_g", gg[h])):
                expected = np.corrcoef(w, y.numpy()[M])[0, 1]
                assert res[name][h, A_SHARED, si] == pytest.approx(expected, abs=1e-6), (name, sink, h)


def test_pure_noise_keys_give_the_shared_share_its_floor():
    """Keys without any drift, held-out mean of n windows: s is the fit of noise of variance 1/n, which lowers the
    fit by about (M - 1) / ((T - 1) n), the shared share's noise floor (docs/method.md section 3C)."""
    T, d, n = 1000, 16, 4
    window = torch.from_numpy(windows(1, T, d, 0.0, 0.0, seed=10))[None, 0].float()
    heldout = torch.from_numpy(windows(n, T, d, 0.0, 0.0, seed=11).mean(0))[None].float()
    q = torch.randn(1, T, d, generator=torch.Generator().manual_seed(0))
    share = unit(q, window, heldout)["k_shared_share"][0, SINKS.index("with")]
    floor = SMOOTH_DEGREE / ((T - 1) * n)
    assert -3 * floor < share < 0.5 * floor, (share, floor)


def test_a_shared_profile_with_a_window_own_size_shows_only_with_a_fitted_amplitude():
    """Keys = -3 x the held-out shared drift (the same profile, another size and sign) + noise: with amplitude 1
    s(j) explains less than nothing; with one fitted amplitude per window it explains the drift's share."""
    T, d = 400, 8
    drift = torch.from_numpy(legendre(T, 2)[:, None] * np.random.default_rng(99).standard_normal(d))  # (T, d)
    noise = torch.randn(1, T, d, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    window = (-3 * drift + noise).float()
    q = torch.randn(2, T, d, generator=torch.Generator().manual_seed(0))
    res = unit(q, window, drift[None].float())
    si = SINKS.index("with")
    fixed, scaled = res["k_shared_share"][0, si], res["k_scaled_share"][0, si]
    k = window[0].double().numpy()
    expected = 9 * float((drift - drift.mean(0)).pow(2).sum(1).mean()) / ((k - k.mean(0)) ** 2).sum(1).mean()
    assert fixed < 0 and scaled == pytest.approx(expected, abs=0.02), (fixed, scaled, expected)
    assert np.all(res["k_scaled_share"] >= res["k_shared_share"] - 1e-12)  # least squares never does worse


def test_without_held_out_windows_method_a_shared_is_nan():
    T, d = 30, 8
    q = torch.randn(2, T, d, generator=torch.Generator().manual_seed(0))
    k = torch.randn(1, T, d, generator=torch.Generator().manual_seed(1))
    res = unit(q, k, None, D=20)
    assert np.isnan(res["r"][:, A_SHARED]).all() and np.isnan(res["k_shared_share"]).all()
    assert np.isnan(res["k_scaled_share"]).all()
    assert np.isfinite(res["r"][:, A_DRIFT]).all()
    with pytest.raises(ValueError, match="held-out mean keys"):
        unit(q, k, torch.zeros(1, T + 1, d), D=20)


def test_the_stored_coefficients_give_method_a_shared_the_mean_keys_give():
    """qk.h5 keeps the held-out mean keys' coefficients on the smooth basis (2.4 MB, not 0.54 GB, for the 8B shape
    at 4,096 tokens): Method A-shared's statistics from their fit equal those from the mean keys themselves, and a
    file written before them (the mean keys) reads back as the same coefficients."""
    import xarray as xr

    from posgen.decomposition.drift import drift_basis, heldout_coefficients, heldout_fit
    from posgen.decomposition.table import heldout_source

    T, d = 96, 8
    g = torch.Generator().manual_seed(4)
    mean = torch.randn(2, T, d, generator=g) + torch.linspace(-1, 1, T)[:, None] ** 3 * 2  # (kv_head, T, d)
    coef = heldout_coefficients(mean, T)
    assert coef.shape == (2, SMOOTH_DEGREE + 1, d)
    q = torch.randn(4, T, d, generator=g) + 0.5
    k = torch.randn(2, T, d, generator=g) + mean
    from_mean, from_fit = unit(q, k, mean.numpy()), unit(q, k, heldout_fit(coef, drift_basis(T, SMOOTH_DEGREE)).numpy())
    for name in ("r", "r_f", "r_g", "k_shared_share", "k_scaled_share"):
        np.testing.assert_allclose(from_fit[name], from_mean[name], rtol=1e-10, atol=1e-12, err_msg=name)
    assert np.isfinite(from_fit["k_shared_share"]).all()
    old = xr.Dataset({"k_heldout_mean": (("layer", "kv_head", "token", "dim"), mean.numpy()[None])})
    np.testing.assert_allclose(heldout_source(old)[0], coef.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="9 basis functions, the 5-token basis has 3"):
        heldout_fit(coef, drift_basis(5, SMOOTH_DEGREE))
