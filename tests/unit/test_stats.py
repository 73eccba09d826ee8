"""posgen.stats: one Pearson r for numpy and torch, the same r from sums, and the bootstrap helpers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import xarray as xr

from posgen.stats import bootstrap_indices, bootstrap_mean, interval, pearson, pearson_from_sums
from posgen.store import carried_attrs, provenance, require
from posgen.testing.runs import ROOT

SRC = ROOT / "src"


def test_pearson_matches_corrcoef_for_numpy_and_torch():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 50))
    y = 0.5 * x + rng.normal(size=(3, 50))
    expected = [np.corrcoef(a, b)[0, 1] for a, b in zip(x, y)]
    np.testing.assert_allclose(pearson(x, y), expected, rtol=1e-12)
    assert pearson(x[0], y[0]) == pytest.approx(expected[0], rel=1e-12)
    assert isinstance(pearson(x[0], y[0]), float)
    from_torch = pearson(torch.from_numpy(x).clone(), torch.from_numpy(y).clone())
    np.testing.assert_allclose(from_torch.numpy(), expected, rtol=1e-12)


def test_pearson_is_exact_on_a_linear_relation_and_nan_without_variance():
    x = np.arange(10.0)
    assert pearson(x, 3 * x + 1) == pytest.approx(1.0)
    assert pearson(x, -2 * x) == pytest.approx(-1.0)
    assert np.isnan(pearson(x, np.ones(10)))


def test_pearson_from_sums_equals_pearson_for_numpy_and_torch():
    rng = np.random.default_rng(1)
    x = rng.normal(size=200) + 5.0  # an offset: the sums must still give the centred r
    y = x - rng.normal(size=200)
    sums = (len(x), x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())
    assert float(pearson_from_sums(*sums)) == pytest.approx(pearson(x, y), rel=1e-10)
    r_torch = pearson_from_sums(*(torch.tensor(float(v), dtype=torch.float64) for v in sums))
    assert r_torch.item() == pytest.approx(pearson(x, y), rel=1e-10)
    assert np.isnan(pearson_from_sums(3, 3.0, 1.0, 3.0, 1.0, 1.0))  # x constant: zero variance


def test_interval_of_the_mean_over_bootstrap_indices():
    values = np.array([1.0, 2.0, 3.0, 4.0])
    idx = bootstrap_indices(4, 500, 0)
    assert idx.shape == (500, 4) and idx.min() >= 0 and idx.max() <= 3
    mean, lo, hi = interval(lambda v: v.mean(0), values, idx)
    assert mean == 2.5 and 1.0 <= lo < 2.5 < hi <= 4.0
    m, lo_da, hi_da = bootstrap_mean(xr.DataArray(values, dims="sample"), "sample", n_boot=500, seed=0)
    assert float(m) == 2.5 and float(lo_da) == pytest.approx(lo) and float(hi_da) == pytest.approx(hi)  # same draws


def test_stats_and_store_do_not_import_torch():
    code = (
        f"import sys; sys.path.insert(0, {str(SRC)!r}); import posgen.stats, posgen.store, posgen.llm.summary; "
        "a = posgen.store.provenance(); assert a['torch_version'] and a['transformers_version'], a; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_require_names_every_missing_variable_and_carried_attrs_copy_the_model_keys():
    ds = xr.Dataset({"q": ("token", np.zeros(2))}, attrs={"model": "m", "variant": "trained", "other": 1})
    require(ds, ["q", "token"], "qk.h5")
    with pytest.raises(KeyError, match="qk.h5: missing k, inv_freq"):
        require(ds, ["q", "k", "inv_freq"], "qk.h5")
    assert carried_attrs(ds) == {"model": "m", "variant": "trained"}
    assert provenance(**carried_attrs(ds))["model"] == "m"
