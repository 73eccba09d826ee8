"""Lineage end to end (issue 39 item 4), on a copy of the tiny workflow's finished run: every output records what
it was made from, `python -m posgen.integrity` finds what an input replaced with an old mtime leaves out of date
(to any depth, tables and figures included), its printed command remakes exactly that, and an input remade with
the same content leaves what was made from it up to date (`--settle-unchanged`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from posgen.integrity import INPUTS_ATTR, LINEAGE_DIR
from posgen.store import open_dataset, write_netcdf
from posgen.testing.runs import ROOT

DECOMPOSITION = "results/tiny-llama/trained/decomposition.nc"


# the checkout's own library, whatever the installed one is (as the Snakefile imports it)
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def integrity(run, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "posgen.integrity", *args], cwd=run.workdir, capture_output=True, text=True, env=ENV
    )


def run_hint(run, line: str) -> None:
    """The command a ``remake them: snakemake ... (with the run's own --configfile ...)`` line prints, run as printed
    (in a shell) on ``run``'s Snakefile and configfile."""
    command = line.split("remake them: snakemake ", 1)[1].split(" (with the run's own --configfile")[0]
    shell = f"snakemake -s {ROOT / 'Snakefile'} --configfile {run.configfile} {command}"
    proc = subprocess.run(["bash", "-c", shell], cwd=run.workdir, capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]


def nothing_to_do(run) -> bool:
    proc = run.snakemake("--cores", "1", "--dry-run")
    return "Nothing to be done" in proc.stdout + proc.stderr


def test_a_finished_run_is_consistent_and_its_tables_and_figures_record_their_inputs(run_copy):
    proc = integrity(run_copy)
    assert proc.returncode == 0 and "every file was made from the inputs there now" in proc.stdout, proc.stdout
    records = {p.relative_to(run_copy.workdir / LINEAGE_DIR) for p in (run_copy.workdir / LINEAGE_DIR).rglob("*")}
    for made in ["results/summary.csv", "results/reproduction.md", "results/synthetic/summary.csv"]:
        assert (run_copy.workdir / made).is_file() and f"{made}.json" in {str(r) for r in records}, made
    assert any(str(r).startswith("results/tiny-llama/figures/") and str(r).endswith(".png.json") for r in records)
    # a job that writes many files records, for each, only what that file was made from
    gathered = json.loads(open_dataset(run_copy.workdir / "results/synthetic/ablation.nc").attrs[INPUTS_ATTR])
    assert gathered and all(name.endswith("/ablation.nc") for name in gathered), sorted(gathered)
    one = "results/synthetic/clean/count/rope/seed1/probe.nc"
    analysed = json.loads(open_dataset(run_copy.workdir / one).attrs[INPUTS_ATTR])
    assert sorted(analysed) == [
        "results/synthetic/clean/count/rope/seed1/model.pt",
        "results/synthetic/clean/count/rope/seed1/train.nc",
        "results/synthetic/tasks/count.nc",
    ]


def test_an_input_replaced_with_an_old_mtime_is_found_and_the_printed_command_remakes_its_dependants(run_copy):
    run = run_copy
    table = run.workdir / DECOMPOSITION
    before = pd.read_csv(run.workdir / "results/summary.csv")
    # another version of the gathered table, restored as `cp -p` would: its old mtime kept
    other = open_dataset(table, lazy=False).load()
    other["r"] = other["r"] * 0.5
    write_netcdf(other, run.workdir / "other.nc")
    stat = table.stat()
    shutil.copyfile(run.workdir / "other.nc", table)
    os.utime(table, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert nothing_to_do(run)  # Snakemake goes by mtimes: it sees nothing

    proc = integrity(run)
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    direct = [line for line in lines if line.endswith(f"made from {DECOMPOSITION}, which has changed since")]
    # the model's own files, and the run's per-head table (the atlas reads every model's decomposition)
    assert direct and all(line.startswith(("results/tiny-llama/", "results/heads.parquet")) for line in direct), lines
    further = [line for line in lines if line.endswith("which is itself out of date")]
    named = {line.split(":", 1)[0] for line in direct + further}
    # second-order dependants: the cross-model table, the reproduction tables, the figures
    assert {"results/summary.csv", "results/reproduction.md"} <= named, lines
    assert any(name.startswith("results/tiny-llama/figures/") for name in named), lines
    # only the files made from it: nothing of the second family (nor its reproduction table), no extraction
    assert not any(name.startswith(("results/synthetic/", "results/tiny-llama/trained/shards/")) for name in named)
    assert "results/reproduction_synthetic.csv" not in named
    command = lines[-1]
    assert command.startswith("remake them: snakemake --cores all ") and len(lines) == len(named) + 1
    assert len(command) < 400, command  # a short command, whatever the number of files (issue 53)

    run_hint(run, command)
    proc = integrity(run)
    assert proc.returncode == 0, proc.stdout
    after = pd.read_csv(run.workdir / "results/summary.csv")
    assert not after.equals(before)  # made from the table there now
    assert nothing_to_do(run)


def test_an_input_remade_with_the_same_content_leaves_its_dependants_up_to_date(run_copy):
    run = run_copy
    table = run.workdir / DECOMPOSITION
    digest_before = open_dataset(table).attrs["posgen_content_digest"]
    run.snakemake("--cores", "1", DECOMPOSITION, "--forcerun", "gather")
    assert open_dataset(table).attrs["posgen_content_digest"] == digest_before
    assert not nothing_to_do(run)  # by mtimes, everything made from it is out of date
    proc = integrity(run, "--settle-unchanged")
    assert proc.returncode == 0 and "every file was made from the inputs there now" in proc.stdout, proc.stdout
    assert nothing_to_do(run)
