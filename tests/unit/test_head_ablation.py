"""Per-head ablation on pretrained LLMs (posgen.llm.head_ablation) on a tiny random Llama."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import xarray as xr

from posgen.figures.head_ablation import fig_head_ablation
from posgen.llm import head_ablation as ha
from posgen.llm.options import HeadAblationOptions
from posgen.models import load_model
from posgen.stats import deposit_index, spearman, top_gap
from posgen.testing.tiny import tiny_job


@pytest.fixture(scope="module")
def tiny_dir(tiny_source, tmp_path_factory):
    path = tmp_path_factory.mktemp("head-ablation-model")
    src = tiny_source("llama")
    for f in src.iterdir():
        (path / f.name).write_bytes(f.read_bytes())
    (path / "manifest.json").write_text(json.dumps({"source": f"local:{src}", "revision": "", "files": {}}))
    return path


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    model, tokenizer, _ = load_model(tiny_dir, dtype="float64")
    return model, tokenizer


def _sequence(n_tokens: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(seed).integers(2, 500, n_tokens))


def test_repeat_probe_second_copy_repeats_at_distance_period():
    vocab = np.arange(5, 300)
    period = 17
    probe = ha.repeat_probe(vocab, n_samples=3, period=period, seed=4, bos_id=0)
    assert probe.shape == (3, 1 + 2 * period)
    assert (probe[:, 0] == 0).all()
    body = probe[:, 1:]
    np.testing.assert_array_equal(body[:, period:], body[:, :period])
    for row in body:
        assert len(set(row[:period].tolist())) == period  # distinct: no other look-back distance predicts
        assert np.isin(row, vocab).all()
    # the scored targets lie in the second copy and equal the token `period` positions back
    targets = ha.repeat_targets(period, bos=True)
    assert len(targets) == period - 1
    np.testing.assert_array_equal(probe[:, targets], probe[:, targets - period])
    assert targets.min() == 1 + period + 1 and targets.max() == 2 * period
    # seeded: same seed same probe, other seed other probe
    np.testing.assert_array_equal(probe, ha.repeat_probe(vocab, 3, period, 4, bos_id=0))
    assert not np.array_equal(probe, ha.repeat_probe(vocab, 3, period, 5, bos_id=0))


def test_deposit_index_and_gap_of_constructed_pattern():
    increase = xr.DataArray(
        [[0.6, 0.1, 0.1, -0.2], [0.2, 0.2, 0.2, 0.2], [-0.1, -0.3, -0.2, -0.4]],
        dims=("layer", "head"),
    )
    index = ha.per_layer(deposit_index, increase).values
    np.testing.assert_allclose(index[:2], [0.6 / 0.8, 0.25])
    assert np.isnan(index[2])  # no head increases the loss
    np.testing.assert_allclose(ha.per_layer(top_gap, increase).values, [0.5, 0.0, 0.1])


def test_spearman_is_rank_correlation():
    x = np.array([1.0, 2.0, 3.0, 4.0, np.nan])
    assert spearman(x, np.exp(x)) == pytest.approx(1.0)
    assert spearman(x, -(x**3)) == pytest.approx(-1.0)
    assert spearman(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 3.0, 2.0, 4.0])) == pytest.approx(0.8)


def test_ablating_a_head_with_zero_output_changes_nothing(tiny):
    model, _ = tiny
    ids = _sequence()
    targets = torch.arange(1, len(ids))
    attention = model.model.layers[1].self_attn
    n_heads, head_dim = ha.head_shape(model, attention)
    n_rep = n_heads // model.config.num_key_value_heads
    original = attention.v_proj.weight.detach().clone()
    try:
        with torch.no_grad():
            attention.v_proj.weight[:head_dim] = 0  # KV head 0: query heads 0..n_rep-1 output zero
        base, ablated = ha.ablate_sequence(model, ids, targets)
    finally:
        with torch.no_grad():
            attention.v_proj.weight.copy_(original)
    increase = ablated - base
    assert (increase[1, :n_rep] == 0).all()
    assert (np.abs(increase[1, n_rep:]) > 1e-6).all()
    assert (np.abs(increase[0]) > 1e-6).all()


def test_pre_hook_equals_zeroed_o_proj_columns(tiny):
    model, _ = tiny
    ids = _sequence(seed=1)
    targets = torch.arange(1, len(ids))
    layer, head = 0, 2
    attention = model.model.layers[layer].self_attn
    n_heads, head_dim = ha.head_shape(model, attention)
    with ha.ablated(attention, ha.head_masks([head], n_heads, head_dim, torch.float64, "cpu")):
        hooked = model(ids[None]).logits
    original = attention.o_proj.weight.detach().clone()
    try:
        with torch.no_grad():
            attention.o_proj.weight[:, head * head_dim : (head + 1) * head_dim] = 0
            zeroed = model(ids[None]).logits
    finally:
        with torch.no_grad():
            attention.o_proj.weight.copy_(original)
    assert torch.equal(hooked, zeroed)
    assert not torch.equal(hooked, model(ids[None]).logits)  # the head mattered
    # the hook is gone after the block
    with torch.no_grad():
        clean = float(torch.nn.functional.cross_entropy(model(ids[None]).logits[0, :-1], ids[1:]))
    assert ha.sequence_loss(model, ids, targets) == pytest.approx(clean)


@pytest.mark.parametrize("head_batch", [0, 3])
def test_cached_prefix_equals_naive_forward(tiny, head_batch):
    model, _ = tiny
    ids = _sequence(seed=2)
    targets = torch.arange(20, len(ids))
    base, fast = ha.ablate_sequence(model, ids, targets, head_batch=head_batch)
    naive = ha.ablate_naive(model, ids, targets)
    assert base == pytest.approx(ha.sequence_loss(model, ids, targets), abs=1e-12)
    np.testing.assert_allclose(fast, naive, rtol=0, atol=1e-9)
    assert np.abs(fast - base).max() > 1e-4  # ablations do change the loss


def test_job_writes_dataset_joined_with_decomposition(tiny_dir, tmp_path):
    from posgen.corpus import cut_windows, load_text
    from posgen.store import open_dataset

    model, tokenizer, _ = load_model(tiny_dir)
    windows = cut_windows(load_text("embedded"), tokenizer, n_samples=2, seq_len=24, seed=0)
    windows.to_netcdf(tmp_path / "windows.h5", engine="h5netcdf")
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    rng = np.random.default_rng(0)
    shape = (2, n_layers, n_heads)
    r2_f = rng.uniform(0, 1, shape + (2,))
    r2_g = rng.uniform(0, 1, shape + (2,))
    decomposition = xr.Dataset(
        {
            "r": (("sample", "layer", "head", "method", "sink"), rng.uniform(0, 1, shape + (2, 2))),
            "r2_f": (("sample", "layer", "head", "sink"), r2_f),
            "r2_g": (("sample", "layer", "head", "sink"), r2_g),
        },
        coords={"method": ["A", "B"], "sink": ["with", "without"]},
    )
    decomposition.to_netcdf(tmp_path / "decomposition.nc", engine="h5netcdf")

    def job(out, **extra):
        windows = tmp_path / "windows.h5"
        return tiny_job(tiny_dir, windows, out, model="tiny", variant="trained", **extra)

    def options(**changed):
        values = {"n_samples": 2, "seq_len": 16, "probe_samples": 3, "probe_period": 6, "seed": 0, "probes": ha.PROBES}
        return HeadAblationOptions(**{**values, **changed})

    def run(out, **changed):
        return ha.head_ablation_job(
            job(tmp_path / out, config_hash="abc"), tmp_path / "decomposition.nc", options(**changed)
        )

    run("out.nc")
    ds = open_dataset(tmp_path / "out.nc", lazy=False)
    assert ds["loss_increase"].dims == ("probe", "layer", "head")
    assert list(ds["probe"].values) == list(ha.PROBES)
    np.testing.assert_allclose(ds["loss_increase"], ds["ablated_loss"] - ds["base_loss"])
    np.testing.assert_array_equal(ds["n_samples"], [2, 3])
    np.testing.assert_array_equal(ds["n_targets"], [15, 5])
    mean_f = r2_f[..., 1].mean(0)
    np.testing.assert_allclose(ds["f_share"], mean_f / (mean_f + r2_g[..., 1].mean(0)))
    expected = spearman(ds["loss_increase"].sel(probe="repeat").values, ds["f_share"].values)
    assert ds.attrs["spearman_f_share_repeat"] == pytest.approx(expected)
    assert ds.attrs["config_hash"] == "abc" and ds.attrs["variant"] == "trained"
    # the windows probe's base loss is the model's own mean cross-entropy on the first 16 tokens
    ids = torch.as_tensor(windows["token_id"].values[:2, :16])
    with torch.no_grad():
        logits = model(ids).logits
    ce = [float(torch.nn.functional.cross_entropy(logits[s, :-1], ids[s, 1:])) for s in range(2)]
    assert float(ds["base_loss"].sel(probe="windows")) == pytest.approx(np.mean(ce), rel=1e-5)
    # one probe only (head_ablation.probes, the default run's repeat probe): that probe's numbers, the same values
    run("repeat.nc", probes=("repeat",))
    repeat = open_dataset(tmp_path / "repeat.nc", lazy=False)
    assert list(repeat["probe"].values) == ["repeat"] and "spearman_f_share_windows" not in repeat.attrs
    np.testing.assert_array_equal(repeat["sample_ablated_loss"], ds["sample_ablated_loss"].sel(probe=["repeat"]))
    np.testing.assert_array_equal(repeat["n_targets"], [5])
    with pytest.raises(ValueError, match="head_ablation.probes"):
        ha.head_ablation(
            model,
            tokenizer,
            windows["token_id"].values[:1, :8],
            options(probe_samples=1, probe_period=4, probes=("copy",)),
        )
    # a too-long window prefix names the head_ablation key
    with pytest.raises(ValueError, match="head_ablation.seq_len"):
        ha.head_ablation_job(
            job(tmp_path / "bad.nc"),
            tmp_path / "decomposition.nc",
            options(seq_len=999, probe_samples=1, probe_period=4),
        )


def test_figure_draws_heatmaps_and_scatter(tmp_path):
    from posgen.figures.style import save_figure

    rng = np.random.default_rng(0)
    variants, n_layers, n_heads = ["trained", "random-seed0"], 3, 4
    increase = rng.normal(0, 0.1, (2, 2, n_layers, n_heads))
    increase[0, 1, 0, 2] = 2.0  # one head carries the repeat probe
    ablation = xr.Dataset(
        {
            "loss_increase": (("variant", "probe", "layer", "head"), increase),
            "method_a_r": (("variant", "layer", "head"), rng.uniform(0.5, 1, (2, n_layers, n_heads))),
            "f_share": (("variant", "layer", "head"), rng.uniform(0, 1, (2, n_layers, n_heads))),
            "deposit_index": (("variant", "probe", "layer"), rng.uniform(0, 1, (2, 2, n_layers))),
        },
        coords={"variant": variants, "probe": list(ha.PROBES)},
    )
    fig = fig_head_ablation(ablation)
    heatmap = fig.axes[0].images[0].get_array()
    np.testing.assert_array_equal(heatmap, increase[0, 1])
    assert len(fig.axes[2].collections[0].get_offsets()) == n_layers * n_heads
    save_figure(fig, tmp_path / "heads.png")
    assert (tmp_path / "heads.png").stat().st_size > 1000
    with pytest.raises(KeyError, match="f_share"):
        fig_head_ablation(ablation.drop_vars("f_share"))
