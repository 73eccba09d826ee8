"""Band interventions (posgen.llm.band_interventions, issue 65): which bands a setting picks, that a setting changing
no band is the model itself, that stopping every band is the model without RoPE on the same q/k, and that an
ablation zeroes exactly its bands' dims in the half-split and interleaved layouts and in a partial-rotary head."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from posgen import rope
from posgen.llm.band_interventions import BANDS_BACKEND, intervene, intervening
from posgen.llm.band_settings import BandSetting, band_masks, grid
from posgen.llm.families import make_layout, to_canonical

# 8 rotating bands, fastest first (as RoPE's table runs), then 2 that do not rotate (a partial-rotary head)
TABLE = np.array([1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.0, 0.0])


def test_a_setting_picks_its_bands_among_the_rotating_ones():
    stop, zero = band_masks(TABLE, BandSetting("below", 0.25))
    assert np.flatnonzero(stop).tolist() == [6, 7] and not zero.any()  # the two slowest
    stop, _ = band_masks(TABLE, BandSetting("above", 0.25))
    assert np.flatnonzero(stop).tolist() == [0, 1]  # the two fastest
    assert band_masks(TABLE, BandSetting("below", 1.0))[0].tolist() == [True] * 8 + [False] * 2
    for quarter, bands in enumerate([[6, 7], [4, 5], [2, 3], [0, 1]]):  # lowest quarter first
        stop, zero = band_masks(TABLE, BandSetting("ablate", quarter=quarter))
        assert np.flatnonzero(zero).tolist() == bands and not stop.any()
    assert not any(m.any() for m in band_masks(TABLE, BandSetting("below", 0.0)))
    labels = [s.label for s in grid()]
    assert labels[:4] == ["none", "below-25", "below-50", "below-75"] and labels[-1] == "ablate-highest"
    with pytest.raises(ValueError, match="not one of none, below, above, ablate"):
        BandSetting("sideways")


def _rotated(seed: int = 0, amplitude: float = 1.3):
    """Canonical pre-RoPE q, k (2, 3, 12, 20) and the same rotated by TABLE at positions 0..11 with ``amplitude``."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 3, 12, 20, generator=g), torch.randn(2, 3, 12, 20, generator=g)
    positions, inv_freq = torch.arange(12), torch.as_tensor(TABLE, dtype=torch.float32)
    return (
        q,
        k,
        positions,
        inv_freq,
        rope.rotate(q, positions, inv_freq, amplitude),
        rope.rotate(k, positions, inv_freq, amplitude),
    )


def test_every_band_stopped_is_the_model_without_rope_on_the_same_q_and_k():
    q, k, positions, inv_freq, q_rot, k_rot = _rotated()
    stop, zero = (torch.as_tensor(m) for m in band_masks(TABLE, BandSetting("below", 1.0)))
    q_none, k_none = (
        intervene(q_rot, positions, inv_freq, stop, zero),
        intervene(k_rot, positions, inv_freq, stop, zero),
    )
    torch.testing.assert_close(q_none, 1.3 * q, rtol=1e-5, atol=1e-5)  # the amplitude stays, the angle goes
    torch.testing.assert_close(
        q_none @ k_none.transpose(-1, -2), 1.3**2 * q @ k.transpose(-1, -2), rtol=1e-4, atol=1e-4
    )
    # the lowest quarter stopped: those bands unrotated, every other band exactly as the model rotated it
    stop, zero = (torch.as_tensor(m) for m in band_masks(TABLE, BandSetting("below", 0.25)))
    part = intervene(q_rot, positions, inv_freq, stop, zero)
    dims = np.r_[6, 7, 16, 17]
    torch.testing.assert_close(part[..., dims], 1.3 * q[..., dims], rtol=1e-5, atol=1e-5)
    others = np.setdiff1d(np.arange(20), dims)
    assert torch.equal(part[..., others], q_rot[..., others])


@pytest.mark.parametrize(
    "rotary_dims, rope_layout, position",
    [(20, "half", "first"), (20, "interleaved", "first"), (16, "half", "first"), (16, "interleaved", "last")],
)
def test_an_ablation_zeroes_exactly_its_bands_dims_in_every_layout(rotary_dims, rope_layout, position):
    layout = make_layout(20, rotary_dims, rope_layout, position)
    table = layout.canonical_inv_freq(np.geomspace(1.0, 0.01, rotary_dims // 2))  # rotating bands, then zeros
    x = torch.randn(2, 3, 5, 20, generator=torch.Generator().manual_seed(1))  # (B, H, T, d), the model's dim order
    canonical = to_canonical(x, layout)
    for quarter in range(4):
        stop, zero = band_masks(table, BandSetting("ablate", quarter=quarter))
        out = intervene(
            canonical,
            torch.arange(5),
            torch.as_tensor(table, dtype=torch.float32),
            torch.as_tensor(stop),
            torch.as_tensor(zero),
        )
        bands = np.flatnonzero(zero)
        dims = np.r_[bands, bands + 10]  # canonical dims of the zeroed bands
        assert bands.size and (out[..., dims] == 0).all()
        kept = np.setdiff1d(np.arange(20), dims)
        assert torch.equal(out[..., kept], canonical[..., kept])
        # in the model's own dims: each band is a pair its layout rotates together, never an unrotated dim
        start = 0 if position == "first" else 20 - rotary_dims
        for band in bands:
            first, second = layout.dim_order[band], layout.dim_order[band + 10]
            assert second - first == (1 if rope_layout == "interleaved" else rotary_dims // 2)
            assert start <= first < second < start + rotary_dims


@pytest.fixture(scope="module")
def tiny_models(tiny_source):
    path = tiny_source("llama")

    def load(attn):
        return AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, dtype=torch.float32).eval()

    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    return load, ids


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_a_setting_that_changes_no_band_is_the_model_itself(tiny_models):
    load, ids = tiny_models
    eager, banded = load("eager"), load(BANDS_BACKEND)
    reference = _logits(eager, ids)
    assert torch.equal(_logits(banded, ids), reference)  # outside the context
    table = np.tile(banded.model.rotary_emb.inv_freq.numpy(), (banded.config.num_hidden_layers, 1))
    with intervening(banded, BandSetting("below", 0.0), table):
        assert torch.equal(_logits(banded, ids), reference)
    with intervening(banded, BandSetting("above", 1.0), table):  # every band stopped: no longer the model
        stopped = _logits(banded, ids)
    assert not torch.allclose(stopped, reference, atol=1e-3)
    # ... but the model with its rotary table set to zero (NoPE, same weights): the same logits
    nope = load("eager")
    nope.model.rotary_emb.inv_freq.zero_()
    torch.testing.assert_close(stopped, _logits(nope, ids), rtol=1e-4, atol=1e-4)


def test_band_effects_are_zero_for_the_unmodified_model_and_measured_against_it(tiny_models):
    """The unmodified model's loss is the eager model's mean next-token NLL; its own changes are exactly zero; the
    fast bands stopped move the attention rows (KL > 0) and the loss; each head's KL is KL(unmodified || modified)
    of its attention rows, checked against the eager attention weights of both passes."""
    from posgen.llm.band_interventions import band_effects

    load, ids = tiny_models
    banded = load(BANDS_BACKEND)
    table = np.tile(banded.model.rotary_emb.inv_freq.numpy(), (banded.config.num_hidden_layers, 1))
    settings = [BandSetting("none"), BandSetting("above", 0.5), BandSetting("ablate", quarter=0)]
    ds = band_effects(banded, ids.numpy(), settings, table)
    assert ds["setting"].values.tolist() == ["none", "above-50", "ablate-lowest"]
    eager = load("eager")
    logits = _logits(eager, ids)
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    np.testing.assert_allclose(ds["loss"].sel(setting="none"), nll.view(2, -1).double().mean(-1), rtol=1e-6)
    none = ds.sel(setting="none")
    assert (none["loss_change"] == 0).all() and (none["kl"] == 0).all() and (none["prev_change"] == 0).all()
    fast = ds.sel(setting="above-50")
    assert (fast["kl"] > 0).all() and (fast["loss_change"] != 0).all()
    # layer 0 sees the same inputs in both passes: its KL from the two passes' eager weights, by hand
    with torch.inference_mode():
        ref = eager(input_ids=ids, output_attentions=True).attentions[0].double()[:, :, 1:]
        with intervening(banded, settings[1], table):
            mod = banded(input_ids=ids, output_attentions=True).attentions[0].double()[:, :, 1:]
    kl = (ref * (ref.clamp_min(1e-300).log() - mod.clamp_min(1e-300).log())).sum(-1).mean(-1)
    np.testing.assert_allclose(fast["kl"].sel(layer=0), kl.numpy(), rtol=1e-6, atol=1e-9)


def test_method_a_reads_the_logits_each_setting_attends_with(tiny_models):
    """Method A of each setting's logits: the captured q/k with the ablated dims zeroed, rebuilt with the stopped
    bands unrotated, give the logits the backend attended with (the self-check, which fails when the table is left
    as the model's); with every band stopped f + g is the logit itself, so r = 1 (docs/method.md section 3A)."""
    from posgen.decomposition import Decomposer, DecompositionOptions
    from posgen.llm import capture
    from posgen.llm.band_interventions import LogitReading, band_effects
    from posgen.llm.extract import SelfCheckError

    load, ids = tiny_models
    banded = load(BANDS_BACKEND)
    decomposer = Decomposer.from_options(DecompositionOptions.defaults(device="cpu"))
    settings = [BandSetting("none"), BandSetting("above", 1.0), BandSetting("ablate", quarter=3)]
    with capture.Capture(banded, ref_layers=(-1,)) as recorder:
        capture.forward_pass(banded, recorder, ids[:1].numpy())
        table = recorder.rope().inv_freq
        reading = LogitReading(recorder, decomposer, rtol=1e-4)
        ds = band_effects(banded, ids.numpy(), settings, table, reading=reading)
        assert 0 < reading.check_error < 1e-4
        # the same pass read as if nothing had changed: the rebuilt logits are not the ones attended with
        with intervening(banded, settings[2], table), torch.inference_mode():
            reading.start(ids.shape[1])
            banded(input_ids=ids, use_cache=False)
        with pytest.raises(SelfCheckError, match="layer 1"):
            reading.read(settings[0])
    stopped = ds.sel(setting="above-100")
    np.testing.assert_allclose(stopped["method_a_r"], 1.0, atol=1e-6)  # sums of float32 products
    unmodified, ablated = ds.sel(setting="none"), ds.sel(setting="ablate-highest")
    assert (unmodified["method_a_r"] < 1 - 1e-3).all() and np.isfinite(ablated["method_a_r"]).all()
    assert not np.allclose(unmodified["method_a_r"], ablated["method_a_r"])
    assert ((ds["method_a_f_share"] >= 0) & (ds["method_a_f_share"] <= 1)).all()


def _effects(loss_low: float, loss_high: float, kl_low, kl_high, n: int = 6, seed: int = 0):
    """A band_interventions dataset with known loss changes (per window, about the given means) and per-head KL."""
    import xarray as xr

    rng = np.random.default_rng(seed)
    settings = ["none", "below-25", "above-25"]
    change = np.stack(
        [np.zeros(n), loss_low + 0.001 * rng.standard_normal(n), loss_high + 0.001 * rng.standard_normal(n)]
    )
    kl = np.stack([np.zeros((n, 2, 3)), np.broadcast_to(kl_low, (n, 2, 3)), np.broadcast_to(kl_high, (n, 2, 3))])
    reading = np.arange(6.0).reshape(2, 3)
    return xr.Dataset(
        {
            "loss_change": (("setting", "sample"), change),
            "kl": (("setting", "sample", "layer", "head"), kl),
            "low_share_k": (("layer", "head"), reading),
            "f_share": (("layer", "head"), reading),
        },
        coords={"setting": settings},
    )


def test_the_registered_predictions_are_decided_on_their_intervals_beside_the_control():
    from posgen.llm.band_interventions import predictions

    rising = np.arange(6.0).reshape(2, 3)  # KL rising with the reading: rho +1
    trained = _effects(0.02, 1.5, 10 - rising, rising)
    quiet = _effects(0.0, 0.0, rising, rising, seed=1)
    got = {rule: outcome for rule, outcome, _ in predictions(trained, [quiet])}
    assert got == {
        "BAND_LOW_LOSS": "not discriminative (the random-init control meets it too)",
        "BAND_HIGH_LOSS": "reproduced",
        "BAND_LOW_RHO": "reproduced",  # the KL falls as the keys' low share rises: rho -1
        "BAND_HIGH_RHO": "reproduced",
    }
    loud = _effects(0.5, 0.2, rising, 10 - rising, seed=2)  # every prediction wrong, without a control
    got = {rule: outcome for rule, outcome, _ in predictions(loud, [])}
    assert got == {
        "BAND_LOW_LOSS": "not reproduced",
        "BAND_HIGH_LOSS": "not reproduced",
        "BAND_LOW_RHO": "not reproduced",
        "BAND_HIGH_RHO": "not reproduced",
    }
