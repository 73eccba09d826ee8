"""Content digests (issue 26): a plausible edit that keeps HDF5's Fletcher-32 checksums valid stops the reader with
one line naming the file, the variable and the command that remakes it; untouched data read as before."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr

from posgen.bench.decompose import synthetic_store
from posgen.integrity import (
    EDITED,
    INPUTS_ATTR,
    LINEAGE_DIR,
    StoreError,
    current_digest,
    digest,
    main,
    record_inputs,
    settle_unchanged,
    stale,
)
from posgen.snakemake_records import incomplete_files
from posgen.store import atomic_path, open_dataset, write_netcdf


@pytest.fixture
def qk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # messages show paths relative to the working directory
    return synthetic_store(
        tmp_path / "qk.h5", n_samples=2, n_layers=3, n_tokens=40, n_heads=4, n_kv_heads=2, head_dim=8
    )


def test_digest_is_the_crc_of_the_bytes_and_sees_a_reversal():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert digest(x) == digest(x.copy()) and digest(x) != digest(x[:, ::-1])
    assert digest(x[:, ::-1]) == digest(np.ascontiguousarray(x[:, ::-1]))  # the bytes in C order, not the buffer


def test_q_block_reversed_along_tokens_is_named_and_other_blocks_still_read(qk):
    clean = {layer: open_dataset(qk, lazy=False)["q"].isel(sample=1, layer=layer).values for layer in range(3)}
    with h5py.File(qk, "r+") as f:  # valid Fletcher-32 after the edit: h5py writes the chunk anew
        f["q"][1, 2] = f["q"][1, 2][:, ::-1]
    with pytest.raises(StoreError) as info:
        open_dataset(qk, lazy=False)["q"].isel(sample=1, layer=2).values
    message = str(info.value)
    assert message == (
        f"qk.h5: variable q (sample 1, layer 2): {EDITED}; delete it and run: snakemake --cores all qk.h5 "
        "(with the run's own --configfile, if it had one)"
    )
    for layer in (0, 1):  # the blocks nobody edited: read, and equal the clean file's
        np.testing.assert_array_equal(
            open_dataset(qk, lazy=False)["q"].isel(sample=1, layer=layer).values, clean[layer]
        )
    # a read that covers the edited block, lazily through dask or all at once, fails the same way
    with pytest.raises(StoreError, match="variable q \\(sample 1, layer 2\\)"):
        open_dataset(qk, lazy=True)["q"].sum().compute()
    with pytest.raises(StoreError, match="variable q \\(sample 1, layer 2\\)"):
        open_dataset(qk, lazy=False)["q"].isel(head=0).values


def test_r_halved_in_a_table_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ds = xr.Dataset(
        {"r": (("sample", "head"), np.linspace(0.1, 0.9, 6).reshape(2, 3)), "n": ("sample", np.array([3, 4]))}
    )
    write_netcdf(ds, tmp_path / "decomposition.nc")
    with h5py.File(tmp_path / "decomposition.nc", "r+") as f:
        f["r"][...] = f["r"][...] / 2
    opened = open_dataset(tmp_path / "decomposition.nc", lazy=False)
    np.testing.assert_array_equal(opened["n"].values, [3, 4])  # the variable nobody edited
    with pytest.raises(
        StoreError, match=f"^decomposition.nc: variable r: {EDITED.replace('(', '.').replace(')', '.')}"
    ):
        opened["r"].values


def test_a_table_rewritten_from_another_carries_its_own_digests(tmp_path):
    """Attrs and encodings come along when a file's variables are reused: the new file's digests are its own."""
    write_netcdf(xr.Dataset({"r": ("head", np.array([0.5, 0.25], dtype=np.float32))}), tmp_path / "a.nc")
    derived = open_dataset(tmp_path / "a.nc", lazy=False).load()
    derived["r"] = derived["r"].astype(np.float64) * 3  # another dtype, the old variable's attrs kept
    derived["r"].attrs.update(open_dataset(tmp_path / "a.nc")["r"].attrs)
    write_netcdf(derived, tmp_path / "b.nc")
    np.testing.assert_array_equal(open_dataset(tmp_path / "b.nc", lazy=False)["r"].values, [1.5, 0.75])


@pytest.fixture
def job_inputs():
    """record_inputs as a job's setup calls it; forgotten afterwards (a module-level list)."""
    yield record_inputs
    record_inputs([])


def test_outputs_record_their_inputs_and_stale_ones_are_listed(tmp_path, monkeypatch, job_inputs):
    monkeypatch.chdir(tmp_path)
    table = xr.Dataset({"r": ("head", np.array([0.5, 0.25]))})
    write_netcdf(table, "a.nc")
    job_inputs(["a.nc", "missing.csv"])  # an input that is not there is not recorded
    write_netcdf(table * 2, "b.nc")
    job_inputs([])  # the job that writes a.nc reads nothing
    assert json.loads(open_dataset("b.nc").attrs[INPUTS_ATTR]) == {"a.nc": current_digest(Path("a.nc"))}
    assert stale(["."]) == []
    assert main(["."]) == 0
    write_netcdf(table, "a.nc")  # the same data again: the same content digest, b.nc is not stale
    assert stale(["."]) == []
    write_netcdf(table + 1, "a.nc")  # a new version of a.nc
    lines = ["b.nc: made from a.nc, which has changed since", "remake them: snakemake --cores all b.nc --forcerun b.nc"]
    assert [text.split(" (with the run")[0] for text in stale(["."])] == lines
    assert main(["b.nc"]) == 1
    Path("a.nc").unlink()
    assert "which is gone" in stale(["b.nc"])[0]


def test_tables_record_their_inputs_and_dependants_of_stale_files_are_stale_to_any_depth(
    tmp_path, monkeypatch, job_inputs, capsys
):
    """a.nc -> b.nc -> c.csv -> d.md: a new a.nc leaves b, c and d out of date, and one command remakes all three."""
    monkeypatch.chdir(tmp_path)
    write_netcdf(xr.Dataset({"r": ("head", np.array([0.5, 0.25]))}), "a.nc")
    job_inputs(["a.nc"])
    write_netcdf(xr.Dataset({"r": ("head", np.array([1.0, 0.5]))}), "b.nc")
    job_inputs(["b.nc"])
    with atomic_path("c.csv") as tmp:
        tmp.write_text("r\n1.0\n")
    job_inputs(["c.csv", "a.nc"])
    with atomic_path("d.md") as tmp:
        tmp.write_text("# r\n")
    job_inputs([])
    assert json.loads((LINEAGE_DIR / "c.csv.json").read_text()) == {"b.nc": current_digest(Path("b.nc"))}
    assert stale(["."]) == []
    write_netcdf(xr.Dataset({"r": ("head", np.array([0.5, 0.3]))}), "a.nc")
    assert [text.split(" (with the run")[0] for text in stale(["."])] == [
        "b.nc: made from a.nc, which has changed since",
        "c.csv: made from b.nc, which is itself out of date",
        "d.md: made from a.nc, which has changed since",
        # the files made from nothing out of date as targets, those made directly from a.nc forced (issue 53)
        "remake them: snakemake --cores all d.md --forcerun b.nc d.md",
    ]
    # a lineage that cannot be kept is a line in the log, not a failed job: the file itself is written
    (LINEAGE_DIR / "f.csv.json").mkdir(parents=True)  # a folder where the record would go
    job_inputs(["a.nc"])
    with atomic_path("f.csv") as tmp:
        tmp.write_text("x\n")
    job_inputs([])
    assert Path("f.csv").read_text() == "x\n" and "cannot record the lineage of f.csv" in capsys.readouterr().err
    # a file written outside a job records nothing: it is not listed, and nothing it was made from is known
    with atomic_path("e.csv") as tmp:
        tmp.write_text("x\n")
    assert not (LINEAGE_DIR / "e.csv.json").exists()


def test_the_remake_command_of_many_files_stays_short_and_lists_them_through_the_module(
    tmp_path, monkeypatch, job_inputs, capsys
):
    """A changed input read by 40 files, each read by a table (issue 53: a printed command of 6,169 characters):
    the command reads its targets and forced files from `python -m posgen.integrity`, which prints each list."""
    monkeypatch.chdir(tmp_path)
    write_netcdf(xr.Dataset({"r": ("head", np.array([0.5]))}), "a.nc")
    for i in range(40):
        job_inputs(["a.nc"])
        write_netcdf(xr.Dataset({"r": ("head", np.array([float(i)]))}), f"results/m/part{i:02d}.nc")
        job_inputs([f"results/m/part{i:02d}.nc"])
        with atomic_path(f"results/m/table{i:02d}.csv") as tmp:
            tmp.write_text(f"{i}\n")
    job_inputs([])
    write_netcdf(xr.Dataset({"r": ("head", np.array([0.75]))}), "a.nc")
    lines = stale(["."])
    assert len(lines) == 81 and len(lines[-1]) < 300, lines[-1]
    assert lines[-1] == (
        "remake them: snakemake --cores all $(python -m posgen.integrity . --targets) --forcerun "
        "$(python -m posgen.integrity . --forced) (with the run's own --configfile, if it had one)"
    )
    capsys.readouterr()
    assert main([".", "--targets"]) == 0
    assert capsys.readouterr().out.split() == [f"results/m/table{i:02d}.csv" for i in range(40)]
    assert main([".", "--forced"]) == 0
    assert capsys.readouterr().out.split() == [f"results/m/part{i:02d}.nc" for i in range(40)]


def test_a_file_remade_with_the_same_content_is_settled_before_what_was_made_from_it(tmp_path, monkeypatch, job_inputs):
    """r.nc -> a.nc -> b.nc -> c.csv, x.nc -> y.nc: a.nc remade with the same content gets an mtime just after
    r.nc's (before b.nc's); x.nc remade with other content leaves y.nc out of date, and nothing is settled for it."""
    monkeypatch.chdir(tmp_path)
    data = xr.Dataset({"r": ("head", np.array([0.5, 0.25]))})
    write_netcdf(data, "r.nc")
    write_netcdf(data, "x.nc")
    job_inputs(["r.nc"])
    write_netcdf(data * 2, "a.nc")
    job_inputs(["a.nc"])
    write_netcdf(data * 3, "b.nc")
    job_inputs(["b.nc"])
    with atomic_path("c.csv") as tmp:
        tmp.write_text("r\n")
    job_inputs(["x.nc"])
    write_netcdf(data * 4, "y.nc")
    for second, name in enumerate(["r.nc", "x.nc", "a.nc", "b.nc", "c.csv", "y.nc"]):  # made in this order
        os.utime(name, ns=(0, (10 + second) * 10**9))
    job_inputs(["r.nc"])
    write_netcdf(data * 2, "a.nc")  # remade with the same content: now newer than b.nc
    job_inputs([])
    write_netcdf(data + 1, "x.nc")  # remade with other content
    assert settle_unchanged(["."]) == ["a.nc"]
    assert Path("a.nc").stat().st_mtime_ns == 10 * 10**9 + 1_000_000  # 1 ms after r.nc
    assert Path("b.nc").stat().st_mtime == 13 and Path("y.nc").stat().st_mtime == 15
    assert [line.split(":")[0] for line in stale(["."])][:1] == ["y.nc"]
    assert settle_unchanged(["."]) == []  # settled once


def test_qk_store_content_digest_is_its_data_only(tmp_path):
    """Two stores of the same data written at different times: one content digest; other data: another."""
    first = synthetic_store(
        tmp_path / "a.h5", n_samples=1, n_layers=2, n_tokens=16, n_heads=2, n_kv_heads=1, head_dim=4
    )
    again = synthetic_store(
        tmp_path / "b.h5", n_samples=1, n_layers=2, n_tokens=16, n_heads=2, n_kv_heads=1, head_dim=4
    )
    other = synthetic_store(
        tmp_path / "c.h5", n_samples=1, n_layers=2, n_tokens=16, n_heads=2, n_kv_heads=1, head_dim=4, seed=1
    )
    assert current_digest(first) == current_digest(again) != current_digest(other)
    assert len(current_digest(first)) == 8


def _scores_file(path):
    ds = xr.Dataset(
        {"test_accuracy": ("step", np.array([0.5, 0.9]))},
        coords={"step": np.array([1, 2]), "head": np.arange(3)},
        attrs={"test_accuracy": 0.9467, "pe": "alibi", "model_config": json.dumps({"n_layers": 2})},
    )
    write_netcdf(ds, path)


@pytest.mark.parametrize(
    "edit, what",
    [
        (lambda f: f.attrs.__setitem__("test_accuracy", 0.5), "its attributes"),  # a score kept as an attribute
        (lambda f: f.attrs.__setitem__("pe", "rope"), "its attributes"),
        (lambda f: f.attrs.__setitem__("added", 1), "its attributes"),
        (lambda f: f["test_accuracy"].__setitem__(0, 0.25), "variable test_accuracy"),
        (lambda f: f["head"].__setitem__(0, 7), "variable head"),  # a coordinate
    ],
)
def test_every_stored_value_is_under_a_digest(tmp_path, monkeypatch, edit, what):
    monkeypatch.chdir(tmp_path)
    _scores_file(tmp_path / "train.nc")
    clean = open_dataset(tmp_path / "train.nc", lazy=False)
    assert float(clean.attrs["test_accuracy"]) == 0.9467 and clean["head"].values.tolist() == [0, 1, 2]
    clean.close()
    with h5py.File(tmp_path / "train.nc", "r+") as f:
        edit(f)
    with pytest.raises(StoreError) as info:
        open_dataset(tmp_path / "train.nc", lazy=False).load()
    assert str(info.value).startswith(f"train.nc: {what}: {EDITED}; delete it and run: snakemake --cores all train.nc")


def test_the_files_snakemake_marks_incomplete_are_listed_with_what_they_are(tmp_path, monkeypatch, job_inputs, capsys):
    """After a killed run Snakemake refuses to go on until told --rerun-incomplete (issue 53): `python -m
    posgen.integrity --incomplete` says which files, whether each is there and whole, and what to run."""
    import base64

    monkeypatch.chdir(tmp_path)
    assert main(["--incomplete"]) == 0 and "Snakemake marks no file incomplete here" in capsys.readouterr().out
    write_netcdf(xr.Dataset({"r": ("head", np.array([0.5]))}), "a.nc")
    job_inputs(["a.nc"])
    long = "results/" + "/".join(["x" * 60] * 5) + "/b.nc"  # a marker name past the name limit: cut into folders
    for name in ("results/m/b.nc", long):
        write_netcdf(xr.Dataset({"r": ("head", np.array([1.0]))}), name)
    job_inputs([])
    for name in ("results/m/b.nc", "results/m/c.nc", long):  # Snakemake's records of the killed job's outputs
        encoded = base64.urlsafe_b64encode(name.encode()).decode()
        chunks = [encoded[i : i + 254] for i in range(0, len(encoded), 254)]
        marker = Path(".snakemake/incomplete", *["@" + c for c in chunks[:-1]], chunks[-1])
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text('{"external_jobid": null}')
    assert sorted(incomplete_files()) == sorted(["results/m/b.nc", "results/m/c.nc", long])
    assert main(["--incomplete"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:3] == [
        "results/m/b.nc: there and whole, made from the inputs there now",
        "results/m/c.nc: not there (its job was killed before it wrote it)",
        f"{long}: there and whole, made from the inputs there now",
    ]
    assert lines[3].startswith("Snakemake marks these incomplete because the job writing them was killed before it")
    assert "snakemake --cores all --rerun-incomplete" in lines[3] and len(lines) == 4
