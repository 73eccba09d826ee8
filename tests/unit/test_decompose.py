"""Decomposition (Methods A and B, bound, sweep) against direct computations and analytic answers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import xarray as xr

from posgen.decomposition import SINKS, Decomposer, decompose_store
from posgen.decomposition.design import AdditiveDesign, fit_sinks, stack_sinks, w_sums
from posgen.decomposition.mask import MaskInfo
from posgen.decomposition.moments import Blocks, band_factors, masked_moments
from posgen.decomposition.options import DecompositionOptions
from posgen.layer_types import layer_type, layer_types, used_dummy_distance
from posgen.rope import causal_mask, rotate
from posgen.rope_table import LayerRope
from posgen.testing.qk_store import toy_rope, write_qk_store


def inv_freq(d: int, base: float = 10000.0) -> torch.Tensor:
    return base ** (-torch.arange(d // 2, dtype=torch.float32) / (d // 2))


def random_qk(H=4, H_kv=2, T=24, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(H, T, d, generator=g) + 0.5
    k = torch.randn(H_kv, T, d, generator=g) * 0.7 + torch.randn(d, generator=g)
    k[:, 0] *= 4  # an outlier first key, like an attention sink
    return q, k, np.repeat(np.arange(H_kv), H // H_kv)


def direct(q, k, kv, rope: LayerRope, Ds, D0):
    """Every statistic computed the obvious way: full matrices in float64, np.corrcoef, np.linalg.lstsq."""
    H, T, d = q.shape
    L = d // 2
    s, amp, th = rope.scaling, rope.attention_scaling, rope.inv_freq
    pos = torch.arange(T)
    window = rope.sliding_window if 0 < rope.sliding_window < T else 0
    out = {}
    for h in range(H):
        qh, kh = q[h].double(), k[kv[h]].double()
        q_rot = rotate(q[h], pos, th, amp).double()
        W = q_rot @ rotate(k[kv[h]], pos, th, amp).double().T * s
        for sink in SINKS:
            M = causal_mask(T, window).numpy().copy()
            if sink == "without":
                M[:, 0] = False
            kbar = kh.mean(0) if sink == "with" else kh[1:].mean(0)
            f = q_rot @ rotate(kbar.float().expand(T, d), pos, th, amp).double().T * s

            def g(D):
                return rotate(q[h], torch.tensor(D), th, amp).double() @ (amp * (kh - kbar)).T * s

            w = W.numpy()[M]

            def r(y):
                return np.corrcoef(w, y.numpy()[M])[0, 1]

            def rc(y):  # row-centred: each row of W and y less its mean over the row's counted keys
                return row_centred_r(W.numpy(), y.numpy() if torch.is_tensor(y) else y, M)

            A = (f + g(D0)).numpy()[M]
            # Method A-drift: the key's least-squares fit over tokens 1..T-1 (the sink left out in both handlings)
            # on Legendre polynomials of the position up to degree 8, evaluated at every token
            V = np.polynomial.legendre.legvander(np.linspace(-1, 1, T), min(8, T - 3))
            kfit = V @ np.linalg.lstsq(V[1:], kh.numpy()[1:], rcond=None)[0]  # (T, d)
            kfit = torch.from_numpy(kfit)
            f_d = q_rot @ rotate(kfit.float(), pos, th, amp).double().T * s
            g_d = rotate(q[h], torch.tensor(D0), th, amp).double() @ (amp * (kh - kfit)).T * s
            out[h, sink, "r_drift"], out[h, sink, "r_f_drift"], out[h, sink, "r_g_drift"] = r(f_d + g_d), r(f_d), r(g_d)
            out[h, sink, "rc_drift"] = rc(f_d + g_d)
            out[h, sink, "r_A"] = r(f + g(D0))
            out[h, sink, "rc_A"] = rc(f + g(D0))
            out[h, sink, "rc_sweep"] = [rc(f + g(D)) for D in Ds]
            out[h, sink, "r_sweep"] = [r(f + g(D)) for D in Ds]
            out[h, sink, "r_f"], out[h, sink, "r_g"] = r(f), r(g(D0))
            err = (W - f - g(D0)).abs().numpy()
            qn = torch.hypot(qh[:, :L], qh[:, L:]).numpy()
            dn = torch.hypot((kh - kbar)[:, :L], (kh - kbar)[:, L:]).numpy()
            i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
            fac = np.abs(2 * np.sin(th.double().numpy() * (i - j - D0)[..., None] / 2))
            bound = s * amp * amp * (qn[:, None, :] * dn[None, :, :] * fac).sum(-1)
            out[h, sink, "err"], out[h, sink, "bound"] = err[M].mean(), bound[M].mean()
            out[h, sink, "slack"] = (bound - err)[M].min()
            ii, jj = np.nonzero(M)
            nd = window or T
            X = np.zeros((len(ii), nd + 2 * T))
            rows = np.arange(len(ii))
            X[rows, ii - jj] = X[rows, nd + ii] = X[rows, nd + T + jj] = 1
            B = X @ np.linalg.lstsq(X, w, rcond=None)[0]
            out[h, sink, "r_B"] = np.corrcoef(w, B)[0, 1]
            B_full = np.zeros((T, T))
            B_full[ii, jj] = B
            out[h, sink, "rc_B"] = rc(B_full)
            for method, y in (("A", A), ("B", B)):
                out[h, sink, method, "suff"] = [len(w), w.sum(), y.sum(), (w * w).sum(), (y * y).sum(), (w * y).sum()]
    return out


def row_centred_r(W: np.ndarray, Y: np.ndarray, M: np.ndarray) -> float:
    """Pearson r of W and Y over the entries of mask M after centring each row over its entries in M."""
    n = M.sum(1, keepdims=True).clip(min=1)
    w = np.where(M, W - (W * M).sum(1, keepdims=True) / n, 0.0)
    y = np.where(M, Y - (Y * M).sum(1, keepdims=True) / n, 0.0)
    return float((w * y).sum() / np.sqrt((w * w).sum() * (y * y).sum()))


CASES = {
    "global": dict(),
    "window": dict(window=7),
    "attention_scaling": dict(amp=1.3, D0=30, Ds=(30, 1, 60)),
    "row_blocks": dict(T=40, window=10, block_elems=2000),
    "column_tiles": dict(T=70, block_elems=1000),  # rows of 32, their columns split in tiles of 3
    "one_kv_head": dict(T=33, H=3, H_kv=1, d=16, D0=0, Ds=(0, 7)),
    "default_block": dict(T=70, H=2, H_kv=1, block=32),
}


@pytest.mark.parametrize("batched", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("case", CASES)
def test_matches_direct_computation(case, batched):
    c = {
        "T": 24,
        "H": 4,
        "H_kv": 2,
        "d": 8,
        "window": 0,
        "amp": 1.0,
        "D0": 5,
        "Ds": (0, 5, 30),
        "block": 8,
        **CASES[case],
    }
    q, k, kv = random_qk(c["H"], c["H_kv"], c["T"], c["d"])
    rope = LayerRope(inv_freq(c["d"]), c["d"] ** -0.5, c["amp"], c["window"])
    dec = Decomposer(
        c["Ds"], c["D0"], device="cpu", block_elems=c.get("block_elems"), block=c["block"], batched=batched
    )
    res = dec.unit(q, k, kv, rope)
    sweep = [used_dummy_distance(D, c["window"], c["T"]) for D in c["Ds"]]  # inside a sliding window
    ref = direct(q, k, kv, rope, sweep, c["D0"])
    scale = max(abs(ref[0, "with", "bound"]), 1.0)
    for h in range(c["H"]):
        for si, sink in enumerate(SINKS):
            np.testing.assert_allclose(res["r"][h, 0, si], ref[h, sink, "r_A"], rtol=0, atol=2e-6)
            np.testing.assert_allclose(res["r"][h, 1, si], ref[h, sink, "r_B"], rtol=0, atol=2e-6)
            np.testing.assert_allclose(res["r_f"][h, 0, si], ref[h, sink, "r_f"], rtol=0, atol=2e-6)
            np.testing.assert_allclose(res["r_g"][h, 0, si], ref[h, sink, "r_g"], rtol=0, atol=2e-6)
            assert np.isnan(res["r_f"][h, 1, si]) and np.isnan(res["r_g"][h, 1, si])  # Method B has no f, g
            np.testing.assert_allclose(res["r"][h, 2, si], ref[h, sink, "r_drift"], rtol=0, atol=1e-6)
            np.testing.assert_allclose(res["r_f"][h, 2, si], ref[h, sink, "r_f_drift"], rtol=0, atol=1e-6)
            np.testing.assert_allclose(res["r_g"][h, 2, si], ref[h, sink, "r_g_drift"], rtol=0, atol=1e-6)
            np.testing.assert_allclose(res["r_sweep"][h, si], ref[h, sink, "r_sweep"], rtol=0, atol=2e-6)
            for mi, method in ((0, "A"), (1, "B"), (2, "drift")):  # row-centred r
                np.testing.assert_allclose(res["r_rc"][h, mi, si], ref[h, sink, f"rc_{method}"], rtol=0, atol=2e-6)
            np.testing.assert_allclose(res["r_sweep_rc"][h, si], ref[h, sink, "rc_sweep"], rtol=0, atol=2e-6)
            np.testing.assert_allclose(res["err_abs_mean"][h, si], ref[h, sink, "err"], rtol=2e-5)
            np.testing.assert_allclose(res["bound_mean"][h, si], ref[h, sink, "bound"], rtol=2e-5)
            np.testing.assert_allclose(res["bound_slack_min"][h, si], ref[h, sink, "slack"], rtol=0, atol=1e-5 * scale)
            for mi, method in enumerate("AB"):
                mine = [res[name][h, mi, si] for name in ("n", "sum_x", "sum_y", "sum_xx", "sum_yy", "sum_xy")]
                np.testing.assert_allclose(mine, ref[h, sink, method, "suff"], rtol=1e-5, atol=1e-5)
    assert res["lstsq_residual"].max() < 1e-12


def test_constant_keys_leave_no_semantic_term():
    """Every key equals the mean key: g = 0, W = f exactly, so r(W, f) = r(W, A) = 1 at every D."""
    q, _, kv = random_qk(H=4, H_kv=2, T=32, d=8)
    k = torch.randn(2, 1, 8).expand(2, 32, 8).contiguous()
    rope = LayerRope(inv_freq(8), 8**-0.5)
    res = Decomposer([0, 10, 100], 10).unit(q, k, kv, rope)
    assert np.all(res["r_f"][:, [0, 2]] > 1 - 1e-6)  # Methods A and A-drift (no drift to fit)
    assert np.all(res["r"][:, [0, 2]] > 1 - 1e-6)
    assert np.all(res["r_sweep"] > 1 - 1e-6)
    typical = np.sqrt(res["sum_xx"][:, 0] / res["n"][:, 0])
    assert np.all(res["err_abs_mean"] < 1e-5 * typical[:, None])  # W - f - g = 0 up to rounding
    assert np.all(res["bound_mean"] < 1e-5 * typical[:, None])  # k_j - kbar = 0: the bound is 0 too


def additive_case(T, seed=0):
    g = np.random.default_rng(seed)
    return g.standard_normal(T), g.standard_normal(T), g.standard_normal(T) * 2


@pytest.mark.parametrize("window,sink", [(0, "with"), (0, "without"), (6, "with"), (6, "without")])
def test_additive_fit_recovers_exact_structure(window, sink):
    """W = a(i-j) + b(i) + c(j) exactly: the fit reproduces W; a and c come back up to the gauge."""
    T = 30
    a, b, c = additive_case(T)
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    W = a[np.clip(i - j, 0, None)] + b[i] + c[j]
    info = MaskInfo(T, window)
    x = torch.tensor(W, dtype=torch.float32) * info.bool()
    design = AdditiveDesign(T, window, sink, "cpu")
    (a_hat, b_hat, c_hat), resid, sums = design.fit(*design.rhs(dense_sums(x)))
    assert float(resid.max()) < 1e-12
    M = info.bool(sink).numpy()
    nd = design.n_delta
    fitted = a_hat[0].numpy()[np.clip(i - j, 0, nd - 1)] + b_hat[0].numpy()[i] + c_hat[0].numpy()[j]
    np.testing.assert_allclose(fitted[M], W[M], atol=2e-5)
    # the differences live in the gauge: a + alpha + l*delta, c + gamma + l*j (same slope l)
    delta = np.array([dl for dl in range(nd) if np.diagonal(M, -dl).any()])  # counted distances only
    cols = np.flatnonzero(M.any(0))
    da, dc = (a_hat[0].numpy() - a[:nd])[delta], (c_hat[0].numpy() - c)[cols]
    la, ca = np.polyfit(delta, da, 1)
    lc, cc = np.polyfit(cols, dc, 1)
    np.testing.assert_allclose(da, ca + la * delta, atol=2e-5)
    np.testing.assert_allclose(dc, cc + lc * cols, atol=2e-5)
    np.testing.assert_allclose(la, lc, atol=2e-6)
    # the fit's sums: sum(yhat) = sum(W), sum(yhat^2) = sum(W yhat) = sum(W^2) for an exact fit
    w = W[M]
    np.testing.assert_allclose(float(sums["sum_y"][0]), w.sum(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(float(sums["sum_yy"][0]), (w * w).sum(), rtol=1e-5)
    np.testing.assert_allclose(float(sums["sum_xy"][0]), (w * w).sum(), rtol=1e-5)


@pytest.mark.parametrize("T,window", [(300, 0), (300, 64), (1200, 2)])
def test_both_sinks_fit_together_as_each_alone(T, window, monkeypatch):
    """fit_sinks: one set of conjugate gradients over the stacked rows of both sink handlings (one call) gives
    each design's own fit (its sums to 1e-9, its residual under 1e-10); with a window of 2 tokens the steps stall
    and each design takes its dense solve at once (alone, its own steps stall first). The stack's product with N
    is each design's on its own rows."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(3, T, 8, dtype=torch.float64, generator=g) + 1.0
    k = torch.randn(1, T, 8, dtype=torch.float64, generator=g) + torch.linspace(0, 2, T)[:, None]
    sums = w_sums(q, k, window, torch.zeros(3, dtype=torch.float64))
    alone, together = ({sink: AdditiveDesign(T, window, sink, "cpu") for sink in SINKS} for _ in range(2))
    stack = stack_sinks([together[sink] for sink in SINKS], [3, 3])
    theta = torch.randn(6, alone["with"].n_delta + 2 * T, dtype=torch.float64, generator=g)
    split = [alone["with"].n_delta, T, T]
    expected = torch.cat(
        [torch.cat(alone[s].normal(*theta[3 * i : 3 * i + 3].split(split, -1)), -1) for i, s in enumerate(SINKS)]
    )
    np.testing.assert_allclose(torch.cat(stack.normal(*theta.split(split, -1)), -1), expected, rtol=1e-12, atol=1e-9)
    calls = []
    solve = AdditiveDesign._conjugate_gradients
    monkeypatch.setattr(AdditiveDesign, "_conjugate_gradients", lambda self, *a: calls.append(1) or solve(self, *a))
    _, resid_together, got = fit_sinks(together, {sink: together[sink].rhs(sums) for sink in SINKS}, tol=1e-11)
    assert len(calls) == 1  # together: where they stall, no second run of each design's own
    assert resid_together.shape == (len(SINKS), 3)
    for i, sink in enumerate(SINKS):
        _, resid, expected = alone[sink].fit(*alone[sink].rhs(sums), tol=1e-11)
        assert float(resid_together[i].max()) < 1e-10
        assert (together[sink].inverse is None) == (alone[sink].inverse is None) == (window != 2)
        for name in expected:
            np.testing.assert_allclose(got[name][i].numpy(), expected[name].numpy(), rtol=1e-9, err_msg=name)


@pytest.mark.parametrize("T,window,dense", [(300, 0, False), (300, 64, False), (1200, 2, True)])
def test_method_b_solves_matrix_free_unless_the_window_is_narrow(T, window, dense):
    """Conjugate gradients solve Method B's normal equations without a T x T matrix; a window of a few tokens
    stalls them (N is then as ill-conditioned as a chain's Laplacian) and the dense solve takes over. Either
    way the fit's sums are those of the dense least squares."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, T, 8, dtype=torch.float64, generator=g) + 1.0
    k = torch.randn(1, T, 8, dtype=torch.float64, generator=g) + torch.linspace(0, 2, T)[:, None]
    x = torch.einsum("htd,sd->hts", q, k[0])  # (h, T, T) logits
    mask = MaskInfo(T, window).bool("without")
    design = AdditiveDesign(T, window, "without", "cpu")
    _, resid, sums = design.fit(*design.rhs(w_sums(q, k, window, torch.zeros(2, dtype=torch.float64))))
    assert float(resid.max()) < 1e-10 and (design.inverse is not None) == dense
    i, j = torch.nonzero(mask, as_tuple=True)
    nd = design.n_delta
    onehot = torch.zeros(len(i), nd + 2 * T, dtype=torch.float64)  # the design matrix X of a, b, c
    rows = torch.arange(len(i))
    onehot[rows, i - j] = onehot[rows, nd + i] = onehot[rows, nd + T + j] = 1
    for h in range(2):
        w = x[h][mask]
        yhat = onehot @ torch.linalg.lstsq(onehot, w, driver="gelsd").solution  # rank-deficient: the gauge
        np.testing.assert_allclose(float(sums["sum_yy"][h]), float(yhat @ yhat), rtol=1e-9)
        np.testing.assert_allclose(float(sums["sum_xy"][h]), float(w @ yhat), rtol=1e-9)


def test_additive_logits_from_rope_give_method_b_r_one():
    """q/k built so that the true logits are exactly a(i-j) + b(i) + c(j): Method B scores r = 1.

    Rotating bands with constant q and k give a function of i - j; two bands with zero frequency
    carry b(i) (query side) and c(j) (key side).
    """
    T, d, H = 48, 8, 2
    g = torch.Generator().manual_seed(3)
    theta = torch.tensor([0.9, 0.2, 0.0, 0.0])
    q = torch.randn(H, 1, d, generator=g).expand(H, T, d).clone()
    k = torch.randn(1, 1, d, generator=g).expand(1, T, d).clone()
    q[:, :, 2], q[:, :, 6] = torch.randn(H, T, generator=g), 0.0  # band 2: b(i) = q_i2 * 1
    k[:, :, 2], k[:, :, 6] = 1.0, 0.0
    q[:, :, 3], q[:, :, 7] = 1.0, 0.0  # band 3: c(j) = 1 * k_j3
    k[:, :, 3], k[:, :, 7] = torch.randn(1, T, generator=g), 0.0
    for window in (0, 16):
        res = Decomposer([0, 10], 10).unit(q, k, np.zeros(H, int), LayerRope(theta, 0.5, 1.0, window))
        assert np.all(res["r"][:, 1] > 1 - 1e-6), res["r"][:, 1]
        # the keys vary only in a band that never rotates, so the dummy distance costs Method A nothing either
        assert np.all(res["r"][:, 0] > 1 - 1e-6) and np.all(res["bound_mean"] < 1e-5)


def band_keys(T, d, bands, seed=0):
    """Keys = one shared vector + Gaussian variation confined to the given bands."""
    g = torch.Generator().manual_seed(seed)
    half = d // 2
    k = torch.randn(1, 1, d, generator=g).expand(1, T, d).clone() * 2
    noise = torch.randn(1, T, d, generator=g)
    mask = torch.zeros(d)
    for b in bands:
        mask[b] = mask[b + half] = 1
    return k + noise * mask


def test_low_frequency_key_variation_scores_higher():
    """Token-specific key variation in low-frequency bands: g at distance D is nearly right; in high ones not."""
    T, d = 96, 16
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, T, d, generator=g) + torch.randn(d, generator=g)
    rope = LayerRope(inv_freq(d), d**-0.5)
    dec = Decomposer([0, 40], 40)
    low = dec.unit(q, band_keys(T, d, [6, 7]), np.zeros(4, int), rope)
    high = dec.unit(q, band_keys(T, d, [0, 1]), np.zeros(4, int), rope)
    assert np.all(low["r"][:, 0] > high["r"][:, 0])
    assert np.all(low["err_abs_mean"] < high["err_abs_mean"])
    assert low["r"][:, 0].min() > 0.9


@pytest.mark.parametrize("seed", range(3))
def test_error_never_exceeds_bound(seed):
    """The section 5 bound holds entry by entry (min slack >= 0 up to float32 rounding)."""
    q, k, kv = random_qk(H=4, H_kv=2, T=64, d=16, seed=seed)
    for window, D in ((0, 20), (16, 100), (0, 63)):
        res = Decomposer([D], D).unit(q * 3, k, kv, LayerRope(inv_freq(16, 500.0), 0.25, 1.1, window))
        assert np.all(res["bound_slack_min"] >= -1e-5 * res["bound_mean"])
        assert np.all(res["err_abs_mean"] <= res["bound_mean"])


def dense_sums(x):
    """Diagonal, row and column sums and column 0 of a masked (T, T) matrix, the obvious way, float64."""
    x = torch.as_tensor(x, dtype=torch.float64)
    diag = torch.stack([torch.diagonal(x, -dl).sum() for dl in range(x.shape[0])])
    return diag[None], x.sum(1)[None], x.sum(0)[None], x[None, :, 0]


def test_masked_moments_and_w_sums_match_dense_matrices():
    """Two KV heads with two query heads each; sums over dense masked matrices, the obvious way."""
    g = torch.Generator().manual_seed(0)
    for T, window, block in ((50, 0, 8), (50, 7, 8), (37, 3, 16), (9, 0, 64), (40, 30, 8), (64, 20, 32)):
        n, h, k, d, Ds = 2, 2, 3, 6, (0, 5, 40)
        q = torch.randn(n, h, T, d, generator=g, dtype=torch.float64) + 1
        q0 = torch.randn(n, h, T, d, generator=g, dtype=torch.float64)
        rotations = torch.stack([rotate(torch.eye(d), torch.tensor(D), inv_freq(d)).T for D in Ds]).double()
        keys = torch.randn(n, T, (k + 1) * d, generator=g, dtype=torch.float64) + 0.5
        m = causal_mask(T, window).double()
        xs = [q @ keys[:, None, :, a * d : (a + 1) * d].transpose(-1, -2) * m for a in range(k)]  # (n, h, T, T) each
        gD = torch.einsum("Dfe,nhte->Dnhtf", rotations, q0) @ keys[None, :, None, :, k * d :].transpose(-1, -2) * m
        q0_keys = torch.randn(n, T, 2 * d, generator=g, dtype=torch.float64) - 0.3  # two sets against q0
        vs = [q0 @ q0_keys[:, None, :, p * d : (p + 1) * d].transpose(-1, -2) * m for p in range(2)]
        host = masked_moments(q, q0, rotations, keys, q0_keys, window, block)
        device = masked_moments(q, q0, rotations, keys, q0_keys, window, block, batched=True)
        want = {
            "qq": torch.stack([torch.stack([(xa * xb).sum((-1, -2)) for xb in xs], -1) for xa in xs], -2),
            "qg": torch.stack([(xa * gD).sum((-1, -2)) for xa in xs], -1),
            "gg": (gD * gD).sum((-1, -2)),
            "qv": torch.stack([torch.stack([(xa * v).sum((-1, -2)) for v in vs], -1) for xa in xs], -2),
            "vv": torch.stack([torch.stack([(va * vb).sum((-1, -2)) for vb in vs], -1) for va in vs], -2),
            "q_rows": torch.stack([xa.sum(-1) for xa in xs], 2),
            "g_rows": gD.sum(-1),
            "v_rows": torch.stack([v.sum(-1) for v in vs], 2),
            "q_col0": torch.stack([xa[..., 0] for xa in xs], 2),
            "g_col0": gD[..., 0],
            "v_col0": torch.stack([v[..., 0] for v in vs], 2),
        }
        for name, value in want.items():
            for layout, got in (("host", host), ("device", device)):
                np.testing.assert_allclose(
                    getattr(got, name), value, rtol=1e-12, atol=1e-9, err_msg=f"{name} T={T} w={window} {layout}"
                )
        # only the first key sets' sums with g_D: the same numbers, the rest left out
        fewer = masked_moments(q, q0, rotations, keys, q0_keys, window, block, g_sets=2)
        np.testing.assert_allclose(fewer.qg, want["qg"][..., :2], rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(fewer.qq, want["qq"], rtol=1e-12, atol=1e-9)
        shift = torch.tensor([[0.3, -1.0], [2.0, 0.0]], dtype=torch.float64)
        mine = w_sums(q, keys[:, None, :, :d], window, shift)
        for kv in range(n):
            for h_ in range(h):
                dense = (q[kv, h_] @ keys[kv, :, :d].T - shift[kv, h_]) * m
                for part, ref in zip(mine, dense_sums(dense)):
                    np.testing.assert_allclose(part[kv, h_], ref[0], atol=1e-9)


@pytest.mark.parametrize("window", [0, 7, 40, 200])
def test_block_sums_as_a_scan_equal_the_loop(window):
    """over_full's scan (the device layout) and its loop give the same sums over the query blocks each key block
    is counted by in full."""
    blocks = Blocks(300, window, 16, "cpu")
    x = torch.randn(3, blocks.nb, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(window))
    loop = blocks.over_full(x.clone(), 1)
    scan = blocks.over_full(x.clone(), 1, scan=True)
    np.testing.assert_allclose(scan, loop, rtol=1e-13, atol=1e-12)
    # key block c by its definition: the query blocks c < b <= last[c]
    for c in range(blocks.nb - 1):
        want = x[:, c + 1 : int(blocks.last[c]) + 1].sum(1)
        np.testing.assert_allclose(scan[:, c], want, rtol=1e-13, atol=1e-12)


def test_batched_key_chunks_and_kv_heads_give_the_host_layout_sums():
    """Past one key chunk (600 keys) and with several KV heads in one call, the device layout's masked moments
    are the host layout's in float32 products: the same products, summed in another order."""
    g = torch.Generator().manual_seed(3)
    T, n, h, k, d, Ds = 600, 3, 2, 2, 8, (0, 9, 250)
    q = torch.randn(n, h, T, d, generator=g, dtype=torch.float64) + 1
    q0 = torch.randn(n, h, T, d, generator=g, dtype=torch.float64)
    rotations = torch.stack([rotate(torch.eye(d), torch.tensor(D), inv_freq(d)).T for D in Ds]).double()
    keys = torch.randn(n, T, (k + 1) * d, generator=g, dtype=torch.float64) + 0.5
    q0_keys = torch.randn(n, T, 2 * d, generator=g, dtype=torch.float64)
    for window in (0, 100):
        host = masked_moments(q, q0, rotations, keys, q0_keys, window, 32, dtype=torch.float32)
        device = masked_moments(q, q0, rotations, keys, q0_keys, window, 32, dtype=torch.float32, batched=True)
        one = masked_moments(q[1:2], q0[1:2], rotations, keys[1:2], q0_keys[1:2], window, 32, dtype=torch.float32)
        for name in ("qq", "qg", "gg", "qv", "vv"):
            np.testing.assert_allclose(getattr(device, name), getattr(host, name), rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(host.qq[1:2], one.qq, rtol=1e-12)  # a KV head's sums do not see the others


def test_the_device_layout_reads_back_once_and_gives_the_host_layout_numbers():
    """Decomposer(batched=True): no host read in a layer's path outside the bound windows where the host layout
    takes dozens (the statistics are copied once per window, Decomposer.to_host), and every statistic, the bound's
    included, within rounding of the host layout's (Method B by the factorised normal matrix, not conjugate
    gradients)."""
    from posgen.bench.ops import count

    q, k, kv = random_qk(H=4, H_kv=2, T=80, d=16, seed=5)
    rope = LayerRope(inv_freq(16, 500.0).numpy(), 0.25, 1.0, 0)  # as a RopeTable's row: numpy
    heldout = k.flip(1).numpy()
    runs = {}
    for batched in (False, True):
        dec = Decomposer([0, 20, 60], 20, batched=batched)
        dec.unit(q, k, kv, rope, heldout_k=heldout)  # designs and band factors cached
        runs[batched] = dec.unit(q, k, kv, rope, heldout_k=heldout)
        runs[batched, "syncs"] = count(lambda: dec.statistics(q, k, kv, rope, False, heldout))["syncs"]
    assert runs[True, "syncs"] == 0 and runs[False, "syncs"] > 20  # the per-layer path; to_host reads once
    assert runs[True].keys() == runs[False].keys()
    for name, value in runs[False].items():
        np.testing.assert_allclose(runs[True][name], value, rtol=1e-7, atol=1e-9, err_msg=name)
    assert runs[True]["lstsq_residual"].max() < 1e-11


def test_conjugate_gradients_reading_their_residual_every_few_steps_reach_the_same_fit():
    g = torch.Generator().manual_seed(2)
    T = 300
    q = torch.randn(2, T, 8, dtype=torch.float64, generator=g) + 1.0
    k = torch.randn(1, T, 8, dtype=torch.float64, generator=g) + torch.linspace(0, 2, T)[:, None]
    fits = []
    for every in (1, 5):
        design = AdditiveDesign(T, 64, "with", "cpu", check_every=every)
        fits.append(design.fit(*design.rhs(w_sums(q, k, 64, torch.zeros(2, dtype=torch.float64))), tol=1e-11))
    for (_, resid, sums), every in zip(fits, (1, 5)):
        assert float(resid.max()) < 1e-11, every
    np.testing.assert_allclose(fits[1][2]["sum_yy"], fits[0][2]["sum_yy"], rtol=1e-10)


def test_band_factors_are_rope_angles_and_refuse_other_matrices():
    """g_D^2 takes R_D per band as a complex factor: RoPE's rotation by D theta_l (times a scale) is
    exp(i D theta_l); a matrix that mixes bands, or a reflection, is refused rather than summed wrongly."""
    d, Ds = 8, (0, 3, 70)
    theta = inv_freq(d)
    rotations = torch.stack([rotate(torch.eye(d), torch.tensor(D), theta, 1.3).T for D in Ds]).double()
    w = band_factors(rotations)
    want = 1.3 * torch.exp(1j * torch.tensor(Ds, dtype=torch.float64)[:, None] * theta.double()[None])
    np.testing.assert_allclose(w.numpy(), want.numpy(), rtol=0, atol=1e-6)
    mixed = rotations.clone()
    mixed[1, 0, 1] = 0.5  # band 0 reads band 1
    reflected = rotations.clone()
    reflected[2, d // 2 :, d // 2 :] *= -1  # cos -> -cos in the second dim of every band: not a rotation
    for bad in (mixed, reflected):
        with pytest.raises(ValueError, match="not a rotation"):
            band_factors(bad)


@pytest.mark.parametrize("window,sink", [(0, "with"), (0, "without"), (5, "with"), (5, "without")])
def test_design_products_match_dense_mask(window, sink):
    T = 12
    design = AdditiveDesign(T, window, sink, "cpu")
    M = MaskInfo(T, window).bool(sink).double()
    nd = design.n_delta
    nab, nac = torch.zeros(nd, T, dtype=torch.float64), torch.zeros(nd, T, dtype=torch.float64)
    for dl in range(nd):
        nab[dl, dl:] = nac[dl, : T - dl] = torch.diagonal(M, -dl)
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(2, n, dtype=torch.float64, generator=g) for n in (nd, T, T))
    for got, want in (
        (design.nab(b), b @ nab.T),
        (design.nab_t(a), a @ nab),
        (design.nac(c), c @ nac.T),
        (design.nac_t(a), a @ nac),
        (design.m(c), c @ M.T),
        (design.m_t(b), b @ M),
    ):
        np.testing.assert_allclose(got, want, atol=1e-12)


def write_store(path, q, k, kv_group, theta, window=0, n_samples=2):
    """qk.h5 with the same layer params for every layer (or ``theta (L, band)`` per layer); odd layers have the
    sliding ``window``; q (N, L, H, T, d), k (N, L, H_kv, T, d)."""
    N, L, H, T, d = q.shape
    rope = toy_rope(
        theta if np.ndim(theta) == 2 else np.tile(theta, (L, 1)),  # one row per layer, or shared
        kv_group,
        scaling=d**-0.5,
        sliding_window=np.array([window if layer % 2 else 0 for layer in range(L)]),
    )
    return write_qk_store(path, q, k, rope)


def test_store_to_netcdf(tmp_path):
    g = np.random.default_rng(0)
    N, L, H, Hkv, T, d = 2, 2, 4, 2, 20, 8
    q = g.standard_normal((N, L, H, T, d)).astype(np.float32)
    k = (g.standard_normal((N, L, Hkv, T, d)) + 1).astype(np.float32)
    theta = inv_freq(d).numpy()
    qk = write_store(tmp_path / "qk.h5", q, k, np.array([0, 0, 1, 1]), theta, window=6)
    decompose_store(
        qk,
        tmp_path / "decomposition.nc",
        DecompositionOptions.defaults(dummy_distances=[0, 50], dummy_distance=50, bound_samples=0, device="cpu"),
        config_hash="abc",
        progress=False,
    )
    ds = xr.open_dataset(tmp_path / "decomposition.nc", engine="h5netcdf")
    assert dict(ds.sizes) == {"sample": N, "layer": L, "head": H, "method": 4, "sink": 2, "basis": 2, "D": 2}
    assert ds["r"].dims == ("sample", "layer", "head", "method", "sink")
    assert ds["r_sweep"].dims == ("sample", "layer", "head", "sink", "D")
    for name in ("err_abs_mean", "bound_mean", "bound_slack_min", "lstsq_residual"):
        assert ds[name].dims == ("sample", "layer", "head", "sink"), name
    for name in ("n", "sum_x", "sum_y", "sum_xx", "sum_yy", "sum_xy", "r_f", "r_g", "r2_f", "r2_g"):
        assert ds[name].dims == ("sample", "layer", "head", "method", "sink"), name
    for name in ("q_position_share", "k_position_share"):
        assert ds[name].dims == ("sample", "layer", "head", "basis", "sink"), name
    assert list(ds["method"].values) == ["A", "B", "A-drift", "A-shared"] and list(ds["sink"].values) == [
        "with",
        "without",
    ]
    assert list(ds["basis"].values) == ["linear", "smooth"] and ds.attrs["smooth_degree"] == 8
    assert ds.attrs["dummy_distance"] == 50 and ds.attrs["config_hash"] == "abc" and ds.attrs["model"] == "toy"
    np.testing.assert_allclose(ds["r2_f"], ds["r_f"] ** 2)
    # the layer-1 slice is the windowed one and equals a direct call
    ref = Decomposer([0, 50], 50).unit(q[1, 1], k[1, 1], [0, 0, 1, 1], LayerRope(torch.tensor(theta), d**-0.5, 1.0, 6))
    np.testing.assert_allclose(ds["r"].values[1, 1], ref["r"], atol=1e-12)
    np.testing.assert_allclose(ds["n"].values[1, 1, :, 0, 0], sum(min(i + 1, 6) for i in range(T)))


def test_bad_inputs_are_named(tmp_path):
    q, k, kv = random_qk()
    options = DecompositionOptions.defaults(dummy_distances=[0], dummy_distance=0, bound_samples=0)
    with pytest.raises(ValueError, match="shapes disagree"):
        Decomposer([0], 0).unit(q, k[:, :10], kv, LayerRope(inv_freq(8), 0.3))
    with pytest.raises(FileNotFoundError, match="missing.h5"):
        decompose_store(tmp_path / "missing.h5", tmp_path / "out.nc", options)
    xr.Dataset({"q": (("sample",), np.zeros(1))}).to_netcdf(tmp_path / "bad.h5", engine="h5netcdf")
    with pytest.raises(KeyError, match="missing variable.*inv_freq"):
        decompose_store(tmp_path / "bad.h5", tmp_path / "out.nc", options)


def test_bound_violation_is_reported(monkeypatch):
    """A broken error (here: the bound's key factors halved) must stop the run, naming head and sink."""
    import posgen.decomposition.bound as dec_mod

    q, k, kv = random_qk(H=2, H_kv=1, T=32, d=8)
    original = dec_mod.band_norms

    def halved(x):
        out = original(x)
        return out * 0.5 if x.shape[0] == 1 else out  # only the key side (1 KV head)

    monkeypatch.setattr(dec_mod, "band_norms", halved)
    with pytest.raises(RuntimeError, match="bound of method.md section 5 violated: head"):
        Decomposer([3], 3).unit(q, k, np.zeros(2, int), LayerRope(inv_freq(8), 0.3))


def test_head_order_is_kept_for_interleaved_kv_groups():
    """Query heads listed in any order against their KV heads: every statistic follows its head."""
    q, k, kv = random_qk(H=6, H_kv=3, T=20, d=8, seed=3)
    rope = LayerRope(inv_freq(8), 8**-0.5, 1.0, 9)
    dec = Decomposer([0, 12], 12, block=8)
    ref = dec.unit(q, k, kv, rope)
    perm = np.array([4, 0, 3, 5, 1, 2])  # kv[perm] = [2, 0, 1, 2, 0, 1]: interleaved
    res = dec.unit(q[perm], k, kv[perm], rope)
    for name, value in ref.items():
        np.testing.assert_allclose(res[name], value[perm], rtol=1e-9, atol=1e-12, err_msg=name)


def test_uneven_kv_groups_are_named():
    q, k, _ = random_qk(H=3, H_kv=2, T=12, d=8)
    with pytest.raises(ValueError, match=r"kv_group \[0, 0, 1\]: every KV head must serve the same number"):
        Decomposer([0], 0).unit(q, k, np.array([0, 0, 1]), LayerRope(inv_freq(8), 0.3))


# ------------------------------------------------------------------------------------------- layer types


def test_layer_type_and_dummy_distance_rules():
    theta = inv_freq(8).numpy()
    partial = np.where(np.arange(4) < 2, theta, 0.0)  # partial rotary: two bands rotate, two never
    assert layer_type(theta, 0, 64) == "global"
    assert layer_type(theta, 64, 64) == "global"  # a window that covers the sequence is no window
    assert layer_type(theta, 16, 64) == "sliding"
    assert layer_type(partial, 16, 64) == "sliding"
    assert layer_type(np.zeros(4), 0, 64) == "nope"
    assert layer_type(np.zeros(4), 16, 64) == "nope"  # no rotation at all: nope, windowed or not
    assert used_dummy_distance(1000, 0, 64) == 1000
    assert used_dummy_distance(1000, 16, 64) == 15  # min(D, window - 1)
    assert used_dummy_distance(10, 16, 64) == 10
    assert used_dummy_distance(1000, 512, 64) == 1000  # the window never binds: a global layer


def test_windowed_layer_is_scored_inside_its_window_and_nope_is_labelled(tmp_path):
    """Layer 1 (window 6) gets D = 5 for r, r_g, the bound and every D of the sweep above it; layer 2 (inv_freq 0)
    is 'nope' and Method A is exact there (A = W: no rotation, so the dummy distance changes nothing)."""
    g = np.random.default_rng(1)
    N, L, H, Hkv, T, d = 2, 3, 4, 2, 20, 8
    q = g.standard_normal((N, L, H, T, d)).astype(np.float32)
    k = (g.standard_normal((N, L, Hkv, T, d)) + 1).astype(np.float32)
    theta = np.tile(inv_freq(d).numpy(), (L, 1))
    theta[2] = 0.0  # a NoPE layer, as a store marks it: every band at frequency 0
    kv = np.array([0, 0, 1, 1])
    qk = write_store(tmp_path / "qk.h5", q, k, kv, theta, window=6)
    ds = decompose_store(
        qk,
        tmp_path / "dec.nc",
        DecompositionOptions.defaults(dummy_distances=[0, 5, 50], dummy_distance=50, bound_samples=0, device="cpu"),
        progress=False,
    )
    back = xr.open_dataset(tmp_path / "dec.nc", engine="h5netcdf")
    assert list(back["layer_type"].values) == ["global", "sliding", "nope"]
    assert back["dummy_distance_used"].values.tolist() == [50, 5, 50]
    assert back.attrs["dummy_distance"] == 50
    for s_ in range(N):
        for layer, D0 in ((0, 50), (1, 5)):
            window = 6 if layer == 1 else 0
            rope = LayerRope(torch.tensor(theta[layer]), d**-0.5, 1.0, window)
            sweep = [min(D, D0) for D in (0, 5, 50)]  # the sliding layer's sweep at min(D, window - 1)
            ref = direct(torch.from_numpy(q[s_, layer]), torch.from_numpy(k[s_, layer]), kv, rope, sweep, D0)
            for h in range(H):
                for si, sink in enumerate(SINKS):
                    np.testing.assert_allclose(ds["r"].values[s_, layer, h, 0, si], ref[h, sink, "r_A"], atol=2e-6)
                    np.testing.assert_allclose(ds["r_g"].values[s_, layer, h, 0, si], ref[h, sink, "r_g"], atol=2e-6)
                    np.testing.assert_allclose(ds["r"].values[s_, layer, h, 2, si], ref[h, sink, "r_drift"], atol=1e-6)
                    np.testing.assert_allclose(
                        ds["r_sweep"].values[s_, layer, h, si], ref[h, sink, "r_sweep"], atol=2e-6
                    )
                    np.testing.assert_allclose(
                        ds["bound_mean"].values[s_, layer, h, si], ref[h, sink, "bound"], rtol=2e-5
                    )
    # the sliding layer's r is its sweep at D = 5, and its sweep at D = 50 is scored at 5 too (issue 50); the
    # global layer's sweep at 50 is not its sweep at 5
    r_a = ds["r"].sel({"method": "A"})  # a dict: method= is a keyword of sel()
    for D in (5, 50):
        np.testing.assert_allclose(r_a.isel(layer=1), ds["r_sweep"].sel(D=D).isel(layer=1), atol=1e-12)
    assert np.abs(r_a.isel(layer=0) - ds["r_sweep"].sel(D=5).isel(layer=0)).max() > 1e-3
    # NoPE: f + g = W exactly at every D
    np.testing.assert_allclose(r_a.isel(layer=2), 1.0, atol=1e-6)
    np.testing.assert_allclose(ds["r_sweep"].isel(layer=2), 1.0, atol=1e-6)
    np.testing.assert_allclose(ds["err_abs_mean"].isel(layer=2), 0.0, atol=1e-5)


def test_tiny_gemma3_labels_layer_types_and_scores_sliding_layers_inside_the_window(tiny_source, tmp_path):
    """A tiny Gemma 3 (sliding window 16 on layers 0 and 1, layer 2 global) through extraction and decomposition."""
    from posgen.corpus import cut_windows, load_text
    from posgen.llm.extract import extract
    from posgen.llm.options import ExtractOptions
    from posgen.models import acquire, load_model
    from posgen.store import open_dataset, write_netcdf
    from posgen.testing.tiny import tiny_job

    acquire(f"local:{tiny_source('gemma3')}", tmp_path / "model")
    _, tokenizer, _ = load_model(tmp_path / "model")
    write_netcdf(cut_windows(load_text("embedded"), tokenizer, 2, 40, 0, "embedded"), tmp_path / "windows.h5")
    extract(
        tiny_job(tmp_path / "model", tmp_path / "windows.h5", tmp_path / "qk.h5", model="g", variant="trained"),
        ExtractOptions.defaults(),
    )
    qk = open_dataset(tmp_path / "qk.h5", lazy=False)
    assert qk["sliding_window"].values.tolist() == [16, 16, 0]
    assert list(layer_types(qk)) == ["sliding", "sliding", "global"]
    qk.close()
    ds = decompose_store(
        tmp_path / "qk.h5",
        tmp_path / "dec.nc",
        DecompositionOptions.defaults(dummy_distances=[0, 15, 100], dummy_distance=100, bound_samples=0, device="cpu"),
        progress=False,
    )
    assert list(ds["layer_type"].values) == ["sliding", "sliding", "global"]
    assert ds["dummy_distance_used"].values.tolist() == [15, 15, 100]
    r_a = ds["r"].sel({"method": "A"})  # a dict: method= is a keyword of sel()
    for layer, D in ((0, 15), (1, 15), (2, 100)):
        np.testing.assert_allclose(r_a.isel(layer=layer), ds["r_sweep"].sel(D=D).isel(layer=layer), atol=1e-12)
    # the sliding layers' sweep at D = 100 (outside the window) is scored at 15, their own D; the global layer's
    # sweep at 15 is another number
    np.testing.assert_allclose(r_a.isel(layer=0), ds["r_sweep"].sel(D=100).isel(layer=0), atol=1e-12)
    assert np.abs(r_a.isel(layer=2) - ds["r_sweep"].sel(D=15).isel(layer=2)).max() > 1e-3


def test_bench_times_each_step_and_leaves_the_decomposer_unwrapped(capsys):
    """python -m posgen.bench decompose: per-step seconds that add up to the total, printed side by side."""
    from posgen.bench import decompose as bench
    from posgen.bench.steps import STEPS
    from posgen.decomposition.decomposer import Decomposer as Unwrapped

    methods = {attr: Unwrapped.__dict__[attr] for attr in STEPS.values()}
    argv = ["--tokens", "40", "--heads", "2", "--kv-heads", "1", "--head-dim", "8", "--rounds", "1"]
    report = bench.main(argv + ["--dummy-distances", "0", "5", "--dummy-distance", "5", "--device", "cpu"])
    steps = report["steps"]
    assert list(steps) == [*STEPS, "rest", "total"]
    assert steps["bound"]["first_call_s"] > 0 and steps["bound"]["with_bound_s"] > 0 and steps["bound"]["s"] == 0
    parts = sum(steps[name]["with_bound_s"] for name in steps if name != "total")
    assert parts == pytest.approx(steps["total"]["with_bound_s"], abs=1e-4)
    assert steps["total"]["s"] == report["decomposition_s"]
    assert "every sample" in capsys.readouterr().err
    assert {attr: Unwrapped.__dict__[attr] for attr in STEPS.values()} == methods


@pytest.mark.parametrize("window", [0, 300])
def test_sampled_rows_estimate_the_error_within_its_stated_error(window):
    """``bound_rows``: the entry pass over evenly spaced row blocks only. The mean |error| of A is a ratio
    estimate within a few stated standard errors of the exact one; the bound's minimum slack over the entries
    taken is no lower than over all; the mean bound stays exact; every row taken is the exact pass again."""
    q, k, kv = random_qk(H=4, H_kv=2, T=1500, d=16, seed=3)
    rope = LayerRope(inv_freq(16), 0.25, 1.0, window)
    block_elems = 2**15  # tiles of 32 rows by 64 columns at T = 1500: 200 rows are 7 of the 47 row blocks
    exact = Decomposer([0, 50], 50, block_elems=block_elems).unit(q, k, kv, rope)
    for rows, check in ((200, "sampled"), (1500, "all")):
        got = Decomposer([0, 50], 50, block_elems=block_elems, bound_rows=rows).unit(q, k, kv, rope)
        np.testing.assert_allclose(got["bound_mean"], exact["bound_mean"], rtol=1e-12)
        if check == "all":
            np.testing.assert_allclose(got["err_abs_mean"], exact["err_abs_mean"], rtol=1e-9)
            assert np.all(got["err_abs_se"] == 0) and np.array_equal(got["bound_slack_min"], exact["bound_slack_min"])
            continue
        assert np.all(got["err_abs_se"] > 0)
        z = np.abs(got["err_abs_mean"] - exact["err_abs_mean"]) / got["err_abs_se"]
        assert z.max() < 4, z
        assert np.all(got["bound_slack_min"] >= exact["bound_slack_min"])
        assert np.all(np.abs(got["err_abs_mean"] / exact["err_abs_mean"] - 1) < 0.05)


def test_decomposition_options_take_the_schema_defaults_and_refuse_unknown_keys():
    from posgen.config import schema_default, schema_defaults

    options = DecompositionOptions.defaults(dummy_distance=500, device="cpu")
    section = schema_defaults("decomposition")
    assert options.dummy_distance == 500 and options.device == "cpu"
    assert options.dummy_distances == tuple(section["dummy_distances"]) and options.lstsq_tol == section["lstsq_tol"]
    assert DecompositionOptions.defaults().device == schema_default("device")
    # from a rule's params (a mapping with the section's keys and device); the value is hashable and frozen
    assert DecompositionOptions.of({**section, "dummy_distance": 500, "device": "cpu"}) == options
    assert hash(options) == hash(DecompositionOptions.defaults(dummy_distance=500, device="cpu"))
    with pytest.raises(TypeError, match="unknown dummy_distanse"):
        DecompositionOptions.defaults(dummy_distanse=500)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.dummy_distance = 1


@pytest.mark.parametrize("precision, tol", [("float64", 1e-7), ("float32", 1e-5)])
@pytest.mark.parametrize("batched", [False, True], ids=["host", "device"])
def test_row_centred_r_ignores_a_constant_added_to_each_query_row(batched, precision, tol):
    """A key component u in a band that does not rotate (inv_freq 0) adds q_i . u to every entry of row i: a
    constant per row (and so, for a query that is the same in every row, per head). Softmax cannot see it: the
    row-centred r and its sums (which make the pooled r) stay put (to 1e-7 with float64 products, the inputs being
    rotated in float32; to 1e-5 with
    the default float32 products, whose rounding grows with the offsets), while the raw r moves."""
    q, k, kv = random_qk(H=4, H_kv=2, T=30, d=8, seed=3)
    theta = inv_freq(8).clone()
    theta[-1] = 0.0  # band 3 (dims 3 and 7) does not rotate
    rope = LayerRope(theta, 8**-0.5, 1.0, 0)
    dec = Decomposer((0, 5, 30), 5, device="cpu", block=8, batched=batched, precision=precision)
    before = dec.unit(q, k, kv, rope, with_bound=False)
    shifted = k.clone()
    shifted[..., 3] += 5.0
    shifted[..., 7] -= 3.0
    after = dec.unit(q, shifted, kv, rope, with_bound=False)
    for name in ("r_rc", "r_sweep_rc", "rc_sum_xx", "rc_sum_yy", "rc_sum_xy"):
        scale = np.nanmax(np.abs(before[name]))  # A-shared is NaN: no held-out windows here
        np.testing.assert_allclose(after[name], before[name], rtol=0, atol=tol * scale, err_msg=name)
    assert np.abs(after["r"][:, :2] - before["r"][:, :2]).max() > 1e-3  # the raw r of A and B saw the offsets
