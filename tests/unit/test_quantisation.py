"""The quantisation bound (posgen.llm.quantisation): each block's step recovered from de-quantised weights, noise
of the rounding's variance on exactly the matrices asked for, and the study's numbers on a tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posgen import quantisation_study
from posgen.llm import quantisation


def four_bit(rows: int, cols: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A de-quantised Q4_1 matrix: per block of 32, w = d q + m with levels q in 0..15 (both extremes present);
    and the steps d per weight."""
    g = torch.Generator().manual_seed(seed)
    blocks = cols // quantisation.BLOCK
    d = torch.rand(rows, blocks, 1, generator=g, dtype=torch.float64) * 0.1 + 0.01
    m = torch.randn(rows, blocks, 1, generator=g, dtype=torch.float64)
    q = torch.randint(0, 16, (rows, blocks, quantisation.BLOCK), generator=g).double()
    q[..., 0], q[..., 1] = 0, 15
    w = (d * q + m).reshape(rows, cols)
    return w, d.expand(-1, -1, quantisation.BLOCK).reshape(rows, cols)


def test_each_blocks_step_is_recovered_from_its_de_quantised_values():
    w, d = four_bit(6, 96)
    np.testing.assert_allclose(quantisation.block_steps(w), d, rtol=1e-12)
    # a row not a multiple of the block: its last partial block has its own step
    part = quantisation.block_steps(w[:, :80])
    np.testing.assert_allclose(part[:, :64], d[:, :64], rtol=1e-12)
    assert part.shape == (6, 80) and torch.isfinite(part).all()


@pytest.mark.parametrize("which, touched", [("qk", {"q_proj", "k_proj"}), ("every", None)])
def test_the_noise_has_the_rounding_variance_on_the_matrices_asked_for(which, touched):
    """Over many blocks the noise's variance is d^2 / 12 (within 3 %); 'qk' leaves every other weight alone,
    'every' perturbs every matrix and never a 1-D weight (a norm)."""
    layer = torch.nn.ModuleDict(
        {
            "q_proj": torch.nn.Linear(256, 64, bias=False),
            "k_proj": torch.nn.Linear(256, 64, bias=False),
            "o_proj": torch.nn.Linear(256, 64, bias=False),
            "norm": torch.nn.LayerNorm(64),
        }
    ).double()
    for name in ("q_proj", "k_proj", "o_proj"):
        layer[name].weight.data = four_bit(64, 256, seed=len(name))[0]
    before = {n: p.detach().clone() for n, p in layer.named_parameters()}
    count = quantisation.add_rounding_noise(layer, which, seed=3)
    changed = {n.split(".")[0] for n, p in layer.named_parameters() if not torch.equal(p, before[n])}
    assert changed == (touched or {"q_proj", "k_proj", "o_proj"})
    assert count == 64 * 256 * len(changed)
    for name in changed:
        noise = layer[name].weight - before[f"{name}.weight"]
        ratio = float(
            (noise.detach() ** 2).mean() / (quantisation.block_steps(before[f"{name}.weight"]) ** 2 / 12).mean()
        )
        assert ratio == pytest.approx(1.0, abs=0.03), name


def test_the_study_compares_every_number_with_the_unperturbed_models(tiny_source, tmp_path):
    """On the tiny Llama: the unperturbed row changes nothing; each perturbed row moves the numbers, by amounts
    the table reports and judges against QUANT_R / QUANT_LOW."""
    table = quantisation_study.study(f"local:{tiny_source('llama')}", 2, 48, seeds=[0], cache=tmp_path / "models")
    assert list(table["noise"]) == ["none", "qk", "every"]
    deltas = [f"d_{name}" for name in quantisation.THRESHOLD]
    assert (table.loc[0, deltas] == 0).all() and table.loc[0, "within"]
    assert (table.loc[1:, deltas].abs().to_numpy().max(axis=1) > 0).all()
    assert table["A_mean_rc"].between(-1, 1).all() and table["low_share_k"].between(0, 1).all()
    assert (table["A_mean_r"] != table["B_mean_r"]).all()  # each method's own rows
