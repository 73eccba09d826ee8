"""The bound check's rounding tolerance (docs/method.md section 5): the float32 rotation angles move a logit by
less than ``angle_rtol`` times |q| |k|, and the check uses it beside ``BOUND_RTOL``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posgen.decomposition.bound import BOUND_RTOL, angle_rtol, bound_tolerance, check_bound
from posgen.rope import rotate


def _rotate64(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    theta = positions.double()[:, None] * inv_freq.double()[None]  # (T, band), exact angles
    half = x.shape[-1] // 2
    x1, x2 = x.double()[..., :half], x.double()[..., half:]
    return torch.cat((x1 * theta.cos() - x2 * theta.sin(), x2 * theta.cos() + x1 * theta.sin()), -1)


@pytest.mark.parametrize("n_tokens", [1200, 8192, 32768])
def test_float32_angles_move_a_logit_by_less_than_the_angle_term(n_tokens):
    torch.manual_seed(0)
    d = 64
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # theta_max = 1
    q = torch.randn(4, d)  # (query, dim): the last positions, where the angles are largest
    k = torch.randn(n_tokens, d)  # (key, dim)
    i = torch.arange(n_tokens - 4, n_tokens)
    j = torch.arange(n_tokens)
    as_model = rotate(q, i, inv_freq).double() @ rotate(k, j, inv_freq).double().T  # (4, T) float32 angles
    exact = _rotate64(q, i, inv_freq) @ _rotate64(k, j, inv_freq).T  # (4, T)
    moved = ((as_model - exact).abs() / (q.norm(dim=-1)[:, None] * k.norm(dim=-1)[None])).max().item()
    assert moved < angle_rtol(n_tokens, inv_freq.numpy())
    assert angle_rtol(n_tokens, inv_freq.numpy()) == pytest.approx(2.0**-23 * n_tokens)
    if n_tokens == 32768:  # at 32k the angles alone take a sizeable part of the products' tolerance
        assert moved > 0.1 * BOUND_RTOL


def test_the_check_allows_the_angle_term_and_no_more():
    n_tokens, head_dim = 32768, 8
    inv_freq = np.array([1.0, 0.1, 0.01, 0.001])
    ops = SimpleNamespace(
        rope=SimpleNamespace(scaling=1.0, attention_scaling=1.0, inv_freq=inv_freq),
        q=torch.ones(1, n_tokens, head_dim) / head_dim**0.5,  # (head, token, dim): |q| = 1
        k=torch.ones(1, n_tokens, head_dim) / head_dim**0.5,  # |k| = 1
        kv=torch.tensor([0]),
    )
    tol = BOUND_RTOL + angle_rtol(n_tokens, inv_freq)  # the scale s |q|max |k|max is 1 here
    per_head = bound_tolerance(ops).numpy()  # (head,)
    np.testing.assert_allclose(per_head, [tol], rtol=1e-6)
    check_bound(np.array([[-0.9 * tol, 0.0]]), per_head)  # within the rounding of products and angles
    with pytest.raises(RuntimeError, match="bound of method.md section 5 violated: head 0, sink with"):
        check_bound(np.array([[-1.1 * tol, 0.0]]), per_head)
    # the GPU's failure (slack -0.00347 against the products' tolerance -0.00266) is a rounding this term covers
    assert 0.00347 / 0.00266 < tol / BOUND_RTOL
