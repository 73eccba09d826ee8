"""The head atlas' tables (posgen.atlas.tables): heads.parquet read back against the decomposition.nc, bands.nc
and head_ablation.nc it was made from, and the classifiers' table against ablation.nc."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import xarray as xr

from posgen import api
from posgen.api import decompose
from posgen.atlas.tables import classifier_heads_step, heads_step
from posgen.parquet import read_table
from posgen.store import write_netcdf
from posgen.testing.datasets import make_qk
from posgen.workflow.job import StepJob

N_BOOT = 200


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run folder with two variants' decomposition.nc (the real decomposition of seeded q/k), bands.nc with
    known variances, the trained model's head_ablation.nc, and heads.parquet made from them by rule heads' job."""
    root = tmp_path_factory.mktemp("atlas")
    files = {"decomposition": [], "bands": [], "head_ablation": []}
    for seed, variant in enumerate(["trained", "random-seed0"]):
        qk = make_qk(n_samples=5, n_layers=2, n_heads=4, n_kv=2, n_tok=40, head_dim=8, seed=seed)
        folder = root / "results" / "toy" / variant
        dec = decompose(qk, dummy_distances=[0, 8, 16], dummy_distance=8, device="cpu")
        write_netcdf(dec.assign_attrs(model="toy", variant=variant), folder / "decomposition.nc")
        files["decomposition"].append(str(folder / "decomposition.nc"))
        # band variances 1, 2, 3, 4 at falling frequency: the low-frequency half (bands 2, 3) holds 7 / 10;
        # the keys' KV head 1 puts all its variance in band 0 (share 0)
        q_var = np.broadcast_to([1.0, 2.0, 3.0, 4.0], (2, 4, 4)).copy()
        k_var = np.stack([q_var[:, :2, :].copy()] * 1)[0]
        k_var[:, 1] = [5.0, 0.0, 0.0, 0.0]
        bands = xr.Dataset(
            {
                "q_var": (("layer", "head", "band"), q_var),
                "k_var": (("layer", "kv_head", "band"), k_var),
                "theta": (("layer", "band"), np.broadcast_to([1.0, 0.1, 0.01, 0.001], (2, 4)).copy()),
            },
            coords={"layer": [0, 1], "head": np.arange(4), "kv_head": [0, 1], "band": np.arange(4)},
        )
        write_netcdf(bands, folder / "bands.nc")
        files["bands"].append(str(folder / "bands.nc"))
    increase = np.arange(8.0).reshape(1, 2, 4) / 10
    ablation = xr.Dataset(
        {"loss_increase": (("probe", "layer", "head"), increase)},
        coords={"probe": ["repeat"], "layer": [0, 1], "head": np.arange(4)},
    )
    write_netcdf(ablation, root / "results" / "toy" / "trained" / "head_ablation.nc")
    files["head_ablation"].append(str(root / "results" / "toy" / "trained" / "head_ablation.nc"))
    out = root / "results" / "heads.parquet"
    job = StepJob.of(files, {"heads": str(out)}, {"n_boot": N_BOOT, "seed": 0, "config_hash": "abc123"})
    heads_step(job)
    return root, files, out


def test_a_row_of_heads_parquet_is_the_decomposition_mean_with_its_bootstrap_interval(run):
    root, files, out = run
    table = pd.read_parquet(out)  # the README's one-liner
    dec = xr.open_dataset(files["decomposition"][1], engine="h5netcdf")
    pick = {"layer": 1, "head": 2, "method": "A", "sink": "with"}
    (row,) = table.query("variant == 'random-seed0' and layer == 1 and head == 2 and method == 'A' and sink == 'with'")[
        ["r", "r_lo", "r_hi", "f_share", "r_sweep_d8", "k_position_share_smooth"]
    ].itertuples(index=False)
    per_window = dec["r"].sel(pick).values  # (sample,)
    assert row.r == pytest.approx(per_window.mean(), abs=1e-12)
    draws = np.random.default_rng(0).integers(0, len(per_window), size=(N_BOOT, len(per_window)))
    lo, hi = np.percentile(per_window[draws].mean(axis=1), [2.5, 97.5])
    assert (row.r_lo, row.r_hi) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))
    assert row.r_lo < row.r < row.r_hi  # five different windows: a real interval
    r2_f, r2_g = (dec[name].sel(pick).values.mean() for name in ("r2_f", "r2_g"))
    assert row.f_share == pytest.approx(r2_f / (r2_f + r2_g), abs=1e-12)
    assert row.r_sweep_d8 == pytest.approx(
        float(dec["r_sweep"].sel(layer=1, head=2, sink="with", D=8).mean()), abs=1e-12
    )
    share = dec["k_position_share"].sel(layer=1, head=2, basis="smooth", sink="with").mean()
    assert row.k_position_share_smooth == pytest.approx(float(share), abs=1e-12)


def test_the_api_returns_the_tables_as_dataframes(run):
    _, _, out = run
    table = api.heads(out)
    pd.testing.assert_frame_equal(table, pd.read_parquet(out))
    with pytest.raises(FileNotFoundError, match=r"nowhere/heads.parquet: no such file"):
        api.classifier_heads("nowhere/heads.parquet")


def test_heads_parquet_has_one_row_per_head_method_and_sink_with_the_other_tables_beside(run):
    _, _, out = run
    table = pd.read_parquet(out)
    assert len(table) == 2 * 2 * 4 * 4 * 2  # variants x layers x heads x methods x sinks
    assert not table.duplicated(["model", "variant", "layer", "head", "method", "sink"]).any()
    trained = table[table["variant"] == "trained"].set_index(["layer", "head", "method", "sink"])
    assert trained.loc[(1, 3, "B", "without"), "loss_increase_repeat"] == pytest.approx(0.7)
    assert table.loc[table["variant"] == "random-seed0", "loss_increase_repeat"].isna().all()  # not measured
    assert trained.loc[(0, 0, "A", "with"), "low_share_q"] == pytest.approx(0.7)
    assert trained.loc[(0, 1, "A", "with"), "low_share_k"] == pytest.approx(0.7)  # head 1 reads KV head 0
    assert trained.loc[(0, 2, "A", "with"), "low_share_k"] == pytest.approx(0.0)  # head 2 reads KV head 1
    assert trained["r_sweep_d8"].xs("B", level="method").isna().all()  # a Method A statistic
    assert set(table["config_hash"]) == {"abc123"}
    assert pq.read_schema(out).metadata[b"config_hash"] == b"abc123"


def test_bad_inputs_stop_in_one_line_naming_the_file(run, tmp_path):
    root, files, _ = run
    dec = xr.open_dataset(files["decomposition"][0], engine="h5netcdf").load().drop_vars("r_sweep")
    broken = tmp_path / "results" / "toy" / "trained" / "decomposition.nc"
    write_netcdf(dec, broken)
    job = StepJob.of(
        {"decomposition": [str(broken)]},
        {"heads": str(tmp_path / "h.parquet")},
        {"n_boot": 10, "seed": 0, "config_hash": ""},
    )
    with pytest.raises(KeyError, match=r"results/toy/trained/decomposition.nc: missing r_sweep"):
        heads_step(job)
    not_parquet = tmp_path / "heads.parquet"
    not_parquet.write_text("model,variant\n")
    with pytest.raises(OSError, match=r"heads.parquet: not a Parquet table .*; delete it and run: snakemake"):
        read_table(not_parquet)


def test_the_classifier_table_has_each_classifiers_drop_per_head(tmp_path):
    dims = ("experiment", "task", "pe", "seed", "layer", "head")
    shape = (1, 1, 2, 1, 2, 3)
    drop = np.arange(12.0).reshape(shape) / 100
    drop[0, 0, 1, 0, 0] = [0.5, 0.1, 0.2]  # rope's top head of layer 0 is head 0
    coords = {
        "experiment": ["clean"],
        "task": ["distance"],
        "pe": ["nope", "rope"],
        "seed": [0],
        "layer": [0, 1],
        "head": [0, 1, 2],
    }
    ablation = xr.Dataset(
        {
            "base_accuracy": (dims[:4], np.full(shape[:4], 0.9)),
            "ablated_accuracy": (dims, 0.9 - drop),
            "drop": (dims, drop),
            "kept_accuracy": (dims, np.full(shape, np.nan)),
            "top_head": (dims[:5], drop.argmax(-1)),
        },
        coords=coords,
    )
    write_netcdf(ablation, tmp_path / "ablation.nc")
    out = tmp_path / "heads.parquet"
    job = StepJob.of({"ablation": str(tmp_path / "ablation.nc")}, {"heads": str(out)}, {"config_hash": "h"})
    classifier_heads_step(job)
    table = pd.read_parquet(out).set_index(list(dims))
    assert len(table) == 12
    assert table.loc[("clean", "distance", "rope", 0, 0, 0), "drop"] == pytest.approx(0.5)
    assert table.loc[("clean", "distance", "rope", 0, 0, 0), "ablated_accuracy"] == pytest.approx(0.4)
    assert table["is_top_head"].sum() == 4  # one per (classifier, layer)
    assert table.loc[("clean", "distance", "rope", 0, 0, 0), "is_top_head"]


def test_verdict_rows_link_to_what_their_table_says_they_were_decided_on():
    """The atlas reads verdicts.csv, never reproduction.md: a first-paper row links every model to the head statistic
    its claim was decided on (the first key of a prefix); a second-paper row to the classifiers of the cells each of
    its regimes read, and to no other."""
    from posgen.atlas.verdicts import verdict_rows
    from posgen.claims import verdict_frame

    common = {"test": "t", "rules": "", "verdict": "inconclusive", "outcome": "inconclusive", "diagnostic": False}
    table = verdict_frame(
        [
            {
                **common,
                "paper": 1,
                "claim": "low",
                "statement": "low-frequency",
                "scope": "toy",
                "decided_on": "low_share_k",
            },
            {
                **common,
                "paper": 1,
                "claim": "cut",
                "statement": "perturbation",
                "scope": "toy",
                "decided_on": "loss_increase",
            },
            {
                **common,
                "paper": 2,
                "claim": "best",
                "statement": "RoPE best",
                "scope": "clean",
                "decided_on": "distance/rope; distance/nope",
            },
            {
                **common,
                "paper": 2,
                "claim": "best",
                "statement": "RoPE best",
                "scope": "other",
                "decided_on": "distance/nope",
            },
        ]
    )
    stats = {"low_share_k": ("keys' low share",), "loss_increase_repeat": ("loss, repeat",), "r_A": ("r",)}
    classifiers = [
        {"experiment": e, "task": t, "pe": p, "seed": 0, "key": f"{e}|{t}|{p}|0"}
        for e in ("clean", "other")
        for t in ("count", "distance")
        for p in ("rope", "nope", "sinusoidal")
    ]
    first, second = verdict_rows(table, ["toy", "big"], classifiers, stats)
    assert [r["links"] for r in first["rows"]] == [
        [("heads", "toy|low_share_k", "toy: keys' low share"), ("heads", "big|low_share_k", "big: keys' low share")],
        [
            ("heads", "toy|loss_increase_repeat", "toy: loss, repeat"),
            ("heads", "big|loss_increase_repeat", "big: loss, repeat"),
        ],
    ]
    (best,) = second["rows"]
    assert [target for _, target, _ in best["links"]] == [
        "clean|distance|rope|0",
        "clean|distance|nope|0",
        "other|distance|nope|0",
    ]
    assert best["cells"][2] == "<b>inconclusive</b>" and best["id"] == "verdict-2-0"


def test_the_page_is_its_packaged_template_filled_with_no_placeholder_left(run):
    """The page's skeleton, style and script are package files (posgen/atlas/assets, read through
    importlib.resources); the page inlines the style and script and fills every ``$name`` of the skeleton."""
    import json
    import re
    from importlib import resources
    from string import Template

    from plotly.offline import get_plotlyjs

    from posgen.atlas.page import build_page

    assets = {
        name: (resources.files("posgen.atlas") / "assets" / name).read_text()
        for name in ("atlas.html", "atlas.css", "atlas.js")
    }
    assert all(assets.values())
    names = Template(assets["atlas.html"]).get_identifiers()
    assert {"style", "script", "data", "plotly_js"} <= set(names)
    _, _, out = run
    page = build_page(heads_path=out)
    assert get_plotlyjs() in page  # one offline file
    ours = page.replace(get_plotlyjs(), "")
    assert not [n for n in names if f"${n}" in ours or f"${{{n}}}" in ours]
    assert assets["atlas.css"] in page and assets["atlas.js"] in page
    data = re.search(r'<script type="application/json" id="atlas-data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(data)["models"] == ["toy"]


def toy_columns(path) -> dict[str, np.ndarray]:
    """A toy step's per-head reader: its table's (layer, head) 'toy' variable."""
    return {"toy_score": xr.open_dataset(path, engine="h5netcdf")["toy"].transpose("layer", "head").values}


def test_a_step_that_declares_a_per_head_column_adds_it_to_heads_parquet_and_the_atlas_menu(run, monkeypatch, tmp_path):
    """docs/adding-a-step.md, "A per-head column": a step row with ``heads`` and ``head_columns`` is all it takes.
    Rule heads' inputs list its table of every model variant (posgen.workflow.targets.head_tables), heads.parquet
    gets its column on its variants' rows (NaN on the others), and the atlas' menu shows it with its label."""
    import dataclasses

    from posgen.atlas.page import statistics
    from posgen.workflow import steps, targets

    toy = dataclasses.replace(
        steps.STEPS["block_swap"],
        name="toy",
        heads="tests.unit.test_atlas:toy_columns",
        head_columns=(steps.HeadColumn("toy_score", "toy score per head"),),
        section="",
    )
    monkeypatch.setitem(steps.STEPS, "toy", toy)
    config = {"models": [{"name": "toy", "source": "embedded:x"}], "random_init": {"seeds": [0]}}
    monkeypatch.setattr(targets, "step_variants", lambda config, step="": ["trained", "random-seed0"])
    listed = targets.head_tables(config)
    assert listed["toy"] == ["results/toy/trained/toy.nc", "results/toy/random-seed0/toy.nc"]
    assert list(listed) == ["decomposition", "bands", "block_swap", "head_ablation", "band_interventions", "toy"]
    root, files, _ = run
    toy_file = root / "results" / "toy" / "trained" / "toy.nc"
    scores = np.arange(8.0).reshape(2, 4) + 0.5
    ds = xr.Dataset({"toy": (("layer", "head"), scores)}, coords={"layer": [0, 1], "head": np.arange(4)})
    write_netcdf(ds, toy_file)
    out = tmp_path / "heads.parquet"
    job = StepJob.of(
        {**files, "toy": [str(toy_file)]}, {"heads": str(out)}, {"n_boot": N_BOOT, "seed": 0, "config_hash": "a"}
    )
    heads_step(job)
    table = read_table(out)
    trained = table[table["variant"] == "trained"].set_index(["layer", "head", "method", "sink"])
    assert trained.loc[(1, 2, "B", "with"), "toy_score"] == 6.5  # every method and sink row of the head
    assert table.loc[table["variant"] == "random-seed0", "toy_score"].isna().all()
    menu = statistics(table)
    assert menu["toy_score"] == ("toy score per head", "toy_score", "A")
    assert list(menu)[-1] == "toy_score"  # the steps' order: after every earlier step's columns
