"""float32 moments keep float64 accuracy (docs/method.md section 4, "Precision").

Synthetic heads whose logits have mean^2 / variance of 1, 10, 100 and 1000 over a 4096-token window: a plain
float32 product loses the variance to cancellation there (its error grows with that ratio), the centred float32
products with their mean parts in float64 must not. Every r, r_f, r_g, the sweep and Method B's r and sums from
``precision="float32"`` agree with the float64 path to 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posgen.decomposition import Decomposer
from posgen.decomposition.moments import masked_moments
from posgen.rope_table import LayerRope

RATIOS = (1.0, 10.0, 100.0, 1000.0)  # mean^2 / variance of each head's logits, one head per ratio
T, D_HEAD = 4096, 64


def inv_freq(d: int, base: float = 10000.0) -> np.ndarray:
    return (base ** (-np.arange(d // 2) / (d // 2))).astype(np.float32)


def heads_with_mean(ratios, n_tokens: int, d: int, seed: int = 0):
    """q (H, T, d), k (H, T, d), one KV head per query head: noise of unit variance per dim plus a mean ``m`` in
    the slowest band of both, which R_(i-j) leaves nearly unrotated over the window, so the logits' mean is
    about ``m^2`` and their variance ``d + 2 m^2``: ``m^2`` solves ``m^4 = ratio (d + 2 m^2)``."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((len(ratios), n_tokens, d))
    k = rng.standard_normal((len(ratios), n_tokens, d))
    for h, ratio in enumerate(ratios):
        m2 = ratio + np.sqrt(ratio * ratio + ratio * d)
        for x in (q, k):
            x[h, :, d // 2 - 1] += np.sqrt(m2)  # band d/2 - 1: dims d/2 - 1 and d - 1, the slowest
    return q.astype(np.float32), k.astype(np.float32)


def logit_ratio(res: dict) -> np.ndarray:
    """mean^2 / variance of W per head over the 'with' entries, from the float64 sums."""
    n, s_x, s_xx = (res[name][:, 0, 0] for name in ("n", "sum_x", "sum_xx"))
    mean = s_x / n
    return mean**2 / (s_xx / n - mean**2)


@pytest.fixture(scope="module")
def both():
    q, k = heads_with_mean(RATIOS, T, D_HEAD)
    rope = LayerRope(inv_freq(D_HEAD, 500000.0), D_HEAD**-0.5)  # its slowest band turns 0.01 rad over T
    kv = np.arange(len(RATIOS))
    ref = Decomposer([0, 250, 1000], 1000, device="cpu", precision="float64")
    fast = Decomposer([0, 250, 1000], 1000, device="cpu", precision="float32")
    fast._designs = ref._designs  # Method B's factorisation depends on the mask alone: build it once
    heldout = np.ascontiguousarray(k[:, ::-1])  # a held-out mean key unlike the window's: Method A-shared scored too
    return (
        ref.unit(q, k, kv, rope, with_bound=False, heldout_k=heldout),
        fast.unit(q, k, kv, rope, with_bound=False, heldout_k=heldout),
    )


def test_the_heads_span_the_ratios(both):
    ref, _ = both
    ratio = logit_ratio(ref)
    assert np.all(ratio > 0.5 * np.array(RATIOS)) and np.all(ratio < 2.0 * np.array(RATIOS)), ratio


@pytest.mark.parametrize("name", ["r", "r_f", "r_g", "r_sweep"])
def test_float32_r_equals_float64(both, name):
    ref, fast = both
    finite = np.isfinite(ref[name])
    assert finite.any() and np.array_equal(finite, np.isfinite(fast[name]))
    assert np.abs(fast[name][finite] - ref[name][finite]).max() < 1e-5


def test_float32_sums_equal_float64(both):
    """The sufficient statistics of every method (Method B's fit included) to 1e-9 of their scale: the variance
    from them then carries no cancellation error, even at mean^2 / variance 1000."""
    ref, fast = both
    for name in ("sum_x", "sum_y", "sum_xx", "sum_yy", "sum_xy"):
        scale = np.abs(ref["sum_xx"]).max()
        assert np.abs(fast[name] - ref[name]).max() < 1e-9 * scale, name


def test_raw_float32_sums_would_fail():
    """The test above would have caught the drop-in: float32 sums of the raw products lose W's variance at
    mean^2 / variance 1000 by far more than the centred products do."""
    n_tok = 1024
    q, k = heads_with_mean([1000.0], n_tok, D_HEAD)
    q64, k64 = torch.from_numpy(q).double(), torch.from_numpy(k).double()  # (1, T, d)
    counted = torch.ones(n_tok, n_tok, dtype=torch.bool).tril()
    w64 = (q64[0] @ k64[0].T)[counted]  # the counted logits, float64
    w32 = (q64[0].float() @ k64[0].float().T)[counted]  # the same, float32
    reference = float(w64.var(correction=0))
    raw = float((w32 * w32).mean() - w32.mean() ** 2)  # float32 second moment less the squared mean
    rot = torch.eye(D_HEAD, dtype=torch.float64)[None]
    keys = torch.cat([k64, torch.zeros_like(k64)], -1)  # the W set, then a g set of zeros
    m = masked_moments(q64[None], q64[None], rot, keys, torch.zeros_like(k64), 0, dtype=torch.float32)
    mean = float(m.q_rows[0, 0, 0].sum()) / len(w64)
    centred = float(m.qq[0, 0, 0, 0]) / len(w64) - mean**2
    assert abs(centred / reference - 1) < 1e-7
    assert abs(raw / reference - 1) > 1e-5  # the tolerance of the r tests above


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("flag", "torch.backends.cuda.matmul.allow_tf32 = True"),
        ("precision", "torch.set_float32_matmul_precision('high')"),
        ("env", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1"),
    ],
)
def test_the_decomposition_refuses_tf32_in_one_line_naming_the_setting(setting, named, monkeypatch):
    """TF32 rounds float32 products to a 10-bit mantissa, far outside the 1e-5 the statistics are checked to: each
    way of allowing it stops the analysis before it runs (issue 52 item 4), and its default runs."""
    from posgen.device import PrecisionError

    Decomposer([100], 100)  # the defaults: full float32
    before = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    try:
        if setting == "flag":
            torch.backends.cuda.matmul.allow_tf32 = True
        elif setting == "precision":
            torch.set_float32_matmul_precision("high")
        else:
            monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
        with pytest.raises(PrecisionError) as info:
            Decomposer([100], 100)
    finally:
        torch.set_float32_matmul_precision(before[1])
        torch.backends.cuda.matmul.allow_tf32 = before[0]
        monkeypatch.delenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", raising=False)
    assert "\n" not in str(info.value) and named in str(info.value), str(info.value)
    Decomposer([100], 100)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CPU-vs-CUDA parity runs on a GPU only")
def test_cuda_equals_the_cpu_float64_reference_with_the_bound_and_a_shared(both):
    """The same unit on CUDA (float32 products, the bound and Method A-shared on) against the CPU's float64
    reference: every r within 1e-5, and the bound holding at every entry (issue 52 item 4). Skipped without CUDA."""
    ref, _ = both
    q, k = heads_with_mean(RATIOS, T, D_HEAD)
    rope = LayerRope(inv_freq(D_HEAD, 500000.0), D_HEAD**-0.5)
    gpu = Decomposer([0, 250, 1000], 1000, device="cuda", precision="float32")
    heldout = np.ascontiguousarray(k[:, ::-1])
    res = gpu.unit(q, k, np.arange(len(RATIOS)), rope, with_bound=True, heldout_k=heldout)
    for name in ("r", "r_f", "r_g", "r_sweep"):
        finite = np.isfinite(ref[name])
        assert np.array_equal(finite, np.isfinite(res[name])), name
        assert np.abs(res[name][finite] - ref[name][finite]).max() < 1e-5, name
    # check_bound raised inside unit() had any entry broken the bound; its slack is recorded
    assert np.isfinite(res["bound_slack_min"]).all()
