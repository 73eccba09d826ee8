"""Block-swap scores (posgen.llm.block_swap) on hand-built heads whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from posgen.llm.block_swap import (
    BLOCK as BLOCK_DEFAULT,
)
from posgen.llm.block_swap import (
    N_QUERIES,
    agreement,
    block_order,
    block_swap_job,
    block_swap_scores,
    fitted,
    ratio,
    swap_distances,
)
from posgen.store import open_dataset
from posgen.testing.qk_store import toy_rope, write_qk_store

T, D, Q, BLOCK = 80, 8, 16, 8


def test_block_order_moves_whole_blocks_and_keeps_the_sink():
    pi = block_order(50, 8, np.random.default_rng(3))
    assert pi[0] == 0 and sorted(pi) == list(range(51))
    blocks = pi[1:49].reshape(6, 8)  # six whole blocks of 8 keys, in another order; keys 49, 50 stay last
    assert (np.diff(blocks, axis=1) == 1).all() and ((blocks[:, 0] - 1) % 8 == 0).all()
    assert not np.array_equal(blocks[:, 0], np.arange(1, 49, 8)) and list(pi[49:]) == [49, 50]


def _distances(q, k, inv_freq):
    pi = block_order(T - Q - 1, BLOCK, np.random.default_rng(0))
    return swap_distances(torch.as_tensor(q), torch.as_tensor(k), torch.as_tensor(inv_freq), 0.5, 1.0, pi, Q)


def test_a_head_that_reads_only_positions_scores_one():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, T, D)).astype(np.float32)
    k = np.broadcast_to(rng.standard_normal(D).astype(np.float32), (2, T, D)).copy()  # every key the same vector
    d_pos, d_sym, d_pos_head, d_sym_head = _distances(q, k, np.array([1.0, 0.3, 0.05, 0.01], np.float32))
    assert d_pos_head.max() < 1e-6 * d_sym_head.min()
    np.testing.assert_allclose(ratio(d_sym_head.numpy(), d_pos_head.numpy()), 1.0, atol=1e-6)
    np.testing.assert_allclose(ratio(d_sym.numpy(), d_pos.numpy()), 1.0, atol=1e-6)  # every band too


def test_a_head_that_reads_only_content_scores_zero():
    rng = np.random.default_rng(1)
    q, k = (rng.standard_normal((2, T, D)).astype(np.float32) for _ in range(2))
    _, _, d_pos_head, d_sym_head = _distances(q, k, np.zeros(D // 2, np.float32))  # no rotation: L = s q.k
    assert d_sym_head.max() < 1e-6 * d_pos_head.min()
    np.testing.assert_allclose(ratio(d_sym_head.numpy(), d_pos_head.numpy()), 0.0, atol=1e-6)


def test_bands_are_read_apart_and_a_flat_head_has_no_score():
    """Band 0 turns fast with keys all alike (positional), band 1 does not turn and its keys vary (symbolic):
    their scores are 1 and 0 in the same head. Zero queries give no score at all."""
    rng = np.random.default_rng(2)
    k = rng.standard_normal((1, T, 4)).astype(np.float32)
    k[..., [0, 2]] = 1.0  # band 0 pairs dims 0 and 2: the same in every key
    q = rng.standard_normal((1, T, 4)).astype(np.float32)
    d_pos, d_sym, _, _ = _distances(q, k, np.array([1.0, 0.0], np.float32))
    np.testing.assert_allclose(ratio(d_sym.numpy(), d_pos.numpy())[0], [1.0, 0.0], atol=1e-6)
    flat = _distances(np.zeros_like(q), k, np.array([1.0, 0.0], np.float32))
    assert np.isnan(ratio(flat[3].numpy(), flat[2].numpy())).all()


def test_scores_from_a_stored_window_and_their_agreement(tmp_path):
    """From qk.h5: layer 0 head 0 has one key vector everywhere (positional, 1); layer 1 has no rotation
    (symbolic, 0 for both heads); layer 0 head 1, random q and k under RoPE, lies between."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 2, 2, T, D)).astype(np.float32)
    k = rng.standard_normal((1, 2, 2, T, D)).astype(np.float32)
    k[0, 0, 0] = k[0, 0, 0, 0]  # layer 0, head 0: every key the same
    inv_freq = np.stack([np.array([1.0, 0.3, 0.05, 0.01]), np.zeros(D // 2)]).astype(np.float32)  # layer 1 no RoPE
    rope = toy_rope(inv_freq, np.arange(2), scaling=0.5)
    path = write_qk_store(tmp_path / "qk.h5", q, k, rope)
    scores = block_swap_scores(open_dataset(path), block=BLOCK, n_queries=Q)
    P = scores["positional_score"].values
    assert P[0, 0] == pytest.approx(1.0, abs=1e-6)  # positional
    np.testing.assert_allclose(P[1], 0.0, atol=1e-6)  # layer 1 has no rotation: both heads symbolic
    assert 0.0 < P[0, 1] < 1.0  # random q and k under RoPE: both
    assert (scores.attrs["block"], scores.attrs["n_queries"]) == (BLOCK, Q)
    short = block_swap_scores(open_dataset(path), block=40, n_queries=40)  # scaled to the window of 80 tokens
    assert (short.attrs["n_queries"], short.attrs["block"]) == (20, 14)
    with pytest.raises(ValueError, match="too short"):
        fitted(5, N_QUERIES, BLOCK_DEFAULT)


def test_agreement_is_a_rank_correlation_with_an_interval():
    heads = np.linspace(0, 1, 40).reshape(4, 10)
    a = agreement(heads, heads**2)  # monotone: rho 1
    assert a["rho"] == pytest.approx(1.0) and a["agree"] == 1 and a["heads"] == 40
    b = agreement(heads, np.random.default_rng(0).permutation(heads.ravel()))
    assert b["lo"] < b["rho"] < b["hi"] and (b["agree"] == 1) == (b["lo"] > 0)
    assert agreement(heads, np.where(heads > 0.5, np.nan, heads))["heads"] == 20


def test_the_figure_draws_every_variant_and_every_rotating_band(tmp_path):
    from posgen.figures.block_swap import fig_block_swap

    rng = np.random.default_rng(5)
    inv_freq = np.stack([np.array([1.0, 0.3, 0.05, 0.0])] * 2).astype(np.float32)  # band 3 never turns
    rope = toy_rope(inv_freq, np.arange(2), scaling=0.5)
    parts = []
    for variant in ("trained", "random-seed0"):
        q, k = (rng.standard_normal((1, 2, 2, T, D)).astype(np.float32) for _ in range(2))
        scores = block_swap_scores(open_dataset(write_qk_store(tmp_path / f"{variant}.h5", q, k, rope)), block=BLOCK)
        scores["f_share"] = scores["positional_score"] * 0.5 + 0.25  # monotone in the score: rho 1
        parts.append(scores.expand_dims(variant=[variant]))
    swap = xr.concat(parts, "variant")
    fig = fig_block_swap(swap)
    heads, bands = fig.axes
    assert [t.get_text() for t in heads.get_legend().get_texts()] == ["trained: +1.00", "random-seed0: +1.00"]
    assert [len(line.get_xdata()) for line in bands.get_lines()] == [3, 3]  # the three rotating bands
    assert bands.get_xscale() == "log"


def test_the_job_writes_scores_beside_the_f_share_and_the_table_says_whether_they_agree(tmp_path):
    from posgen.llm.block_swap import reproduction_section
    from posgen.store import write_netcdf

    rng = np.random.default_rng(6)
    q, k = (rng.standard_normal((1, 3, 4, T, D)).astype(np.float32) for _ in range(2))
    k[0, :, :2] = k[0, :, :2, :1]  # heads 0 and 1 of every layer: one key vector (positional)
    rope = toy_rope(np.tile(np.array([1.0, 0.3, 0.05, 0.01], np.float32), (3, 1)), np.arange(4), scaling=0.5)
    qk = write_qk_store(tmp_path / "qk.h5", q, k, rope, attrs={"model": "m", "variant": "trained"})
    dims = ("sample", "layer", "head", "method", "sink")
    r2_f = np.broadcast_to(np.array([0.9, 0.8, 0.3, 0.2])[None, None, :, None, None], (2, 3, 4, 1, 1))
    decomposition = xr.Dataset(
        {"r": (dims, np.full(r2_f.shape, 0.9)), "r2_f": (dims, r2_f), "r2_g": (dims, 1 - r2_f)},
        coords={"method": ["A"], "sink": ["without"]},
    )
    write_netcdf(decomposition, tmp_path / "decomposition.nc")
    out = block_swap_job(qk, tmp_path / "decomposition.nc", tmp_path / "block_swap.nc", config_hash="h")
    np.testing.assert_allclose(out["f_share"].values, np.tile([0.9, 0.8, 0.3, 0.2], (3, 1)))
    np.testing.assert_allclose(out["positional_score"].values[:, :2], 1.0, atol=1e-6)
    row = [line for line in reproduction_section([tmp_path / "block_swap.nc"]).splitlines() if line.startswith("| m ")]
    assert row and row[0].startswith("| m | trained | 1 x 80 | ") and row[0].endswith(" | 12 | agree |")
