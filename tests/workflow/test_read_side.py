"""The read side and the command-line tools under hostile input (issue 63), each case on a copy of the tiny
workflow's finished run: one line, its exit status, every other file unchanged (their bytes compared), and where the
line names a command, that command run and the data restored."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from posgen import api
from posgen.integrity import StoreError
from posgen.testing.runs import ROOT, make_run
from tests.workflow.test_lineage import ENV

HEADS = "results/heads.parquet"


@pytest.fixture
def run(run_copy):
    """A copy of the tiny workflow's finished run, one per test (tests/conftest.py)."""
    return run_copy


def _files(workdir: Path) -> dict:
    """Every file of the run (results, resources, lineage records) and its bytes."""
    return {p: p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file() and ".snakemake" not in p.parts}


def _posgen(run, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=run.workdir, capture_output=True, text=True, env=ENV)


def _hint(run, line: str) -> None:
    """Run the command a ``remake them: snakemake ...`` or ``...; delete it and run: snakemake ...`` line names."""
    after = "remake them: snakemake " if "remake them: " in line else "and run: snakemake "
    command = line.split(after, 1)[1].split(" (with the run's own --configfile")[0]
    shell = f"snakemake -s {ROOT / 'Snakefile'} --configfile {run.configfile} {command}"
    proc = subprocess.run(["bash", "-c", shell], cwd=run.workdir, capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _forced_atlas(run) -> tuple[int, str]:
    """The atlas job forced on the run: its exit status and its log's last line."""
    proc = run.snakemake("--cores", "1", "results/atlas.html", "--forcerun", "atlas", check=False)
    lines = (run.workdir / "logs/atlas/atlas.log").read_text().strip().splitlines()
    return proc.returncode, lines[-1] if lines else ""


def _halve_r(path: Path) -> None:
    """r halved in a Parquet table, its metadata (and so its recorded digest) and mtime kept: valid Parquet."""
    stat = path.stat()
    table = pq.read_table(path)
    index = table.schema.get_field_index("r")
    halved = table.set_column(index, "r", pa.array(table["r"].to_numpy() / 2))
    pq.write_table(halved.replace_schema_metadata(table.schema.metadata), path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _flip_data_page(path: Path, n: int = 64) -> None:
    """``n`` random bytes in the first column's data page of a Parquet file."""
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    offset = column.data_page_offset + column.total_compressed_size // 2
    noise = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8).tobytes()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(noise)


def test_heads_parquet_with_flipped_bytes_is_one_line_and_its_hint_remakes_it(run):
    path = run.workdir / HEADS
    clean = pd.read_parquet(path)
    _flip_data_page(path)
    before = _files(run.workdir)
    with pytest.raises(StoreError, match=rf"^{path}: .*; delete it and run: snakemake --cores all {path} "):
        api.heads(path)
    status, last = _forced_atlas(run)
    assert status != 0 and last.startswith(f"StoreError: {HEADS}: "), last
    assert _files(run.workdir).keys() - {run.workdir / "results/atlas.html"} <= before.keys()
    assert all(before[p] == data for p, data in _files(run.workdir).items() if p.suffix != ".log" and p in before)
    path.unlink()
    _hint(run, last)
    pd.testing.assert_frame_equal(pd.read_parquet(path), clean)


def test_a_halved_r_is_reported_by_integrity_before_and_after_a_forced_atlas_job(run):
    path = run.workdir / HEADS
    clean = pd.read_parquet(path)
    _halve_r(path)
    said = f"{HEADS}: its data differ from what posgen wrote (edited or damaged after it was written)"
    first = _posgen(run, "posgen.integrity")
    assert first.returncode == 1 and first.stdout.splitlines()[0].startswith(said), first.stdout
    status, last = _forced_atlas(run)
    assert status != 0 and last.startswith(f"StoreError: {said}"), last  # the atlas is not made from it
    assert not (run.workdir / "results/atlas.html").exists()
    again = _posgen(run, "posgen.integrity")
    assert again.returncode == 1 and again.stdout.splitlines()[0].startswith(said), again.stdout
    _hint(run, again.stdout.strip().splitlines()[-1])
    pd.testing.assert_frame_equal(pd.read_parquet(path), clean)
    assert _posgen(run, "posgen.integrity", HEADS).returncode == 0


def test_a_collections_heads_table_in_heads_parquets_place_is_named(run):
    shutil.copy(run.workdir / "results/synthetic/heads.parquet", run.workdir / HEADS)
    with pytest.raises(StoreError, match="another file in its place: it is the heads.parquet of collection run"):
        api.heads(run.workdir / HEADS)
    status, last = _forced_atlas(run)
    assert status != 0 and "another file in its place" in last and "KeyError" not in last, last


@pytest.mark.parametrize("damage", ["truncated", "not-utf8"])
def test_a_damaged_reproduction_md_shapes_no_other_output(run, damage):
    """The atlas takes its verdicts from verdicts.parquet: a truncated reproduction.md, or one with a byte that is
    not UTF-8, leaves its verdict tables whole (8 second-paper rows) and its job succeeds."""
    md = run.workdir / "results/reproduction.md"
    text = md.read_bytes()
    md.write_bytes(text[: len(text) // 3] if damage == "truncated" else text.replace(b"Verdict", b"Verdict\xff", 1))
    status, last = _forced_atlas(run)
    assert status == 0, last
    page = (run.workdir / "results/atlas.html").read_text()
    assert page.count("<tr id='verdict-2-") == 8 and page.count("<tr id='verdict-1-") == 8


def test_a_misspelt_experiment_in_an_overlay_is_refused(run, tmp_path):
    """An overlay shaped like config.ensemble.yaml that misspells the run's experiment (claen for clean) would
    otherwise define a new experiment nothing trains and leave clean as it was."""
    overlay = tmp_path / "config.typo.yaml"
    overlay.write_text("synthetic:\n  experiments:\n    claen: {train: {ensemble: true}}\n")
    before = _files(run.workdir)
    proc = run.snakemake("-n", "all", "--configfile", str(run.configfile), str(overlay), check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        f"ConfigError: {overlay}: synthetic.experiments.claen: no collection of the merged config trains it "
        "(trained: clean); a misspelt name? An experiment kept on purpose: unused: true"
    ), last
    overlay.write_text("synthetic:\n  experiments:\n    claen: {unused: true, train: {ensemble: true}}\n")
    assert run.snakemake("-n", "all", "--configfile", str(run.configfile), str(overlay), check=False).returncode == 0
    assert _files(run.workdir) == before


def test_integrity_on_a_path_that_does_not_exist_is_an_error(run):
    proc = _posgen(run, "posgen.integrity", "results/nowhere")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "results/nowhere: no such file or folder (run from the run's working directory)"


def test_a_damaged_lineage_record_or_inputs_attr_is_one_line_and_its_hint_records_it_again(run):
    record = run.workdir / ".posgen/lineage/results/summary.csv.json"
    record.write_text('{"results/tiny-llama/summary.csv": ')
    table = run.workdir / "results/tiny-llama/trained/decomposition.nc"
    with h5py.File(table, "r+") as f:
        f.attrs["posgen_inputs"] = "[not json"
    proc = _posgen(run, "posgen.integrity")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith(
        "results/summary.csv: its lineage record .posgen/lineage/results/summary.csv.json is damaged"
    ), lines
    assert lines[1].startswith("results/tiny-llama/trained/decomposition.nc: its attribute posgen_inputs is damaged"), (
        lines
    )
    _hint(run, lines[-1])
    assert json.loads(record.read_text())  # recorded again
    assert _posgen(run, "posgen.integrity").returncode == 0


def test_settle_unchanged_settles_task_data_remade_with_the_same_content(run):
    """Task data record no inputs of their own: remade with the same content they are settled before the oldest
    classifier made from them, so nothing retrains."""
    task = "results/synthetic/tasks/distance.nc"
    run.snakemake("--cores", "1", task, "--forcerun", "synthetic_tasks")
    dry = run.snakemake("--cores", "1", "--dry-run")
    assert "Nothing to be done" not in dry.stdout + dry.stderr  # by mtimes the classifiers are out of date
    proc = _posgen(run, "posgen.integrity", "--settle-unchanged")
    assert task in proc.stdout.splitlines()[0], proc.stdout
    dry = run.snakemake("--cores", "1", "--dry-run")
    assert "Nothing to be done" in dry.stdout + dry.stderr


def test_plan_names_the_studies_and_a_study_the_config_does_not_train(run):
    unknown = _posgen(run, "posgen.plan", "--configfile", str(run.configfile), "--study", "nosuch")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.strip() == (
        "posgen.plan: --study nosuch: no such study (the studies: run, deposit_study, regime_study, decisive_study, "
        "decisive_gpu)"
    )
    absent = _posgen(run, "posgen.plan", "--configfile", str(run.configfile), "--study", "decisive_study")
    assert absent.returncode == 1 and "trains no experiment in synthetic.decisive_study" in absent.stderr


def test_a_run_sized_for_a_gpu_stops_before_any_job_where_none_is_visible(tmp_path):
    """The default config's decisive_gpu on this CPU (no CUDA device visible: CUDA_VISIBLE_DEVICES empty): one line
    with its price, nothing made; POSGEN_ON_CPU=1 is named as the way to run it anyway."""
    workdir = tmp_path / "gpu"
    run = make_run(workdir, yaml.safe_load((ROOT / "config.yaml").read_text()))
    proc = run.snakemake("--cores", "1", "decisive_gpu", check=False, env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("posgen: this run is sized for a GPU and none is visible here"), last
    assert "core-hours on this CPU" in last and "POSGEN_ON_CPU=1" in last
    assert not (workdir / "results").exists() or not any((workdir / "results").rglob("*.nc"))
    assert not (workdir / "resources/models").exists()


def test_an_unwritable_results_folder_stops_before_any_job(tmp_path):
    """results/ read-only: one line before any job (Snakemake would run get_model and windows, then fail with a
    traceback creating an output's folder). Root ignores permissions: there a read-only tmpfs stands in."""
    from posgen.start_checks import refuse_unwritable

    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)]).returncode:
            pytest.skip("root without a read-only mount: permissions cannot make a folder unwritable")
    else:
        folder.chmod(0o555)
    try:
        with pytest.raises(
            SystemExit,
            match=rf"^posgen: {folder}/ cannot be written \((Read-only file system|Permission denied)\); nothing was run",
        ):
            refuse_unwritable([folder])
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(folder)])
        else:
            folder.chmod(0o755)
