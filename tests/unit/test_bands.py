"""Per-band feature statistics against analytic values."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from posgen.llm.bands import band_moments, band_stats
from posgen.store import write_netcdf
from posgen.testing.qk_store import toy_rope, write_qk_store


def test_band_moments_pair_dims_l_and_l_plus_half():
    # two tokens +-v in band 0 only (dims 0 and 2 of d = 4), a constant (3, 4) in band 1 (dims 1 and 3)
    x = np.array([[1.0, 3.0, 2.0, 4.0], [-1.0, 3.0, -2.0, 4.0]])
    mean_sq, var = band_moments(x)
    np.testing.assert_allclose(mean_sq, [0.0, 25.0])
    np.testing.assert_allclose(var, [5.0, 0.0])


def test_band_moments_of_gaussian_tokens():
    g = np.random.default_rng(0)
    mu = np.array([3.0, 0.0, 4.0, 0.0])  # band 0 mean (3, 4), band 1 mean 0
    x = mu + g.standard_normal((200_000, 4)) * np.array([1.0, 2.0, 1.0, 2.0])
    mean_sq, var = band_moments(x)
    np.testing.assert_allclose(mean_sq, [25.0, 0.0], atol=0.05)
    np.testing.assert_allclose(var, [2.0, 8.0], rtol=0.02)


@pytest.fixture
def store(tmp_path):
    """2 samples, 2 layers, 2 heads / 1 KV head, T = 6, d = 4; every token of a sample is the same vector."""
    N, L, H, T, d = 2, 2, 2, 6, 4
    q = np.zeros((N, L, H, T, d), np.float32)
    k = np.zeros((N, L, 1, T, d), np.float32)
    q[0, ..., 0], q[1, ..., 0] = 1.0, 3.0  # band 0 of q: |mean|^2 = 1 and 9 -> average 5, variance 0
    k[..., 1] = np.where(np.arange(T) % 2, 1.0, -1.0)  # band 1 of k: +-1 alternating: mean 0, variance 1
    theta = np.array([[1.0, 0.01], [1.0, 0.0]], np.float32)
    attrs = {"model": "toy", "variant": "random-seed1", "init_seed": 1}
    rope = toy_rope(theta, np.zeros(H), scaling=0.5)
    return write_qk_store(tmp_path / "qk.h5", q, k, rope, attrs=attrs), theta


def test_band_stats_file(store, tmp_path):
    path, theta = store
    band_stats(path, tmp_path / "bands.nc", config_hash="h", progress=False)
    ds = xr.open_dataset(tmp_path / "bands.nc", engine="h5netcdf")
    assert ds["q_mean_sq"].dims == ("layer", "head", "band")
    assert ds["k_var"].dims == ("layer", "kv_head", "band")
    assert ds["theta"].dims == ("layer", "band")
    np.testing.assert_allclose(ds["theta"], theta)
    np.testing.assert_allclose(ds["q_mean_sq"].sel(band=0), 5.0)  # averaged over samples
    np.testing.assert_allclose(ds["q_var"], 0.0)
    np.testing.assert_allclose(ds["k_mean_sq"], 0.0)
    np.testing.assert_allclose(ds["k_var"].sel(band=1), 1.0)
    np.testing.assert_allclose(ds["k_var"].sel(band=0), 0.0)
    assert np.isinf(ds["k_ratio"].sel(band=1)).all()  # variance without a mean component
    np.testing.assert_allclose(ds["q_ratio"].sel(band=0), 0.0)
    assert ds.attrs["variant"] == "random-seed1" and ds.attrs["config_hash"] == "h" and "posgen_version" in ds.attrs


def test_unrotated_bands_and_layer_types_are_flagged(store, tmp_path):
    """Layer 1's band 1 has frequency 0 (as the unrotated dims of a partial-rotary head); a NoPE layer has no
    rotated band at all."""
    path, theta = store
    ds = band_stats(path, tmp_path / "bands.nc", progress=False)
    assert ds["rotated"].values.tolist() == [[True, True], [True, False]]
    assert list(ds["layer_type"].values) == ["global", "global"]
    qk = xr.open_dataset(path, engine="h5netcdf").load()
    qk["inv_freq"][1] = 0.0  # layer 1: NoPE
    write_netcdf(qk, tmp_path / "nope.h5")  # posgen's own writer: the edited table gets digests of its own
    ds = band_stats(tmp_path / "nope.h5", tmp_path / "bands2.nc", progress=False)
    assert list(ds["layer_type"].values) == ["global", "nope"]
    assert ds["rotated"].values.tolist() == [[True, True], [False, False]]
    np.testing.assert_allclose(ds["k_var"].sel(band=1), 1.0)  # the statistics themselves are kept


def test_windows_given_as_tensors_sum_on_their_device_to_the_same_file(store):
    """The fused path off the CPU hands the band table device tensors (issue 52 item 2): summed there, read back
    once; the same numbers as numpy's host path (here both on the CPU, random windows)."""
    import torch

    from posgen.llm.bands import BandTable

    path, _ = store
    qk = xr.open_dataset(path, engine="h5netcdf").load()
    rng = np.random.default_rng(3)
    host, device = BandTable(qk, 2), BandTable(qk, 2)
    for layer in range(qk.sizes["layer"]):
        for _ in range(2):
            q = rng.standard_normal((qk.sizes["head"], 6, 4)).astype(np.float32) + 1.0
            k = rng.standard_normal((qk.sizes["kv_head"], 6, 4)).astype(np.float32)
            host.add(layer, q, k)
            device.add(layer, torch.from_numpy(q), torch.from_numpy(k))
    assert all(torch.is_tensor(value) for value in device.acc.values())
    a, b = host.dataset({}), device.dataset({})
    for name in ("q_mean_sq", "q_var", "k_mean_sq", "k_var", "q_ratio"):
        np.testing.assert_allclose(b[name].values, a[name].values, rtol=1e-12, err_msg=name)
    assert float(a["q_mean_sq"].max()) > 0.5  # the windows carry a mean: the comparison is not of zeros
