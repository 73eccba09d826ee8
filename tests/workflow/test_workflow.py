"""The tiny end-to-end run of the whole workflow, its idempotence, lint, and config errors through Snakemake."""

import copy
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import xarray as xr
import yaml

from posgen.decomposition.options import DecompositionOptions
from posgen.store import open_dataset
from posgen.testing.runs import ROOT, WorkflowRun, make_run, tiny_config

SHARDS = ("0-2", "2-3")  # tiny_config: 3 windows in 2 shards; perturbation: 2 windows in 2 shards


def test_tiny_run_extracts_one_job_per_shard(tiny_workflow):
    for variant in ["trained", "random-seed0"]:
        # the fused path keeps the first window's q/k (extract.keep_qk: 1); the second shard keeps none
        kept = {
            shard: open_dataset(tiny_workflow.workdir / f"results/tiny-llama/{variant}/shards/{shard}/qk.h5")
            for shard in SHARDS
        }
        assert kept["0-2"]["sample"].values.tolist() == [0] and kept["2-3"].sizes["sample"] == 0
        for ds in kept.values():
            assert ds.sizes["token"] == 48
            assert ds.attrs["self_check_max_rel_error"] <= 1e-4  # every shard checks its first window
            assert ds.attrs["variant"] == variant and len(ds.attrs["config_hash"]) == 16
    logs = sorted(
        p.relative_to(tiny_workflow.workdir).as_posix() for p in (tiny_workflow.workdir / "logs").rglob("*.log")
    )
    for shard in SHARDS:
        assert f"logs/extract/tiny-llama/trained/{shard}.log" in logs
    assert {"logs/perturb/tiny-llama/trained/0-1.log", "logs/cap/tiny-llama/trained/1-2.log"} <= set(logs)
    assert "decompose" not in {log.split("/")[1] for log in logs}  # the fused path has no decompose job
    assert (
        "extract tiny-llama/trained: 100%"
        in (tiny_workflow.workdir / "logs/extract/tiny-llama/trained/2-3.log").read_text()
    )


def test_sharded_fused_run_equals_the_unsharded_store_path(tiny_workflow, tmp_path):
    """The workflow's gathered outputs (two shards, fused path) against the store path run here on all windows."""
    from posgen.config import load
    from posgen.decomposition import decompose_store
    from posgen.llm.bands import band_stats
    from posgen.llm.extract import extract
    from posgen.llm.options import CapOptions, ExtractOptions, PerturbOptions
    from posgen.llm.perturb import cap_job, perturb_job
    from posgen.testing.tiny import tiny_job

    config = load(tiny_workflow.configfile)
    assert config["shards"] == 2 and config["extract"]["analysis"] == "fused"
    work, results = tiny_workflow.workdir, tiny_workflow.workdir / "results" / "tiny-llama"
    model, windows = work / "resources/models/tiny-llama", results / "windows.h5"
    dec, per = config["decomposition"], config["perturb"]
    common = {"model": "tiny-llama"}
    refs = ExtractOptions.defaults(ref_samples=[0], ref_layers=[0, -1])
    extract(tiny_job(model, windows, tmp_path / "qk.h5", **common), refs)
    want = {
        "decomposition.nc": decompose_store(
            tmp_path / "qk.h5",
            tmp_path / "decomposition.nc",
            DecompositionOptions.of(dec, device="cpu"),
            progress=False,
        ),
        "bands.nc": band_stats(tmp_path / "qk.h5", tmp_path / "bands.nc", progress=False),
    }
    sizes = {"n_samples": per["n_samples"], "seq_len": per["seq_len"], "dummy_distance": dec["dummy_distance"]}
    want["perturb.nc"] = perturb_job(
        tiny_job(model, windows, tmp_path / "perturb.nc", **common),
        PerturbOptions(rates=per["rates"], seed=per["seed"], jitter=per["jitter"], **sizes),
    )
    want["cap.nc"] = cap_job(
        tiny_job(model, windows, tmp_path / "cap.nc", **common), CapOptions(distance_caps=per["caps"], **sizes)
    )
    for name, expected in want.items():
        got = open_dataset(results / "trained" / name, lazy=False)
        assert got.attrs["shards"] == ",".join(SHARDS if name in ("decomposition.nc", "bands.nc") else ("0-1", "1-2"))
        assert set(got.data_vars) == set(expected.data_vars), name
        for var in expected.data_vars:
            np.testing.assert_allclose(
                got[var].values, expected[var].values, rtol=1e-5, atol=1e-6, err_msg=f"{name} {var}"
            )


def test_summary_csv_is_the_per_model_tables_verbatim(tiny_workflow):
    results = tiny_workflow.workdir / "results"
    per_model = (results / "tiny-llama" / "summary.csv").read_text()
    assert (results / "summary.csv").read_text() == per_model
    assert per_model.count("\ntiny-llama,") == 2 * 4 * 2  # variants x methods (A, B, A-drift, A-shared) x sinks


def test_synthetic_summary_carries_provenance_like_the_first_family(tiny_workflow):
    import pandas as pd

    import posgen

    results = tiny_workflow.workdir / "results"
    first = pd.read_csv(results / "summary.csv", dtype=str)
    for name in ("summary.csv", "classifiers.csv", "deposit.csv"):
        table = pd.read_csv(results / "synthetic" / name, dtype=str)
        assert list(table.columns[-2:]) == list(first.columns[-2:]) == ["config_hash", "posgen_version"], name
        assert table["config_hash"].str.fullmatch("[0-9a-f]{16}").all(), name
        assert (table["posgen_version"] == posgen.__version__).all(), name


def test_second_run_has_nothing_to_do(tiny_workflow):
    proc = tiny_workflow.snakemake("--cores", "2", "--dry-run")
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_lint_is_clean(tiny_workflow):
    proc = tiny_workflow.snakemake("--lint", check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Lints for" not in output, output[-3000:]


def test_bad_config_stops_snakemake_with_one_line_naming_the_key(tmp_path, tiny_source):
    config = tiny_config(tiny_source("llama"))
    config["seq_len"] = -5
    run = make_run(tmp_path, config)
    proc = run.snakemake("--cores", "1", "--dry-run", check=False)
    assert proc.returncode != 0
    assert re.search(r"config\.seq_len: -5 is less than the minimum of 8", proc.stderr + proc.stdout)


# Steps whose jobs cost model forward passes (or read their outputs per model and variant).
UPSTREAM = {
    "get_model",
    "windows",
    "extract",
    "gather",
    "perturb",
    "cap",
    "examples",
    "head_ablation",
}  # fused path: no decompose, bands
# the second family's jobs before its summary (which reads the interval settings)
SYNTHETIC_UPSTREAM = {
    "synthetic_tasks",
    "synthetic_train",
    "synthetic_analyse",
    "synthetic_train_task_clean",  # the tiny run's clean trains and analyses one job per task
    "synthetic_analyse_task_clean",
    "synthetic_gather",
}


def planned_jobs(proc) -> list[tuple[str, list[str]]]:
    """(rule, output paths) of every job a ``snakemake --dry-run`` lists, checked against its job-stats total."""
    text = proc.stdout + proc.stderr
    jobs = []
    for rule, body in re.findall(r"^(?:local)?rule (\w+):\n((?:    .*\n)*)", text, re.M):
        outputs = re.search(r"^    output: (.*)$", body, re.M)
        jobs.append((rule, outputs.group(1).split(", ") if outputs else []))
    total = re.search(r"^total\s+(\d+)$", text, re.M)
    assert total and int(total.group(1)) == len(jobs), text[-3000:]
    return jobs


def dry_run_with(tiny_workflow, tmp_path, edit) -> list[tuple[str, list[str]]]:
    """The jobs a dry run plans over the finished tiny run with an edited copy of its config (outputs untouched).

    The copy is written with its keys sorted, unlike the original: the order of keys in the file must not count.
    """
    config = copy.deepcopy(yaml.safe_load(tiny_workflow.configfile.read_text()))
    edit(config)
    configfile = tmp_path / "config.yaml"
    configfile.write_text(yaml.safe_dump(config, sort_keys=True))
    return planned_jobs(WorkflowRun(tiny_workflow.workdir, configfile).snakemake("--dry-run"))


def test_changing_an_interval_setting_reruns_only_summaries_and_figures(tiny_workflow, tmp_path):
    def edit(config):
        config["intervals"]["bootstrap"] = 300

    jobs = dry_run_with(tiny_workflow, tmp_path, edit)
    rules = {rule for rule, _ in jobs}
    assert not rules & (UPSTREAM | SYNTHETIC_UPSTREAM), sorted(rules)
    # what does read the setting reruns: the summary and the bootstrapped figures, not the other figures
    figures = {
        Path(path).stem for rule, out in jobs if rule.startswith("fig_") for path in out if path.endswith(".png")
    }
    assert "summarize" in rules and {"dummy_sweep", "perturb_ppl", "perturb_fg", "cap"} <= figures
    assert not figures & {"r_heatmap", "bands"} and not any(f.startswith(("logit_maps", "scatter")) for f in figures)


def test_appending_a_model_runs_nothing_for_the_first_model(tiny_workflow, tmp_path):
    def edit(config):
        config["models"].append({"name": "tiny-llama-b", "source": config["models"][0]["source"]})

    def of(model, outputs):
        return any(path.startswith((f"results/{model}/", f"resources/models/{model}/")) for path in outputs)

    jobs = dry_run_with(tiny_workflow, tmp_path, edit)
    first = [(rule, out) for rule, out in jobs if of("tiny-llama", out)]
    assert not first, first
    new = {rule for rule, out in jobs if of("tiny-llama-b", out)}
    assert UPSTREAM | {"summarize", "fig_per_model"} <= new, sorted(new)
    assert any("results/tiny-llama-b/figures/cap.png" in out for _, out in jobs)
    # the cross-model tables are the only other jobs
    run_level = {"summary_table", "reproduction", "heads", "atlas", "all"}  # the tables over every model
    assert {rule for rule, out in jobs if rule not in new} <= run_level


def test_adding_an_experiment_trains_only_its_classifiers(tiny_workflow, tmp_path):
    def edit(config):
        config["synthetic"]["experiments"]["faithful"] = {"faithful": True, "seeds": [0]}
        config["synthetic"]["run"] = ["clean", "faithful"]

    jobs = dry_run_with(tiny_workflow, tmp_path, edit)
    trained = [out for rule, out in jobs if rule in ("synthetic_train", "synthetic_analyse")]
    n_classifiers = 2 * len(tiny_workflow_pes(tiny_workflow))  # two tasks, one seed
    assert len(trained) == 2 * n_classifiers
    assert all(path.startswith("results/synthetic/faithful/") for out in trained for path in out)
    # besides them: the gathered files, the summary, the figures and tables that read them
    others = {rule for rule, _ in jobs if rule not in ("synthetic_train", "synthetic_analyse")}
    assert others & (UPSTREAM | {"synthetic_tasks"}) == set(), sorted(others)
    assert {"synthetic_gather", "synthetic_summary", "reproduction"} <= others


def test_an_ensemble_experiment_trains_each_task_and_pe_once_for_all_its_seeds(tiny_workflow, tmp_path):
    def edit(config):
        config["synthetic"]["experiments"]["ens"] = {"seeds": [0, 1, 2], "train": {"ensemble": True}}
        config["synthetic"]["run"] = ["clean", "ens"]

    jobs = dry_run_with(tiny_workflow, tmp_path, edit)
    ensembles = [out for rule, out in jobs if rule == "synthetic_train_ensemble_ens"]
    assert len(ensembles) == 2 * len(tiny_workflow_pes(tiny_workflow))  # one job per (task, pe)
    for out in ensembles:
        folders = {path.rsplit("/", 2)[0] for path in out}
        assert len(folders) == 1 and len(out) == 6  # every seed's checkpoint and curves
        assert {path.rsplit("/", 2)[1] for path in out} == {"seed0", "seed1", "seed2"}
    assert not [out for rule, out in jobs if "train" in rule and "ens" not in rule]  # clean is built already
    analysed = [out for rule, out in jobs if rule == "synthetic_analyse"]
    assert len(analysed) == 3 * len(ensembles)  # the analysis stays per seed
    # one ensemble job for real: every seed's files, each seed's own initialisation and curves
    run = WorkflowRun(tiny_workflow.workdir, tmp_path / "config.yaml")
    run.snakemake("--cores", "1", "results/synthetic/ens/count/nope/seed1/train.nc")
    curves = [
        xr.open_dataset(tiny_workflow.workdir / f"results/synthetic/ens/count/nope/seed{s}/train.nc") for s in range(3)
    ]
    assert [c.attrs["seed"] for c in curves] == [0, 1, 2] and {c.attrs["ensemble_members"] for c in curves} == {3}
    assert len({float(c["train_loss"][0]) for c in curves}) == 3
    log = (tiny_workflow.workdir / "logs/synthetic/train/ens/count/nope/ensemble.log").read_text()
    assert "train ens/count/nope/seed0,1,2: 100%" in log


def test_per_task_jobs_train_and_analyse_every_classifier_as_one_job_per_classifier_does(tiny_workflow, tmp_path):
    """The tiny run's clean has ``jobs: task`` (as config.yaml's): an experiment of one job per classifier trains
    and analyses the same classifiers, to the bit."""

    def edit(config):
        assert config["synthetic"]["experiments"]["clean"] == {"jobs": "task"}
        config["synthetic"]["experiments"]["solo"] = {"jobs": "classifier", "seeds": [1]}
        config["synthetic"]["run"] = ["clean", "solo"]

    jobs = dry_run_with(tiny_workflow, tmp_path, edit)
    assert not [rule for rule, _ in jobs if rule.endswith("_task_clean")]  # clean is built already
    trained = [out for rule, out in jobs if rule == "synthetic_train"]
    analysed = [out for rule, out in jobs if rule == "synthetic_analyse"]
    assert len(trained) == len(analysed) == 2 * len(tiny_workflow_pes(tiny_workflow))  # one job per classifier
    # the tiny run's own jobs: one per task, each with every PE and seed
    n_seeds = len(yaml.safe_load(tiny_workflow.configfile.read_text())["synthetic"]["seeds"])
    task_log = (tiny_workflow.workdir / "logs/synthetic/train/clean/count.log").read_text()
    for pe in tiny_workflow_pes(tiny_workflow):
        assert all(f"train clean/count/{pe}/seed{seed}: 100%" in task_log for seed in range(n_seeds))
    # for real on one task: the per-classifier jobs give clean's classifiers and analyses, to the bit
    run = WorkflowRun(tiny_workflow.workdir, tmp_path / "config.yaml")
    pes = tiny_workflow_pes(tiny_workflow)
    run.snakemake("--cores", "2", *[f"results/synthetic/solo/count/{pe}/seed1/probe.nc" for pe in pes])
    for pe in pes:
        for name in ("train.nc", "ablation.nc", "toeplitz.nc", "probe.nc"):
            one, many = (
                xr.open_dataset(tiny_workflow.workdir / f"results/synthetic/{e}/count/{pe}/seed1/{name}")
                for e in ("solo", "clean")
            )
            if name != "train.nc":  # the experiment is a coordinate of the analyses
                one, many = one.squeeze("experiment", drop=True), many.squeeze("experiment", drop=True)
            assert set(one.data_vars) == set(many.data_vars)
            for var in set(one.data_vars) - {"seconds"}:  # wall-clock seconds per epoch differ
                np.testing.assert_array_equal(one[var].values, many[var].values, err_msg=f"{pe} {name} {var}")
    log = (tiny_workflow.workdir / "logs/synthetic/train/solo/count/nope/seed1.log").read_text()
    assert "train solo/count/nope/seed1: 100%" in log


def tiny_workflow_pes(run) -> list[str]:
    import yaml

    return yaml.safe_load(run.configfile.read_text())["synthetic"]["pes"]


# What parsing and planning the workflow must not import: the workflow catalog lints it and draws its rule graph
# in an environment with snakemake alone.
HEAVY = ("torch", "transformers", "xarray", "h5py", "h5netcdf")


def test_the_embedded_test_config_plans_every_target_without_heavy_packages(tmp_path):
    """.test/config/config.yaml (the tiny embedded run): its rule graph and a dry run of `all`, `trajectory`,
    `deposit_study` and `band_study` with torch, transformers, xarray, h5py and h5netcdf unimportable; `all` makes every path of
    posgen.workflow.final_outputs."""
    from posgen.config import load
    from posgen.workflow.targets import final_outputs

    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name in HEAVY:
        (stubs / f"{name}.py").write_text(f"raise ImportError('{name}: not importable here (a test stub)')\n")
    env = {"PYTHONPATH": str(stubs)}
    blocked = subprocess.run([sys.executable, "-c", "import xarray"], env=env, capture_output=True, text=True)
    assert blocked.returncode != 0 and "not importable here" in blocked.stderr
    configfile = ROOT / ".test" / "config" / "config.yaml"
    (tmp_path / "work").mkdir()
    run = WorkflowRun(tmp_path / "work", configfile)
    graph = run.snakemake("--rulegraph", "dot", env=env).stdout
    assert {"extract", "gather", "perturb", "cap", "head_ablation", "reproduction"} <= set(
        re.findall(r'label = "(\w+)"', graph)
    )
    jobs = planned_jobs(run.snakemake("--dry-run", env=env))
    made = {path for _, outputs in jobs for path in outputs}
    assert set(final_outputs(load(configfile))) <= made
    trajectory = planned_jobs(run.snakemake("--dry-run", "trajectory", env=env))
    assert "train_trajectory" in {rule for rule, _ in trajectory}
    deposit = planned_jobs(run.snakemake("--dry-run", "deposit_study", env=env))
    assert ("fig_global", ["results/figures/deposit_study.png", "results/figures/deposit_study.pdf"]) in deposit
    # the band study: its table from every variant's band_interventions.nc, without the rest of reproduction.md
    bands = dict(planned_jobs(run.snakemake("--dry-run", "band_study", env=env)))
    assert bands["band_study_table"] == ["results/band_study.md"] and "reproduction" not in bands


def test_the_band_study_target_tables_the_band_section_alone(run_copy):
    """Target band_study on a finished run: one new job, its table the band section reproduction.md holds."""
    proc = run_copy.snakemake("--cores", "1", "band_study")
    assert "band_study_table" in proc.stdout + proc.stderr and "rule extract" not in proc.stdout + proc.stderr
    table = (run_copy.workdir / "results" / "band_study.md").read_text()
    section, provenance = table.split("\nconfig_hash ")
    assert section.startswith("## The low-frequency pattern, tested causally") and "| BAND_HIGH_LOSS |" in section
    assert section.strip() in (run_copy.workdir / "results" / "reproduction.md").read_text()
