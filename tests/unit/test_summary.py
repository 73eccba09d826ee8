"""Summary aggregates and bootstrap intervals on synthetic decompositions with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from posgen.decomposition.options import DecompositionOptions
from posgen.llm.summary import COLUMNS, summarize
from posgen.stats import bootstrap_indices
from posgen.store import write_netcdf

SUFF = ("n", "sum_x", "sum_y", "sum_xx", "sum_yy", "sum_xy")
SHARES = {"q": (0.1, 0.3), "k": (0.2, 0.6)}  # position shares (linear, smooth) of the fake decompositions


def fake_decomposition(
    path, model, variant, r_per_sample, n_layers=3, n_heads=4, data=None, layer_offset=None, layer_coords=None
):
    """decomposition.nc whose r is r_per_sample[s] (+ layer_offset[l]) for every layer/head/method/sink.

    ``data[s]`` (x, y) pairs give the sufficient statistics of every (layer, head) of sample s; ``layer_coords``
    adds per-layer coordinates (``layer_type``, ``dummy_distance_used``) as decompose_store writes them.
    """
    N = len(r_per_sample)
    shape = (N, n_layers, n_heads, 2, 2)
    r = np.broadcast_to(np.asarray(r_per_sample, float)[:, None, None, None, None], shape).copy()
    if layer_offset is not None:
        r += np.asarray(layer_offset)[None, :, None, None, None]
    dims = ("sample", "layer", "head", "method", "sink")
    vars_ = {"r": (dims, r)}
    for name in ("r_f", "r_g", "r2_f", "r2_g"):
        fg = np.full(shape, 0.25 if "2" in name else 0.5)
        fg[:, :, :, 1] = np.nan  # Method B has no f and g terms
        vars_[name] = (dims, fg)
    for vector, shares in SHARES.items():  # (linear, smooth) per vector, the same in every head
        share = np.broadcast_to(np.asarray(shares)[None, None, None, :, None], (N, n_layers, n_heads, 2, 2))
        vars_[f"{vector}_position_share"] = (("sample", "layer", "head", "basis", "sink"), share.copy())
    suff = np.zeros(shape + (6,))
    if data is not None:
        for s, (x, y) in enumerate(data):
            suff[s] = [len(x), x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum()]
    for i, name in enumerate(SUFF):
        vars_[name] = (dims, suff[..., i])
    ds = xr.Dataset(
        vars_,
        coords={
            "sample": np.arange(N),
            "layer": np.arange(n_layers),
            "head": np.arange(n_heads),
            "method": ["A", "B"],
            "sink": ["with", "without"],
            "basis": ["linear", "smooth"],
            **{name: ("layer", values) for name, values in (layer_coords or {}).items()},
        },
        attrs={"model": model, "variant": variant, "dummy_distance": 1000},
    )
    write_netcdf(ds, path)
    return path


def test_intervals_and_paired_difference(tmp_path):
    g = np.random.default_rng(0)
    N = 60
    v = g.normal(0.8, 0.05, N)
    data = [(g.standard_normal(50), g.standard_normal(50)) for _ in range(N)]
    paths = [
        fake_decomposition(tmp_path / "t.nc", "m", "trained", v, data=data),
        fake_decomposition(tmp_path / "r.nc", "m", "random-seed0", v - 0.3, data=data),
    ]
    table = summarize(
        paths, tmp_path / "summary.csv", {"m": tmp_path / "summary.nc"}, n_boot=2000, seed=1, config_hash="cafe"
    )
    assert list(table.columns[: len(COLUMNS)]) == COLUMNS
    assert len(table) == 2 * 2 * 2  # variants x methods x sinks
    trained = table[table.variant == "trained"]
    random = table[table.variant == "random-seed0"]
    np.testing.assert_allclose(trained.mean_r, v.mean())
    np.testing.assert_allclose(random.mean_r, v.mean() - 0.3)
    # percentile interval of a mean ~ mean +- 1.96 sd / sqrt(N)
    half = 1.96 * v.std(ddof=1) / np.sqrt(N)
    np.testing.assert_allclose(trained.mean_r_hi - trained.mean_r_lo, 2 * half, rtol=0.15)
    assert (trained.mean_r_lo < trained.mean_r).all() and (trained.mean_r < trained.mean_r_hi).all()
    # paired: the per-sample difference is exactly -0.3, so its interval has no width
    np.testing.assert_allclose(random.diff_vs_trained, -0.3, atol=1e-12)
    np.testing.assert_allclose(random.diff_lo, -0.3, atol=1e-12)
    np.testing.assert_allclose(random.diff_hi, -0.3, atol=1e-12)
    assert trained.diff_vs_trained.isna().all()
    # pooled r of the per-sample (x, y) data = Pearson r of all of it (every layer/head repeats it)
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    np.testing.assert_allclose(trained.pooled_r, np.corrcoef(x, y)[0, 1], atol=1e-10)
    assert (trained.pooled_r_lo <= trained.pooled_r).all() and (trained.pooled_r <= trained.pooled_r_hi).all()
    # r2_f / r2_g belong to the constructions with f and g (Method A here) only
    assert (table[table.method == "A"].r2_f == 0.25).all() and table[table.method == "B"].r2_f.isna().all()
    # the position shares of q and k, per basis, on every row
    for vector, (linear, smooth) in SHARES.items():
        np.testing.assert_allclose(table[f"{vector}_position_share_linear"], linear)
        np.testing.assert_allclose(table[f"{vector}_position_share_smooth"], smooth)
    assert (table.n_samples == N).all() and (table.n_layers == 3).all() and (table.n_heads == 4).all()
    assert (table.config_hash == "cafe").all()
    csv = pd.read_csv(tmp_path / "summary.csv")
    np.testing.assert_allclose(csv.mean_r, table.mean_r, rtol=1e-5)


def test_identical_samples_give_zero_width_intervals_and_layer_means(tmp_path):
    N = 5
    offset = [0.0, 0.1, -0.2]
    p = fake_decomposition(tmp_path / "t.nc", "m", "trained", np.full(N, 0.5), layer_offset=offset)
    table = summarize([p], tmp_path / "summary.csv", {"m": tmp_path / "summary.nc"}, n_boot=200, seed=0)
    np.testing.assert_allclose(table.mean_r, 0.5 + np.mean(offset))
    np.testing.assert_allclose(table.mean_r_lo, table.mean_r)
    np.testing.assert_allclose(table.mean_r_hi, table.mean_r)
    nc = xr.open_dataset(tmp_path / "summary.nc", engine="h5netcdf")
    assert nc["layer_r"].dims == ("variant", "method", "sink", "layer")
    np.testing.assert_allclose(
        nc["layer_r"].sel({"variant": "trained", "method": "A", "sink": "with"}), 0.5 + np.array(offset)
    )
    np.testing.assert_allclose(nc["layer_r_lo"], nc["layer_r"])
    assert nc["layer_position_share"].dims == ("variant", "vector", "basis", "sink", "layer")
    np.testing.assert_allclose(nc["layer_position_share"].sel(vector="k", basis="smooth"), SHARES["k"][1])
    assert "posgen_version" in nc.attrs and nc.attrs["model"] == "m"


def test_consistency_columns_the_sweep_and_the_difference_to_method_a(tmp_path):
    """Layer 1 sits 0.3 below the others: the lowest per-layer r is 0.6 and a third of the heads fall below
    HEAD_R; Method B's r equals Method A's here, so their paired difference is 0; Method A's row carries the mean
    r at every D of the sweep."""
    N = 4
    p = fake_decomposition(tmp_path / "t.nc", "m", "trained", np.full(N, 0.9), layer_offset=[0.0, -0.3, 0.0])
    ds = xr.open_dataset(p, engine="h5netcdf").load()
    sweep = np.broadcast_to(np.array([0.7, 0.8, 0.9]), (N, 3, 4, 2, 3)).copy()  # (sample, layer, head, sink, D)
    ds = ds.assign_coords(D=[0, 500, 1000]).assign(r_sweep=(("sample", "layer", "head", "sink", "D"), sweep))
    write_netcdf(ds, tmp_path / "s.nc")
    table = summarize([tmp_path / "s.nc"], tmp_path / "summary.csv", {"m": tmp_path / "summary.nc"}, n_boot=50)
    np.testing.assert_allclose(table.min_layer_r, 0.6)
    np.testing.assert_allclose(table.heads_below, 1 / 3)
    np.testing.assert_allclose(table.diff_vs_a, 0.0, atol=1e-12)
    assert set(table[table.method == "A"].r_sweep) == {"0:0.7000 500:0.8000 1000:0.9000"}
    assert table.err_over_bound.isna().all()  # no error or bound in this file
    assert table[table.method == "B"].r_sweep.isna().all() or (table[table.method == "B"].r_sweep == "").all()


def test_the_consistency_and_sweep_columns_carry_intervals_over_windows(tmp_path):
    """Windows that differ give intervals that contain the point and have width; the sweep's spread over windows
    whose own spreads are 0.1 and 0.3 lies between them; identical windows give zero width."""
    N = 6
    per_window = np.array([0.80, 0.84, 0.88, 0.92, 0.86, 0.90])
    p = fake_decomposition(tmp_path / "t.nc", "m", "trained", per_window, layer_offset=[0.0, -0.05, 0.0])
    ds = xr.open_dataset(p, engine="h5netcdf").load()
    width = np.where(np.arange(N) % 2, 0.3, 0.1)[:, None, None, None, None]  # each window's spread over D
    sweep = 0.8 + width * np.array([0.0, 0.5, 1.0]) + np.zeros((N, 3, 4, 2, 3))
    ds = ds.assign_coords(D=[0, 500, 1000]).assign(r_sweep=(("sample", "layer", "head", "sink", "D"), sweep))
    write_netcdf(ds, tmp_path / "s.nc")
    table = summarize([tmp_path / "s.nc"], tmp_path / "summary.csv", {"m": tmp_path / "summary.nc"}, n_boot=200)
    a = table[table.method == "A"].iloc[0]
    assert a.min_layer_r_lo < a.min_layer_r < a.min_layer_r_hi
    assert a.min_layer_r == pytest.approx(per_window.mean() - 0.05)
    assert a.heads_below_lo <= a.heads_below <= a.heads_below_hi
    assert a.sweep_spread == pytest.approx(0.2) and 0.1 < a.sweep_spread_lo < 0.2 < a.sweep_spread_hi < 0.3
    assert np.isnan(table[table.method == "B"].sweep_spread).all()
    # heads sit below 0.8 in some windows' draws and not in others: the share's interval has width
    low = fake_decomposition(tmp_path / "u.nc", "m", "trained", per_window - 0.07, layer_offset=[0.0, -0.05, 0.0])
    table = summarize([low], tmp_path / "u.csv", {"m": tmp_path / "u.nc"}, n_boot=200)
    b = table.iloc[0]
    assert b.heads_below_lo < b.heads_below_hi


def test_nan_heads_are_skipped(tmp_path):
    p = fake_decomposition(tmp_path / "t.nc", "m", "trained", np.full(4, 0.5))
    ds = xr.open_dataset(p, engine="h5netcdf").load()
    ds["r"][:, :, 0] = np.nan  # a head whose r is undefined (zero variance)
    write_netcdf(ds, tmp_path / "t2.nc")
    table = summarize([tmp_path / "t2.nc"], tmp_path / "s.csv", {"m": tmp_path / "s.nc"}, n_boot=100)
    np.testing.assert_allclose(table.mean_r, 0.5)


def test_bootstrap_indices_are_seeded():
    a, b = bootstrap_indices(10, 50, 3), bootstrap_indices(10, 50, 3)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (50, 10) and a.min() >= 0 and a.max() <= 9
    assert not np.array_equal(a, bootstrap_indices(10, 50, 4))


def test_mismatched_samples_are_refused(tmp_path):
    paths = [
        fake_decomposition(tmp_path / "t.nc", "m", "trained", np.full(4, 0.5)),
        fake_decomposition(tmp_path / "r.nc", "m", "random-seed0", np.full(3, 0.5)),
    ]
    with pytest.raises(ValueError, match="random-seed0: samples differ"):
        summarize(paths, tmp_path / "s.csv", {"m": tmp_path / "s.nc"}, n_boot=100)
    with pytest.raises(KeyError, match="no decomposition.nc for model.*other"):
        summarize(paths[:1], tmp_path / "s.csv", {"other": tmp_path / "s.nc"}, n_boot=100)


def test_rows_per_layer_type_and_nope_outside_the_rope_rows(tmp_path):
    """Layers global / sliding / NoPE with r 0.5, 0.6, 0.3: the 'rope' rows average the first two only."""
    g = np.random.default_rng(2)
    N = 6
    v = g.normal(0.5, 0.02, N)
    coords = {"layer_type": ["global", "sliding", "nope"], "dummy_distance_used": [1000, 511, 1000]}
    paths = [
        fake_decomposition(tmp_path / "t.nc", "g", "trained", v, layer_offset=[0, 0.1, -0.2], layer_coords=coords),
        fake_decomposition(tmp_path / "r.nc", "g", "random-seed0", v - 0.2, layer_coords=coords),
    ]
    table = summarize(paths, tmp_path / "s.csv", {"g": tmp_path / "s.nc"}, n_boot=300, seed=0)
    assert list(table.columns[: len(COLUMNS)]) == COLUMNS
    assert len(table) == 2 * 4 * 2 * 2  # variants x (rope, global, sliding, nope) x methods x sinks
    trained = table[(table.variant == "trained")].set_index(["layer_type", "method", "sink"]).sort_index()
    np.testing.assert_allclose(trained.loc["rope", "mean_r"], v.mean() + 0.05)  # (0 + 0.1) / 2: no NoPE layer
    np.testing.assert_allclose(trained.loc["global", "mean_r"], v.mean())
    np.testing.assert_allclose(trained.loc["sliding", "mean_r"], v.mean() + 0.1)
    np.testing.assert_allclose(trained.loc["nope", "mean_r"], v.mean() - 0.2)
    assert trained.loc["rope", "n_layers"].tolist() == [2] * 4 and (trained.loc["nope", "n_layers"] == 1).all()
    # paired differences per layer type
    random = table[(table.variant == "random-seed0")].set_index(["layer_type", "method", "sink"]).sort_index()
    np.testing.assert_allclose(random.loc["sliding", "diff_vs_trained"], -0.3, atol=1e-12)
    np.testing.assert_allclose(random.loc["rope", "diff_vs_trained"], -0.25, atol=1e-12)
    # the dummy distance each row's layers used (Method A only)
    assert trained.loc[("rope", "A"), "dummy_distance"].tolist() == ["511/1000"] * 2
    assert trained.loc[("sliding", "A"), "dummy_distance"].tolist() == ["511"] * 2
    assert trained.loc[("global", "B"), "dummy_distance"].tolist() == [""] * 2
    # rows: variant, then layer type in the order rope, global, sliding, nope
    assert table["layer_type"].tolist()[:16:4] == ["rope", "global", "sliding", "nope"]
    nc = xr.open_dataset(tmp_path / "s.nc", engine="h5netcdf")
    assert nc["layer_type"].values.tolist() == ["global", "sliding", "nope"]
    assert nc["dummy_distance_used"].values.tolist() == [1000, 511, 1000]
    csv = pd.read_csv(tmp_path / "s.csv", keep_default_na=False)
    assert csv["dummy_distance"].astype(str).tolist()[:2] == ["511/1000", "511/1000"]


def test_one_layer_type_keeps_one_row_per_variant_method_sink(tmp_path):
    coords = {"layer_type": ["sliding"] * 3, "dummy_distance_used": [15, 15, 15]}
    p = fake_decomposition(tmp_path / "t.nc", "m", "trained", np.full(3, 0.5), layer_coords=coords)
    table = summarize([p], tmp_path / "s.csv", {"m": tmp_path / "s.nc"}, n_boot=50)
    assert len(table) == 4 and (table.layer_type == "rope").all() and (table.n_layers == 3).all()
    assert table[table.method == "A"].dummy_distance.tolist() == ["15", "15"]
    # only NoPE layers: no 'rope' rows, the 'nope' rows alone
    coords = {"layer_type": ["nope"] * 3, "dummy_distance_used": [1000] * 3}
    p = fake_decomposition(tmp_path / "n.nc", "n", "trained", np.full(3, 0.5), layer_coords=coords)
    table = summarize([p], tmp_path / "n.csv", {"n": tmp_path / "n.nc"}, n_boot=50)
    assert (table.layer_type == "nope").all() and len(table) == 4
    # a file without layer types (written before them) reads as all global, D from its attrs
    p = fake_decomposition(tmp_path / "o.nc", "o", "trained", np.full(3, 0.5))
    table = summarize([p], tmp_path / "o.csv", {"o": tmp_path / "o.nc"}, n_boot=50)
    assert (table.layer_type == "rope").all() and table[table.method == "A"].dummy_distance.tolist() == ["1000"] * 2


def test_store_with_a_nope_layer_end_to_end(tmp_path):
    """qk.h5 with a global, a sliding-window (6 < T) and a NoPE layer (inv_freq 0) -> decomposition -> summary: the
    'rope' rows average the first two layers only; the NoPE layer (Method A exact there) has rows of its own."""
    from posgen.decomposition import decompose_store
    from posgen.testing.qk_store import toy_rope, write_qk_store

    g = np.random.default_rng(4)
    N, L, H, T, d = 3, 3, 2, 16, 8
    theta = np.tile(10000.0 ** (-np.arange(d // 2) / (d // 2)), (L, 1)).astype(np.float32)
    theta[2] = 0.0
    q, k = [], []
    for _ in range(N):  # drawn window by window, as before
        q.append(g.standard_normal((L, H, T, d)).astype(np.float32))
        k.append((g.standard_normal((L, 1, T, d)) + 1).astype(np.float32))
    rope = toy_rope(theta, np.zeros(H), scaling=d**-0.5, sliding_window=np.array([0, 6, 0]))
    write_qk_store(tmp_path / "qk.h5", np.stack(q), np.stack(k), rope)
    dec = decompose_store(
        tmp_path / "qk.h5",
        tmp_path / "dec.nc",
        DecompositionOptions.defaults(dummy_distances=[0, 100], dummy_distance=100, bound_samples=0),
        progress=False,
    )
    table = summarize([tmp_path / "dec.nc"], tmp_path / "s.csv", {"toy": tmp_path / "s.nc"}, n_boot=100)
    rows = table.set_index(["layer_type", "method", "sink"]).sort_index()
    r_a = dec["r"].sel({"method": "A", "sink": "without"})  # (sample, layer, head)
    np.testing.assert_allclose(rows.loc[("rope", "A", "without"), "mean_r"], float(r_a.isel(layer=[0, 1]).mean()))
    np.testing.assert_allclose(rows.loc[("sliding", "A", "without"), "mean_r"], float(r_a.isel(layer=1).mean()))
    np.testing.assert_allclose(rows.loc[("nope", "A", "without"), "mean_r"], 1.0, atol=1e-6)
    assert float(r_a.isel(layer=[0, 1]).mean()) < 0.99  # so leaving the NoPE layer out shows in the number
    assert rows.loc[("rope", "A", "with"), "dummy_distance"] == "5/100"
    assert rows.loc[("rope", "A", "with"), "n_layers"] == 2
