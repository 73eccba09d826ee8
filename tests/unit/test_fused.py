"""The fused path (analysis inside extraction) and shards against the store path, on tiny random models."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import xarray as xr

from posgen.corpus import cut_windows, load_text
from posgen.decomposition import decompose_store
from posgen.decomposition.drift import heldout_coefficients
from posgen.decomposition.options import DecompositionOptions
from posgen.gather import gather
from posgen.llm.bands import band_stats
from posgen.llm.extract import extract
from posgen.llm.fused import Analysis
from posgen.llm.options import ExtractOptions
from posgen.models import acquire, load_model
from posgen.store import open_dataset, write_netcdf
from posgen.testing.qk_store import toy_rope, write_qk_store
from posgen.testing.tiny import tiny_job
from posgen.workflow.sharding import parse_shard, shard_names, shard_of, shard_ranges

DECOMPOSITION = {
    "dummy_distances": [0, 8, 100],
    "dummy_distance": 100,
    "lstsq_tol": 1e-8,
    "bound_samples": 2,
    "precision": "float32",
    "bound_rows": 0,
}
OPTIONS = DecompositionOptions(**DECOMPOSITION, device="cpu")
N_WINDOWS = 5
N_HELDOUT = 3  # Method A-shared's held-out windows


def test_shard_ranges_cover_the_windows_once():
    assert shard_ranges(32, 8) == [(i, i + 4) for i in range(0, 32, 4)]
    ranges = shard_ranges(5, 2)
    assert ranges[0][0] == 0 and ranges[-1][1] == 5 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert sorted(b - a for a, b in ranges) == [2, 3]
    assert shard_names(5, 1) == ["0-5"]
    assert parse_shard("3-5") == (3, 5)
    assert shard_of(4, 5, 2) == f"{ranges[1][0]}-5"
    with pytest.raises(ValueError, match="shards: 6"):
        shard_ranges(5, 6)
    with pytest.raises(ValueError, match="not a window range"):
        parse_shard("5-3")


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def both_paths(request, tiny_source, tmp_path_factory):
    """One tiny model's windows through the store path (unsharded) and the fused path in two shards."""
    arch = request.param
    tmp = tmp_path_factory.mktemp(f"fused-{arch}")
    acquire(f"local:{tiny_source(arch)}", tmp / "model")
    _, tokenizer, _ = load_model(tmp / "model")
    windows = cut_windows(load_text("embedded"), tokenizer, N_WINDOWS, 48, 0, "embedded", n_heldout=N_HELDOUT)
    write_netcdf(windows, tmp / "windows.h5")
    common = {"model": arch}
    extract(tiny_job(tmp / "model", tmp / "windows.h5", tmp / "store" / "qk.h5", **common), ExtractOptions.defaults())
    decompose_store(
        tmp / "store" / "qk.h5",
        tmp / "store" / "decomposition.nc",
        OPTIONS,
        progress=False,
    )
    band_stats(tmp / "store" / "qk.h5", tmp / "store" / "bands.nc", progress=False)
    shards = shard_names(N_WINDOWS, 2)
    for shard in shards:
        out = tmp / "fused" / shard
        analysis = Analysis(
            OPTIONS,
            decomposition_path=out / "decomposition.nc",
            bands_path=out / "bands.nc",
        )
        extract(
            tiny_job(tmp / "model", tmp / "windows.h5", out / "qk.h5", samples=parse_shard(shard), **common),
            ExtractOptions.defaults(keep_qk=1),
            analysis=analysis,
        )
    for name in ("decomposition.nc", "bands.nc"):
        gather([tmp / "fused" / shard / name for shard in shards], tmp / "fused" / name)
    return tmp, shards


def _assert_same(got: xr.Dataset, want: xr.Dataset, rtol: float) -> None:
    assert set(got.data_vars) == set(want.data_vars)
    for name in want.data_vars:
        assert got[name].dims == want[name].dims, name
        np.testing.assert_allclose(got[name].values, want[name].values, rtol=rtol, atol=1e-7, err_msg=name)
    for name in want.coords:
        np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=name)


def test_fused_shards_gather_to_the_store_path(both_paths):
    tmp, shards = both_paths
    store = open_dataset(tmp / "store" / "decomposition.nc", lazy=False)
    fused = open_dataset(tmp / "fused" / "decomposition.nc", lazy=False)
    assert fused.sizes["sample"] == N_WINDOWS and fused["sample"].values.tolist() == list(range(N_WINDOWS))
    # the error and bound ran on the same windows (global index < bound_samples) in both
    assert (
        np.isfinite(fused["err_abs_mean"].isel(sample=1)).all() and np.isnan(fused["err_abs_mean"].isel(sample=2)).all()
    )
    _assert_same(fused, store, rtol=1e-6)
    assert fused.attrs["analysis"] == "fused" and store.attrs["analysis"] == "store"
    assert fused.attrs["bound_samples"] == store.attrs["bound_samples"] == 2
    assert fused.attrs["shards"] == ",".join(shards)
    _assert_same(
        open_dataset(tmp / "fused" / "bands.nc", lazy=False),
        open_dataset(tmp / "store" / "bands.nc", lazy=False),
        rtol=1e-6,
    )


def test_the_held_out_mean_key_is_the_mean_over_the_held_out_windows(both_paths):
    """qk.h5's k_heldout_coef against the coefficients of the mean of the keys of the held-out windows extracted as
    ordinary windows; every shard computes the same; Method A-shared is finite on both paths."""
    tmp, shards = both_paths
    store = open_dataset(tmp / "store" / "qk.h5", lazy=False)
    assert store.attrs["heldout_windows"] == N_HELDOUT
    windows = open_dataset(tmp / "windows.h5", lazy=False)
    ids = windows["heldout_token_id"].values  # (heldout, token)
    held = xr.Dataset({"token_id": (("sample", "token"), ids)}, coords={"sample": np.arange(len(ids))})
    write_netcdf(held, tmp / "held.h5")
    common = {"model": "m"}
    extract(tiny_job(tmp / "model", tmp / "held.h5", tmp / "held" / "qk.h5", **common), ExtractOptions.defaults())
    keys = open_dataset(tmp / "held" / "qk.h5", lazy=False)["k"].values  # (sample, layer, kv_head, T, d)
    want = heldout_coefficients(keys.mean(0), keys.shape[-2]).numpy()  # (layer, kv_head, basis, d)
    np.testing.assert_allclose(store["k_heldout_coef"].values, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    for shard in shards:
        fused = open_dataset(tmp / "fused" / shard / "qk.h5", lazy=False)
        np.testing.assert_array_equal(fused["k_heldout_coef"].values, store["k_heldout_coef"].values)
    decomposition = open_dataset(tmp / "store" / "decomposition.nc", lazy=False)
    assert np.isfinite(decomposition["r"].sel({"method": "A-shared"})).all()
    assert decomposition.attrs["heldout_windows"] == N_HELDOUT


def test_fused_path_keeps_only_the_first_windows(both_paths):
    tmp, shards = both_paths
    store = open_dataset(tmp / "store" / "qk.h5", lazy=False)
    first = open_dataset(tmp / "fused" / shards[0] / "qk.h5", lazy=False)
    assert first["sample"].values.tolist() == [0]
    np.testing.assert_array_equal(first["q"].values, store["q"].isel(sample=[0]).values)
    # the fused path checks the reference logits in memory: none stored, the errors recorded
    assert first.sizes["ref_sample"] == 0 and store.sizes["ref_sample"] == 1
    np.testing.assert_allclose(first["self_check_rel_error"].values, store["self_check_rel_error"].values, rtol=1e-6)
    rest = open_dataset(tmp / "fused" / shards[1] / "qk.h5", lazy=False)
    assert rest.sizes["sample"] == 0 and rest.sizes["ref_sample"] == 0  # metadata only
    np.testing.assert_array_equal(rest["inv_freq"].values, store["inv_freq"].values)
    # the second shard self-checked its own first window
    assert 0 <= rest.attrs["self_check_max_rel_error"] < 1e-4
    assert np.isfinite(rest["self_check_rel_error"].values).all()


def _write(path, samples, q, k, qk_dtype):
    """Windows ``samples`` of one layer, 2 heads / 1 KV head, 4 tokens, head dim 4: q (sample, ...), k (sample, ...)."""
    rope = toy_rope(np.ones((1, 2), np.float32), [0, 0], scaling=0.5)
    return write_qk_store(path, q, k, rope, samples=samples, attrs={}, qk_dtype=qk_dtype)


def test_float16_storage_round_trips_and_refuses_overflow(tmp_path):
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(1, 2, 4, 4)).astype(np.float32), rng.normal(size=(1, 1, 4, 4)).astype(np.float32)
    _write(tmp_path / "qk.h5", [3, 4], np.stack([q * 3, q * 4]), np.stack([k, k]), "float16")
    ds = open_dataset(tmp_path / "qk.h5", lazy=False)
    assert ds["q"].dtype == np.float16 and ds.attrs["qk_dtype"] == "float16"
    assert ds["sample"].values.tolist() == [3, 4] and ds.sizes["ref_sample"] == 0
    np.testing.assert_allclose(ds["q"].sel(sample=4).values, q * 4, rtol=1e-3)
    with pytest.raises(OverflowError, match="extract.qk_dtype: float16 overflows on q of window 3"):
        _write(tmp_path / "big.h5", [3], (q * 1e5)[None], k[None], "float16")
    assert not (tmp_path / "big.h5").exists()
    with pytest.raises(ValueError, match="extract.qk_dtype: 'bfloat16'"):
        _write(tmp_path / "bf.h5", [0], q[None], k[None], "bfloat16")


def test_long_window_without_reference_layers(tiny_source, tmp_path):
    """A window of ten token blocks with ``ref_layers: []`` (the long-window setting: no H T^2 reference
    logits; the self-check runs on the check_tokens prefix of every layer): the fused statistics equal the
    store path's, and the store keeps no reference logits."""
    acquire(f"local:{tiny_source('llama')}", tmp_path / "model")
    _, tokenizer, _ = load_model(tmp_path / "model")
    write_netcdf(cut_windows(load_text("embedded"), tokenizer, 2, 320, 0, "embedded"), tmp_path / "windows.h5")
    common = {"model": "llama"}
    options = ExtractOptions.defaults(ref_layers=[], check_tokens=64)
    report = extract(tiny_job(tmp_path / "model", tmp_path / "windows.h5", tmp_path / "qk.h5", **common), options)
    assert report["self_check_max_rel_error"] < 1e-4
    with open_dataset(tmp_path / "qk.h5", lazy=False) as ds:
        assert ds.sizes["token"] == 320 and ds.sizes["ref_layer"] == 0
        assert np.isfinite(ds["self_check_rel_error"].values).all()  # the prefix check reached every layer
    store = decompose_store(tmp_path / "qk.h5", tmp_path / "store.nc", OPTIONS, progress=False)
    analysis = Analysis(
        OPTIONS,
        decomposition_path=tmp_path / "fused.nc",
        bands_path=tmp_path / "bands.nc",
    )
    extract(
        tiny_job(tmp_path / "model", tmp_path / "windows.h5", tmp_path / "fused-qk.h5", **common),
        dataclasses.replace(options, keep_qk=0),
        analysis=analysis,
    )
    _assert_same(open_dataset(tmp_path / "fused.nc", lazy=False), store, rtol=1e-6)


def test_the_first_token_control_changes_the_first_key_and_is_recorded(both_paths):
    """first_token mean-embedding (a models entry's key) passes the self-check (the model's own logits come from the same
    controlled pass), is recorded in qk.h5 and in the decomposition it feeds, and changes the first key."""
    tmp, _ = both_paths
    common = {"model": "m"}
    out = tmp / "control"
    analysis = Analysis(
        OPTIONS,
        decomposition_path=out / "decomposition.nc",
        bands_path=out / "bands.nc",
    )
    job = tiny_job(tmp / "model", tmp / "windows.h5", out / "qk.h5", **common)
    report = extract(job, ExtractOptions.defaults(first_token="mean-embedding"), analysis=analysis)
    assert report["self_check_max_rel_error"] < 1e-4
    control = open_dataset(out / "qk.h5", lazy=False)
    plain = open_dataset(tmp / "store" / "qk.h5", lazy=False)
    assert control.attrs["first_token"] == "mean-embedding" and plain.attrs["first_token"] == "model"
    first = np.abs(control["k"].isel(token=0) - plain["k"].isel(token=0)).max()
    assert float(first) > 1e-3
    assert open_dataset(out / "decomposition.nc", lazy=False).attrs["first_token"] == "mean-embedding"
