"""Identity of every per-job file (issue 53 item 1): each file records what it is (posgen.paths.identity of the path
it was written to) and every reader refuses, in one line naming the file and what it claims to be, a valid file in
another's place: another classifier's curves, another variant's table, another shard's, another collection's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr

from posgen import paths
from posgen.bench.decompose import synthetic_store
from posgen.gather import gather
from posgen.integrity import IDENTITY_ATTR, StoreError
from posgen.llm.summary import concat_tables, read_decompositions
from posgen.store import open_dataset, write_netcdf
from posgen.synthetic.analysis import gather as gather_analyses
from posgen.synthetic.summary import write_summary

CURVES = "results/synthetic/clean/distance/{pe}/seed0/train.nc"
HINT = "; delete it and run: snakemake --cores all {} (with the run's own --configfile, if it had one)"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # messages name files relative to the working directory


def _table(path, **attrs) -> None:
    write_netcdf(xr.Dataset({"x": ("sample", np.arange(2.0))}, coords={"sample": [0, 1]}, attrs=attrs), path)


def _swap(source, target) -> None:
    """``source`` copied over ``target`` (both intact, their digests valid)."""
    shutil.copyfile(source, target)


def test_a_path_says_what_its_file_is():
    assert paths.identity("/x/results/synthetic/clean/distance/alibi/seed0/train.nc") == {
        "paper": "synthetic",
        "file": "train.nc",
        "experiment": "clean",
        "task": "distance",
        "pe": "alibi",
        "seed": "0",
    }
    assert paths.identity("results/synthetic/training.nc") == {
        "paper": "synthetic",
        "file": "training.nc",
        "collection": "run",
    }
    assert paths.identity("results/synthetic/regime_study/probe.nc")["collection"] == "regime_study"
    assert paths.identity("results/synthetic/tasks/count.nc")["dataset"] == "count"
    assert paths.identity("results/m/trained/shards/0-2/qk.h5") == {
        "paper": "llm",
        "file": "qk.h5",
        "model": "m",
        "variant": "trained",
        "shard": "0-2",
    }
    assert paths.identity("results/m/random-seed1/perturb.nc") == {
        "paper": "llm",
        "file": "perturb.nc",
        "model": "m",
        "variant": "random-seed1",
    }
    assert paths.identity("results/m/training.nc") == {"paper": "llm", "file": "training.nc", "model": "m"}
    for outside in ("out.nc", "results/qk.h5", "results/synthetic/clean/distance/rope/seed0/model.pt"):
        assert paths.identity(outside) is None, outside


def test_every_file_records_its_identity_and_another_classifiers_curves_are_refused():
    for pe in ("alibi", "rope"):
        _table(CURVES.format(pe=pe), experiment="clean", task="distance", pe=pe, seed=0)
    alibi = CURVES.format(pe="alibi")
    assert json.loads(open_dataset(alibi).attrs[IDENTITY_ATTR]) == paths.identity(alibi)
    _swap(CURVES.format(pe="rope"), alibi)
    with pytest.raises(StoreError) as info:
        open_dataset(alibi)
    assert str(info.value) == (
        f"{alibi}: another file in its place: it is the train.nc of experiment clean, task distance, pe rope, "
        "seed 0 (its path: pe alibi)" + HINT.format(alibi)
    )


def test_a_file_written_before_identities_is_checked_on_its_own_attrs():
    for pe in ("alibi", "rope"):
        _table(CURVES.format(pe=pe), experiment="clean", task="distance", pe=pe, seed=0)
        with h5py.File(CURVES.format(pe=pe), "r+") as f:  # as written before posgen_identity existed
            del f.attrs[IDENTITY_ATTR], f.attrs["posgen_attrs_digest"]
    open_dataset(CURVES.format(pe="alibi")).close()
    _swap(CURVES.format(pe="rope"), CURVES.format(pe="alibi"))
    with pytest.raises(StoreError, match=r"train.nc: another file in its place: .* pe rope, seed 0 \(its path: pe"):
        open_dataset(CURVES.format(pe="alibi"))


def test_an_identity_that_is_not_an_object_is_refused_in_one_line():
    path = CURVES.format(pe="rope")
    _table(path, pe="rope")
    with h5py.File(path, "r+") as f:
        f.attrs[IDENTITY_ATTR] = "5"
        del f.attrs["posgen_attrs_digest"]
    with pytest.raises(StoreError, match=f"^{path}: its attribute {IDENTITY_ATTR} is not a JSON object "):
        open_dataset(path)


def test_a_file_outside_the_workflow_layout_is_read_as_it_is():
    _table("results/synthetic/clean/distance/rope/seed0/train.nc", pe="rope")
    shutil.copyfile("results/synthetic/clean/distance/rope/seed0/train.nc", "copy.nc")
    assert open_dataset("copy.nc").attrs["pe"] == "rope"
    _table("copy.nc", pe="rope")  # rewritten elsewhere: no identity carried over from the file it was read from
    assert IDENTITY_ATTR not in open_dataset("copy.nc").attrs


def test_the_gather_of_a_collection_names_the_classifiers_file_in_anothers_place():
    analyses = [f"results/synthetic/clean/distance/{pe}/seed0/ablation.nc" for pe in ("alibi", "rope")]
    for path, pe in zip(analyses, ("alibi", "rope")):
        part = xr.Dataset({"drop": ("head", [0.1, 0.2])}, coords={"head": [0, 1]})
        write_netcdf(part.expand_dims(experiment=["clean"], task=["distance"], pe=[pe], seed=[0]), path)
    gather_analyses(analyses, "results/synthetic/ablation.nc")
    before = open_dataset("results/synthetic/ablation.nc", lazy=False).load()
    _swap(analyses[1], analyses[0])
    with pytest.raises(StoreError, match=f"^{analyses[0]}: another file in its place: it is the ablation.nc of "):
        gather_analyses(analyses, "results/synthetic/ablation.nc")
    xr.testing.assert_identical(open_dataset("results/synthetic/ablation.nc", lazy=False).load(), before)


def test_the_gather_of_shards_names_the_shard_or_variant_in_anothers_place():
    shard = "results/m/{variant}/shards/{shard}/perturb.nc"
    for variant in ("trained", "random-seed0"):
        for start in (0, 2):
            path = shard.format(variant=variant, shard=f"{start}-{start + 2}")
            write_netcdf(xr.Dataset({"x": ("sample", [1.0, 2.0])}, coords={"sample": [start, start + 1]}), path)
    ours = [shard.format(variant="trained", shard=s) for s in ("0-2", "2-4")]
    gather(ours, "results/m/trained/perturb.nc")
    _swap(ours[0], ours[1])
    with pytest.raises(
        StoreError, match=f"^{ours[1]}: another file in its place: .* shard 0-2 \\(its path: shard 2-4\\)"
    ):
        gather(ours, "results/m/trained/perturb.nc")
    _swap(shard.format(variant="random-seed0", shard="2-4"), ours[1])
    with pytest.raises(StoreError, match=r"\(its path: variant trained\)"):
        gather(ours, "results/m/trained/perturb.nc")
    # a gathered table carries its own identity, not its first shard's
    assert json.loads(open_dataset("results/m/trained/perturb.nc").attrs[IDENTITY_ATTR]) == {
        "paper": "llm",
        "file": "perturb.nc",
        "model": "m",
        "variant": "trained",
    }


def test_a_summary_refuses_another_variants_table_and_another_collections_part():
    tables = {v: f"results/m/{v}/decomposition.nc" for v in ("trained", "random-seed0")}
    for variant, path in tables.items():
        _table(path, model="m", variant=variant)
    _swap(tables["random-seed0"], tables["trained"])
    with pytest.raises(StoreError, match=r"decomposition.nc of model m, variant random-seed0 \(its path: variant"):
        read_decompositions(list(tables.values()))
    parts = {part: paths.in_collection(template, "run") for part, template in paths.COLLECTION_PARTS.items()}
    other = paths.in_collection(paths.COLLECTION_PARTS["training"], "regime_study")
    _table(other)
    _swap(other, parts["training"])
    with pytest.raises(StoreError, match=r"it is the training.nc of collection regime_study \(its path: collection"):
        write_summary(parts, "summary.csv", "classifiers.csv", "deposit.csv")


def test_qk_store_records_its_model_variant_and_shard():
    path = "results/m/trained/shards/0-2/qk.h5"
    synthetic_store(path, n_samples=2, n_layers=1, n_tokens=8, n_heads=2, n_kv_heads=1, head_dim=4)
    assert json.loads(open_dataset(path).attrs[IDENTITY_ATTR])["shard"] == "0-2"
    other = "results/m/trained/shards/2-4/qk.h5"
    shutil.copytree("results/m/trained/shards/0-2", "results/m/trained/shards/2-4")
    with pytest.raises(StoreError, match=f"^{other}: another file in its place: it is the qk.h5 of model m, "):
        open_dataset(other)


def test_the_table_of_every_model_refuses_another_models_summary():
    for model in ("m", "n"):
        Path(f"results/{model}").mkdir(parents=True)
        Path(f"results/{model}/summary.csv").write_text(f"model,variant,r\n{model},trained,0.5\n")
    concat_tables(["results/m/summary.csv", "results/n/summary.csv"], "results/summary.csv")
    _swap("results/n/summary.csv", "results/m/summary.csv")
    with pytest.raises(
        StoreError, match=r"^results/m/summary.csv: another file in its place: its rows are of model n "
    ):
        concat_tables(["results/m/summary.csv", "results/n/summary.csv"], "results/summary.csv")
