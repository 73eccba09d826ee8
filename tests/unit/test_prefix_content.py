"""The prefix study (docs/method.md section 3E): window sets, the trajectory geometry on keys with a known
structure, the span sums against section 3C's shares, the job on a tiny model, and every registered reading flipped
on hand-made numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from posgen.corpus import CorpusError, apply_window_set, cut_windows, load_text, write_windows
from posgen.decomposition.drift import (
    SMOOTH_DEGREE,
    drift_basis,
    position_basis,
    position_share,
    shared_drift,
    shared_shares,
)
from posgen.decomposition.mask import SINKS
from posgen.llm import prefix_content as pc

T, D = 120, 8


def _windows(n=4, heldout=3, seq_len=40, bos=True):
    ids = np.arange(1, 1 + (n + heldout) * seq_len).reshape(n + heldout, seq_len) % 97 + 3
    if bos:
        ids[:, 0] = 1
    return xr.Dataset(
        {"token_id": (("sample", "token"), ids[:n]), "heldout_token_id": (("heldout", "token"), ids[n:])},
        coords={"sample": np.arange(n), "token": np.arange(seq_len)},
        attrs={"bos_prepended": int(bos)},
    )


def test_window_sets_shuffle_inside_each_window_and_share_a_prefix():
    cut = _windows()
    shuffled = apply_window_set(cut, "shuffled", seed=0)
    for name in ("token_id", "heldout_token_id"):
        a, b = cut[name].values, shuffled[name].values
        assert (b[:, 0] == 1).all()  # BOS stays first
        assert all(sorted(x) == sorted(y) for x, y in zip(a, b))  # the same tokens, in another order
        assert (a != b).any(axis=1).all()
    assert (apply_window_set(cut, "shuffled", seed=0)["token_id"] == shuffled["token_id"]).all()  # seeded
    prefixed = apply_window_set(cut, "prefix10", seed=0)
    for name in ("token_id", "heldout_token_id"):
        ids = prefixed[name].values
        assert (ids[:, :10] == cut["token_id"].values[0, :10]).all()  # window 0's first tokens, everywhere
        assert (ids[:, 10:] == cut[name].values[:, 10:]).all()  # then each window's own
    assert prefixed.attrs["window_set"] == "prefix10" and (cut["token_id"] != prefixed["token_id"]).any()
    with pytest.raises(CorpusError, match="prefix is not shorter"):
        apply_window_set(cut, "prefix40", seed=0)
    with pytest.raises(CorpusError, match="expected corpus, shuffled or prefix<N>"):
        apply_window_set(cut, "prefix", seed=0)


COMMON = np.random.default_rng(9).normal(size=D)  # the one direction of a shared trajectory


def _keys(rng, n, shared_direction: bool):
    """n windows' keys (layer 1, kv_head 1, T, D): a smooth trajectory of the same size profile in every window
    (growing like 1 - 1/sqrt(j)), along one direction shared by all (or its own per window), plus noise."""
    j = np.arange(T)
    size = 1 - 1 / np.sqrt(j + 1)
    out = []
    for _ in range(n):
        direction = COMMON if shared_direction else rng.normal(size=D)
        direction = direction / np.linalg.norm(direction)
        k = 3 * size[:, None] * direction + 0.05 * rng.normal(size=(T, D)) + rng.normal(size=D)
        out.append(k[None, None].astype(np.float32))
    return out


def _dataset(windows, heldout):
    """prefix_content.nc's dataset of key arrays, as trajectory_dataset builds it from a model's keys."""
    basis = drift_basis(T, SMOOTH_DEGREE)
    mean = sum(k.astype(np.float64) for k in heldout) / len(heldout)
    shared = shared_drift(torch.from_numpy(mean), basis)
    sums, unit_sum = {name: [] for name in pc.POWERS}, 0
    for k in windows:
        terms, unit = pc.window_terms(k, shared, basis)
        for name in pc.POWERS:
            sums[name].append(pc.spans(terms[name], mean=name == "drift_size"))
        unit_sum = unit_sum + unit
    n = len(windows)
    cosine = ((unit_sum**2).sum(-1) - n) / (n * (n - 1))
    dims = ("sample", "layer", "kv_head", "span")
    data = {name: (dims, np.stack(v)) for name, v in sums.items()}
    data["direction_cosine"] = (dims[1:], pc.spans(cosine, mean=True))
    starts = np.maximum(1, np.arange(data["key_power"][1].shape[-1]) * pc.SPAN)
    return xr.Dataset(data, coords={"span_start": ("span", starts)}), shared


def test_the_span_sums_give_section_3c_shares_and_the_geometry_of_known_trajectories():
    rng = np.random.default_rng(0)
    own = _keys(rng, 6, shared_direction=False)
    ds, shared = _dataset(own, _keys(rng, 8, shared_direction=False))
    shares = pc.window_shares(ds)
    # over every token, the span sums are section 3C's shares of each window (sink 'without')
    basis = position_basis(T, SMOOTH_DEGREE, "without")
    for w, k in enumerate(own):
        x = torch.from_numpy(k).double()
        assert shares["smooth"][w] == pytest.approx(float(position_share(x, basis)[0, 0, -1]), abs=1e-9)
        fixed, scaled = shared_shares(x, shared)  # (1, 1, sink) each
        assert shares["shared"][w] == pytest.approx(float(fixed[0, 0, SINKS.index("without")]), abs=1e-9)
        assert shares["scaled"][w] == pytest.approx(float(scaled[0, 0, SINKS.index("without")]), abs=1e-9)
    # each window's own direction, one size profile: sizes correlate, directions do not, s(j) explains little
    geometry = pc.geometry(ds)
    assert geometry["size_r"] > 0.9 and abs(geometry["direction_cosine"]) < 0.3
    assert shares["smooth"].mean() > 0.75 and shares["shared"].mean() < 0.2
    assert pc.shape_reading(geometry["size_r"], geometry["direction_cosine"]).startswith("each window's own trajectory")
    # one direction for all: the shared function explains the trajectory, and the directions agree
    common = _keys(np.random.default_rng(1), 6, shared_direction=True)
    ds, _ = _dataset(common, _keys(np.random.default_rng(1), 8, shared_direction=True))
    geometry, shares = pc.geometry(ds), pc.window_shares(ds)
    assert geometry["direction_cosine"] > 0.85 and shares["shared"].mean() > 0.75
    assert pc.shape_reading(geometry["size_r"], geometry["direction_cosine"]).startswith("a shared trajectory")
    # the direction cosine from the sum of unit vectors equals the explicit mean over pairs
    fits = [
        pc.window_terms(k, torch.zeros(1, 1, T, D, dtype=torch.float64), drift_basis(T, SMOOTH_DEGREE))[1] for k in own
    ]
    pairs = [float((fits[a] * fits[b]).sum(-1).mean()) for a in range(6) for b in range(6) if a != b]
    unit_sum = sum(fits)
    assert float((((unit_sum**2).sum(-1) - 6) / 30).mean()) == pytest.approx(np.mean(pairs), abs=1e-12)


@pytest.mark.parametrize(
    ("diff", "words"),
    [
        ((0.01, -0.05, 0.07), "kept"),
        ((-0.3, -0.35, -0.25), "lowered"),
        ((0.3, 0.25, 0.35), "raised"),
        ((-0.08, -0.15, 0.0), "inconclusive"),  # the interval reaches past -0.1
    ],
)
def test_the_shuffle_reading_flips_at_its_registered_tolerance(diff, words):
    assert pc.shuffle_reading(diff).startswith(words)
    assert pc.SHUFFLE == 0.1


@pytest.mark.parametrize(
    ("diff", "words"),
    [((0.3, 0.2, 0.4), "prefix content"), ((0.02, -0.01, 0.05), "no rise"), ((0.12, 0.05, 0.2), "inconclusive")],
)
def test_the_prefix_reading_flips_at_its_registered_rise(diff, words):
    assert pc.prefix_reading(diff).startswith(words)


def test_the_shape_reading_needs_both_a_shared_size_and_an_own_direction():
    assert pc.shape_reading(0.8, 0.1).startswith("each window's own")
    assert pc.shape_reading(0.3, 0.1) == "neither"  # sizes not shared
    assert pc.shape_reading(0.8, 0.35) == "neither"  # directions partly shared
    assert pc.shape_reading(0.8, 0.7).startswith("a shared trajectory")


def test_paired_interval_and_the_study_table_on_hand_made_window_sets():
    rng = np.random.default_rng(2)
    own = _keys(rng, 6, shared_direction=False)
    corpus, _ = _dataset(own, _keys(rng, 8, shared_direction=False))
    common, _ = _dataset(_keys(rng, 6, shared_direction=True), _keys(rng, 8, shared_direction=True))
    corpus.attrs.update(window_set="corpus", prefix_tokens=0)
    shuffled = corpus.copy()
    shuffled.attrs.update(window_set="shuffled")
    common.attrs.update(window_set="prefix30", prefix_tokens=30)
    contents = {"m": corpus, "m-shuffled": shuffled, "m-prefix30": common}
    table, readings, after = pc.prefix_table(contents, _no_origin(), n_boot=200, seed=0)
    assert after == 30 and list(table["window_set"]) == ["corpus", "shuffled", "prefix30"]
    assert readings["shuffled"][1].startswith("kept") and readings["shuffled"][0][:2] == (0.0, 0.0)
    assert readings["prefix30"][1].startswith("prefix content")
    assert readings["shape"][1].startswith("each window's own")
    assert "PC_RISE 0.1" in readings["prefix30"][2]
    text = pc.prefix_markdown(table, readings, after, "hand-made")
    assert "Readings, registered before the study ran" in text and "X from 30" in text
    mean, lo, hi = pc.paired(np.array([0.1, 0.2, 0.3, 0.4]), 500, 0)
    assert mean == pytest.approx(0.25) and 0.1 <= lo < mean < hi <= 0.4


def _no_origin():
    import pandas as pd

    return pd.DataFrame(columns=["model", "variant", "gap", "drift_closes", "shared_closes", "outcome"])


def test_the_job_on_a_tiny_model_writes_every_window_and_span(tiny_source, tmp_path):
    from transformers import AutoTokenizer

    from posgen.models import acquire
    from posgen.store import open_dataset
    from posgen.testing.tiny import tiny_job

    acquire(f"local:{tiny_source('llama')}", tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    windows = cut_windows(load_text("embedded"), tokenizer, 3, 48, 0, n_heldout=2)
    write_windows(apply_window_set(windows, "prefix16", 0), tmp_path / "windows.h5")
    ds = pc.prefix_content_job(tiny_job(tmp_path / "model", tmp_path / "windows.h5", tmp_path / "pc.nc"))
    stored = open_dataset(tmp_path / "pc.nc", lazy=False)
    assert stored.attrs["window_set"] == "prefix16" and stored.attrs["prefix_tokens"] == 16
    assert dict(stored["key_power"].sizes) == {"sample": 3, "layer": 2, "kv_head": 2, "span": 5}  # tokens 1..47
    assert np.isfinite(stored["direction_cosine"].values).all() and (stored["key_power"].values > 0).all()
    shares = pc.window_shares(ds)
    assert all(0 <= s <= 1 for s in shares["smooth"]) and all(0 <= s <= 1 for s in shares["scaled"])
