"""Training trajectories: checkpoint variants, the workflow's own tiny Llama, hub checkpoint series, the
per-step table, and the `trajectory` target end to end."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from posgen.config import ConfigError, init_seed, validate, variant_order, variant_step, variants
from posgen.corpus import load_text
from posgen.llm.bands import low_frequency_share
from posgen.models import load_model
from posgen.schedule import warmup_cosine
from posgen.testing.runs import make_run, tiny_config
from posgen.trajectory.train import train_trajectory
from posgen.workflow.figures import heatmap_variants

# small enough to train in a few seconds on one core
TINY_TRAIN = {
    "seed": 3,
    "vocab_size": 300,
    "n_layers": 2,
    "hidden_size": 32,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 8,
    "intermediate_size": 64,
    "seq_len": 32,
    "batch_size": 4,
    "lr": 3e-3,
    "warmup_steps": 2,
    "checkpoints": [0, 2, 6],
    "heldout_fraction": 0.2,
    "heldout_windows": 4,
}
SERIES_REPO = "posgen-test/tiny-series"


def _with_trajectory(config: dict, *entries, rates=(0, 0.05, 0.2)) -> dict:
    """``config`` with ``entries`` as trajectory.models and perturbation ``rates`` (the shared tiny config's
    lack the default sensitivity rates)."""
    config = copy.deepcopy(config)
    config["perturb"]["rates"] = list(rates)
    config["shards"] = 1  # shards are tests/workflow/test_workflow.py's; one job per step keeps this run short
    config["trajectory"] = {"models": list(entries)}
    return validate(config, check_paths=False)  # the trajectory rules under test, not the fake model folder


def _train_entry(name="tiny-rope", **train):
    return {"name": name, "source": "train", "train": {**TINY_TRAIN, **train}}


def test_variants_per_model(tmp_path):
    series = {"name": "pythia", "source": f"hf:{SERIES_REPO}", "revisions": ["step1000", "step0", "step64-tokens1B"]}
    config = _with_trajectory(tiny_config(tmp_path), _train_entry(checkpoints=[30, 0, 3]), series)
    # ordinary models keep trained + random-init controls; series are their steps, a trained one its control too
    assert variants(config) == variants(config, "tiny-llama") == ["trained", "random-seed0"]
    assert variants(config, "tiny-rope") == ["random-seed3", "step0", "step3", "step30"]
    assert variants(config, "pythia") == ["step1000", "step0", "step64"]
    assert sorted(variants(config, "pythia"), key=variant_order) == ["step0", "step64", "step1000"]
    assert sorted(["step10", "random-seed2", "step2", "trained"], key=variant_order) == [
        "trained",
        "random-seed2",
        "step2",
        "step10",
    ]
    assert init_seed("step30") == -1 and variant_step("step30") == 30 and variant_step("random-seed3") is None
    with pytest.raises(ConfigError, match="'steps'"):
        init_seed("steps")
    # defaults fill the training settings of a `train` entry
    filled = _with_trajectory(tiny_config(tmp_path), {"name": "t", "source": "train"})
    assert variants(filled, "t") == ["random-seed0", "step0", "step10", "step30", "step100", "step300", "step1000"]


@pytest.mark.parametrize(
    "entry, rates, message",
    [
        ({"name": "s", "source": f"hf:{SERIES_REPO}"}, None, r"trajectory.models\[0\].revisions: a hub"),
        ({"name": "s", "source": "train", "revisions": ["step1"]}, None, "has checkpoints, not revisions"),
        ({"name": "s", "source": f"hf:{SERIES_REPO}", "revisions": ["step1", "step01"]}, None, "same step"),
        ({"name": "s", "source": f"hf:{SERIES_REPO}", "revisions": ["main"]}, None, r"revisions\[0\]"),
        ({"name": "tiny-llama", "source": "train"}, None, "duplicate model name"),
        ({"name": "s", "source": "train"}, [0.0, 0.1], r"sensitivity_rates: \[0.05, 0.2\] not among perturb.rates"),
    ],
)
def test_trajectory_config_errors(tmp_path, entry, rates, message):
    with pytest.raises(ConfigError, match=message):
        _with_trajectory(tiny_config(tmp_path), entry, rates=rates or (0, 0.05, 0.2))


def test_learning_rate_schedule():
    warmup, total = 4, 20
    assert warmup_cosine(0, total, warmup) == pytest.approx(1 / 4)
    assert warmup_cosine(3, total, warmup) == pytest.approx(1)
    assert warmup_cosine(4, total, warmup) == pytest.approx(1)  # cosine starts at the peak
    assert warmup_cosine(12, total, warmup) == pytest.approx(1 / 2)  # halfway through the decay
    assert warmup_cosine(20, total, warmup) == pytest.approx(0.0, abs=1e-15)
    assert warmup_cosine(25, total, warmup) == pytest.approx(0.0, abs=1e-15)  # past the end: no rise again


def test_low_frequency_share():
    theta = np.array([1.0, 0.1, 0.01, 0.001, 0.0])  # the last band never rotates and is left out
    var = np.array([[1.0, 1.0, 1.0, 1.0, 100.0], [0.0, 1.0, 3.0, 4.0, 0.0]])
    # lower-frequency half = the bands with theta 0.01 and 0.001
    assert low_frequency_share(var, theta) == pytest.approx([0.5, 7 / 8])


def test_heatmap_variants():
    assert heatmap_variants(["random-seed0", "step0", "step5"]) == ["step0", "step5"]
    many = ["random-seed0"] + [f"step{n}" for n in (0, 10, 30, 100, 300, 1000, 3000)]
    assert heatmap_variants(many) == ["step0", "step30", "step300", "step3000"]


def _files_sha(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_source):
    """The tiny model trained twice from the same seed (text: a slice of the embedded corpus)."""
    config = _with_trajectory(tiny_config(tiny_source("llama")), _train_entry())
    train = config["trajectory"]["models"][0]["train"]  # TINY_TRAIN with the schema's defaults filled in
    text = load_text("embedded")[:60_000]
    runs = []
    for i in range(2):
        dest = tmp_path_factory.mktemp(f"trained-{i}") / "tiny-rope"
        runs.append((dest, train_trajectory(text, dest, train, progress=False)))
    return runs


def test_training_is_deterministic(trained):
    (dest_a, log_a), (dest_b, log_b) = trained
    files_a, files_b = _files_sha(dest_a), _files_sha(dest_b)
    # every checkpoint, its tokenizer and the manifests are byte for byte the same
    assert files_a == files_b
    assert {name.split("/")[0] for name in files_a if "/" in name} == {"step0", "step2", "step6"}
    np.testing.assert_array_equal(log_a["train_loss"].values, log_b["train_loss"].values)
    np.testing.assert_array_equal(log_a["heldout_ppl"].values, log_b["heldout_ppl"].values)
    # and training did change the weights
    assert files_a["step0/model.safetensors"] != files_a["step6/model.safetensors"]


def test_training_log_and_layout(trained):
    dest, log = trained[0]
    assert list(log["step"].values) == [0, 2, 6] and log.sizes["train_step"] == 6
    vocab = log.attrs["vocab_size"]
    assert vocab == TINY_TRAIN["vocab_size"]
    # at initialisation the prediction is close to uniform: perplexity about the vocabulary size
    assert 0.5 * vocab < float(log["heldout_ppl"].sel(step=0)) < 2 * vocab
    assert np.all(np.isfinite(log["train_loss"].values))
    assert log["lr"].values[1] == pytest.approx(TINY_TRAIN["lr"])  # end of the 2-step warm-up
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["source"] == "train" and set(manifest["revisions"]) == {"step0", "step2", "step6"}
    step = json.loads((dest / "step6" / "manifest.json").read_text())
    assert step["revision"] == "step6" and step["train_seed"] == 3
    assert (
        step["files"]["model.safetensors"]
        == hashlib.sha256((dest / "step6/model.safetensors").read_bytes()).hexdigest()
    )


def test_step0_equals_random_init_variant(trained):
    dest, _ = trained[0]
    step0, _, manifest = load_model(dest, "step0")
    control, _, _ = load_model(dest, f"random-seed{TINY_TRAIN['seed']}")
    later, _, _ = load_model(dest, "step6")
    assert manifest["revision"] == "step0"
    state0, state_c, state6 = step0.state_dict(), control.state_dict(), later.state_dict()
    assert state0.keys() == state_c.keys()
    for name in state0:
        torch.testing.assert_close(state0[name], state_c[name], rtol=0, atol=0, msg=name)
    assert any(not torch.equal(state0[name], state6[name]) for name in state0)


# ------------------------------------------------------------------------------------- the workflow


def _fake_hub_cache(cache: Path, tiny_source: Path, revisions: dict[str, int]) -> dict[str, str]:
    """A Hugging Face cache holding one tiny checkpoint per revision (different weights each), laid out as
    huggingface_hub writes it, so that snapshot_download resolves the revisions offline: only the network is
    replaced. Returns revision -> commit."""
    from safetensors.torch import load_file, save_file

    repo = cache / f"models--{SERIES_REPO.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    commits = {}
    for revision, scale in revisions.items():
        commit = hashlib.sha1(revision.encode()).hexdigest()
        snapshot = repo / "snapshots" / commit
        shutil.copytree(tiny_source, snapshot)
        weights = load_file(snapshot / "model.safetensors")
        save_file({k: v * scale for k, v in weights.items()}, snapshot / "model.safetensors", metadata={"format": "pt"})
        (repo / "refs" / revision).write_text(commit)
        commits[revision] = commit
    return commits


@pytest.fixture(scope="module")
def trajectory_run(tmp_path_factory, tiny_source):
    """`snakemake trajectory` on a config with the trained tiny model and a two-revision hub series."""
    workdir = tmp_path_factory.mktemp("trajectory-workflow")
    commits = _fake_hub_cache(workdir / "hf-cache", tiny_source("llama"), {"step0": 1, "step10": 2})
    config = tiny_config(tiny_source("llama"))
    config["n_samples"], config["seq_len"], config["shards"] = 2, 32, 1  # one job per step (shards: test_workflow)
    config["perturb"].update(n_samples=2, seq_len=16, rates=[0, 0.05, 0.2], caps=[4, 8])  # caps below seq_len
    config["trajectory"] = {
        "models": [
            _train_entry(),
            {"name": "series", "source": f"hf:{SERIES_REPO}", "revisions": ["step0", "step10"]},
        ]
    }
    run = make_run(workdir / "run", config)
    env = {"HF_HUB_CACHE": str(workdir / "hf-cache"), "HF_HUB_OFFLINE": "1"}
    run.snakemake("--cores", "2", "trajectory", env=env)
    return run, config, commits


def test_trajectory_target_runs_checkpoints_through_the_workflow(trajectory_run):
    run, config, _ = trajectory_run
    out = run.workdir / "results"
    for model in ("tiny-rope", "series"):
        table = pd.read_csv(out / model / "trajectory.csv")
        want = variants(config, model)
        assert list(dict.fromkeys(table["variant"])) == sorted(want, key=variant_order)  # ordered by step
        assert table["step"].tolist() == sorted(table["step"])
        assert np.isfinite(table[["mean_r", "pooled_r", "low_share_k", "ppl_token-swap_5pct"]].values).all()
        assert ((table["mean_r_lo"] <= table["mean_r"]) & (table["mean_r"] <= table["mean_r_hi"])).all()
        # the per-model summary lists every step, in step order
        summary = pd.read_csv(out / model / "summary.csv")
        assert list(dict.fromkeys(summary["variant"])) == sorted(want, key=variant_order)
        for name in ("trajectory", "trajectory_r_heatmap"):
            assert (out / model / "figures" / f"{name}.png").stat().st_size > 10_000
        decomposition = xr.open_dataset(out / model / "step0" / "decomposition.nc", engine="h5netcdf")
        assert decomposition.attrs["variant"] == "step0" and decomposition.attrs["init_seed"] == -1
        decomposition.close()
    trained = pd.read_csv(out / "tiny-rope" / "trajectory.csv")
    ppl = trained.drop_duplicates("variant").set_index("variant")["heldout_ppl"]
    assert math.isnan(ppl["random-seed3"]) and ppl["step6"] < ppl["step0"]
    # the default target is untouched: a dry run of `all` plans no trajectory job
    dry = run.snakemake("-n", "--cores", "2").stdout
    assert "train_trajectory" not in dry and "trajectory_table" not in dry and "tiny-rope" not in dry


def test_step0_decomposition_equals_random_init_control(trajectory_run):
    run, _, _ = trajectory_run
    out = run.workdir / "results" / "tiny-rope"
    step0 = xr.open_dataset(out / "step0" / "decomposition.nc", engine="h5netcdf")
    control = xr.open_dataset(out / "random-seed3" / "decomposition.nc", engine="h5netcdf")
    for name in ("r", "r2_f", "r2_g", "r_sweep"):
        np.testing.assert_array_equal(step0[name].values, control[name].values, err_msg=name)
    step0.close()
    control.close()
    table = pd.read_csv(out / "trajectory.csv").set_index(["variant", "method", "sink"])
    stats = ["mean_r", "mean_r_lo", "mean_r_hi", "pooled_r", "r2_f", "low_share_q", "low_share_k"]
    pd.testing.assert_frame_equal(
        table.loc["step0", stats], table.loc["random-seed3", stats], check_exact=True, check_names=False
    )
    assert not table.loc["step6", "mean_r"].equals(table.loc["step0", "mean_r"])


def test_revision_list_gives_one_variant_per_revision(trajectory_run):
    run, _, commits = trajectory_run
    folder = run.workdir / "resources" / "models" / "series"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["revisions"] == {"step0": "step0", "step10": "step10"}
    assert manifest["commits"] == {"step0": commits["step0"], "step10": commits["step10"]}
    for variant, revision in (("step0", "step0"), ("step10", "step10")):
        step = json.loads((folder / variant / "manifest.json").read_text())
        assert step["revision_name"] == revision and step["revision"] == commits[revision]
        assert step["source"] == f"hf:{SERIES_REPO}@{revision}"
        first_shard = next((run.workdir / "results" / "series" / variant / "shards").glob("0-*/qk.h5"))
        qk = xr.open_dataset(first_shard, engine="h5netcdf")
        assert qk.attrs["model_revision"] == commits[revision] and qk.attrs["variant"] == variant
        qk.close()
    # the two revisions hold different weights, and the analysis sees them
    r = [
        xr.open_dataset(run.workdir / "results" / "series" / v / "decomposition.nc", engine="h5netcdf")["r"].values
        for v in ("step0", "step10")
    ]
    assert not np.array_equal(r[0], r[1], equal_nan=True)


# ------------------------------------------------------------------------- the table and its figures


def _bands(low: float, high: float, n_layers=2, n_heads=4, n_kv=2) -> xr.Dataset:
    """bands.nc whose token variance is ``low`` in each of the two low-frequency bands, ``high`` in the two others."""
    theta = np.array([1.0, 0.1, 0.01, 0.001])
    var_band = np.array([high, high, low, low])
    data = {"theta": (("layer", "band"), np.stack([theta] * n_layers))}
    for side, h, head in (("q", n_heads, "head"), ("k", n_kv, "kv_head")):
        var = np.broadcast_to(var_band, (n_layers, h, 4)).copy()
        data[f"{side}_var"] = (("layer", head, "band"), var)
        data[f"{side}_mean_sq"] = (("layer", head, "band"), np.ones_like(var))
    return xr.Dataset(data, coords={"layer": np.arange(n_layers), "band": np.arange(4)})


def _perturb(scale: float, n_samples=3) -> xr.Dataset:
    """perturb.nc with ppl_ratio = 1 + scale * rate in every sample (kinds token-swap, posid-swap)."""
    rates = np.array([0.0, 0.05, 0.2])
    ratio = np.broadcast_to(1 + scale * rates[None, :, None], (2, 3, n_samples)).copy()  # (kind, rate, sample)
    return xr.Dataset(
        {"ppl_ratio": (("kind", "rate", "sample"), ratio)},
        coords={"kind": ["token-swap", "posid-swap"], "rate": rates, "sample": np.arange(n_samples)},
    )


def test_trajectory_table_and_figures(tmp_path):
    from posgen.figures.registry import render
    from posgen.llm.summary import SHARE_COLUMNS
    from posgen.store import write_netcdf
    from posgen.trajectory.table import trajectory_job

    variants_ = ["step10", "random-seed0", "step0"]  # any order in: step order out, the control first
    rows, bands, perturb = [], [], []
    for i, v in enumerate(variants_):
        for method in "AB":
            for sink in ("with", "without"):
                r = 0.1 * i + (0.5 if method == "A" else 0.6)
                rows.append(
                    dict(variant=v, method=method, sink=sink, mean_r=r, mean_r_lo=r - 0.05, mean_r_hi=r + 0.05,
                         pooled_r=r + 0.1, pooled_r_lo=r + 0.05, pooled_r_hi=r + 0.15,
                         r2_f=0.2 * i if method == "A" else np.nan, r2_g=0.1 if method == "A" else np.nan,
                         **{c: 0.01 * (i + 1) * (j + 1) + (0.5 if sink == "with" else 0.0)
                            for j, c in enumerate(SHARE_COLUMNS)})
                )  # fmt: skip
        write_netcdf(_bands(low=3.0 * i + 1, high=1.0), tmp_path / f"bands_{v}.nc")
        write_netcdf(_perturb(scale=float(i)), tmp_path / f"perturb_{v}.nc")
        bands.append(tmp_path / f"bands_{v}.nc")
        perturb.append(tmp_path / f"perturb_{v}.nc")
    pd.DataFrame(rows).to_csv(tmp_path / "summary.csv", index=False)
    training = xr.Dataset({"heldout_ppl": ("step", [900.0, 300.0])}, coords={"step": [0, 10]})
    write_netcdf(training, tmp_path / "training.nc")
    ds = trajectory_job(
        tmp_path / "summary.csv", bands, perturb, variants_, tmp_path / "t.csv", tmp_path / "t.nc",
        sensitivity_rates=[0.05, 0.2], training_path=tmp_path / "training.nc", n_boot=100, model="m",
    )  # fmt: skip
    assert list(ds["variant"].values) == ["random-seed0", "step0", "step10"]
    assert list(ds["step"].values) == [-1, 0, 10]
    # low-frequency share: 2 low bands of variance 3i + 1 against 2 high bands of variance 1
    expected_share = [(3 * i + 1) / (3 * i + 2) for i in (1, 2, 0)]
    np.testing.assert_allclose(ds["low_share_k"].values, expected_share)
    np.testing.assert_allclose(ds["low_share_q"].values, expected_share)
    # sensitivity: 1 + i * rate in every sample, so the interval collapses onto the mean
    np.testing.assert_allclose(ds["ppl_ratio"].sel(kind="token-swap", rate=0.2).values, [1.2, 1.4, 1.0])
    np.testing.assert_allclose(ds["ppl_ratio_lo"].values, ds["ppl_ratio"].values)
    np.testing.assert_allclose(ds["mean_r"].sel({"method": "B", "sink": "without"}).values, [0.7, 0.8, 0.6])
    # the position shares per (variant, sink), in step order: random-seed0 (i=1), step0 (i=2), step10 (i=0)
    for j, column in enumerate(SHARE_COLUMNS):
        expected = [0.01 * (i + 1) * (j + 1) for i in (1, 2, 0)]
        np.testing.assert_allclose(ds[column].sel(sink="without").values, expected)
        np.testing.assert_allclose(ds[column].sel(sink="with").values, np.add(expected, 0.5))
    assert np.isnan(ds["heldout_ppl"].values[0]) and list(ds["heldout_ppl"].values[1:]) == [900.0, 300.0]
    table = pd.read_csv(tmp_path / "t.csv")
    assert len(table) == 3 * 2 * 2 and table["step"].tolist() == sorted(table["step"])
    assert table.loc[(table["variant"] == "step0") & (table["method"] == "A"), "r2_f"].tolist() == [0.4, 0.4]
    assert table["ppl_posid-swap_20pct"].tolist()[::4] == pytest.approx([1.2, 1.4, 1.0])

    render("trajectory", {"trajectory": tmp_path / "t.nc"}, tmp_path / "t.png", tmp_path / "t.pdf", model="m")
    assert (tmp_path / "t.png").stat().st_size > 10_000 and (tmp_path / "t.pdf").read_bytes()[:5] == b"%PDF-"
    from posgen.testing.datasets import make_decomposition

    files = []
    for i, v in enumerate(["step0", "step10"]):
        write_netcdf(make_decomposition(seed=i), tmp_path / f"d_{v}.nc")
        files.append(tmp_path / f"d_{v}.nc")
    render(
        "trajectory_r_heatmap",
        {"decomposition": files},
        tmp_path / "h.png",
        tmp_path / "h.pdf",
        variants=["step0", "step10"],
        model="m",
    )
    assert (tmp_path / "h.png").stat().st_size > 10_000
