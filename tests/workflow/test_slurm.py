"""SLURM dispatch, proven against a real one-node SLURM cluster started on this host (tests/workflow/slurm_cluster.py).

One workflow run covers the acceptance of issue 5: the tiny end-to-end workflow's GPU jobs (extraction in
shards, perturbation) and what reads them up to ``results/summary.csv`` run with ``--profile profiles/slurm``
(snakemake-executor-plugin-slurm), a recording ``sbatch`` first in PATH logs every submission, and
``POSGEN_FAIL_ONCE`` makes the first ``extract`` job fail once. The tests then check that every non-local job went
through sbatch and ran as a SLURM job, that the extraction asks for a GPU, CPUs and memory, that the failed job
was retried, that the outputs equal the local run's (``tiny_workflow``), and that the cluster stops cleanly. The
figures and the second family are left out: they are local rules or run as the local run's do, and would only
double the suite's busiest minutes. Without sbatch/slurmd/munged or root, the cluster tests skip with the reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
from slurm_cluster import PARTITION, SlurmCluster, missing_requirements

from posgen.testing.faults import ENV as FAIL_ONCE_ENV
from posgen.testing.faults import InjectedFailure, fail_once
from posgen.testing.runs import ROOT, SNAKEMAKE, make_run
from posgen.workflow.steps import GPU_RULES

PROFILE = ROOT / "profiles" / "slurm"
FAIL_RULE = "extract"
# GPU rules whose memory, runtime and GPU count follow the model (rules/resources.smk): the profile pins only CPUs
MODEL_RULES = set(GPU_RULES)  # their memory and time follow the model (posgen.plan)
# rules that must run on the submitting host: downloads (compute nodes are often offline), the corpus, and
# the figures (fig_*) and report tables
LOCAL_RULES = {"get_model", "windows", "reproduction"}
# provenance that legitimately differs between two runs of the same job
# timings, and the digest of every attr (which covers the timings; the others are compared one by one)
VOLATILE_ATTRS = {"created", "runtime_s", "train_seconds", "samples_per_second", "posgen_attrs_digest"}
# what the cluster run makes: every extraction shard of both variants, a perturbation job in shards, the
# local rules before them and the summary after them
TARGETS = ["results/summary.csv", "results/{model}/trained/perturb.nc"]
WORKFLOW_TIMEOUT_S = 1200  # a guard against a hung cluster, not a timing test

NO_SLURM = missing_requirements()
needs_slurm = pytest.mark.skipif(NO_SLURM is not None, reason=f"no test SLURM cluster: {NO_SLURM}")


def cluster_targets(config: dict) -> list[str]:
    """:data:`TARGETS` for the run's model."""
    return [target.format(model=config["models"][0]["name"]) for target in TARGETS]


def must_be_local(rule: str) -> bool:
    return rule in LOCAL_RULES or rule.startswith("fig_")


def profile_settings(env: dict[str, str] | None = None) -> dict:
    """profiles/slurm as snakemake parses it (YTE evaluated) under ``env``."""
    from snakemake.profiles import ProfileConfigFileParser

    saved = dict(os.environ)
    try:
        for key in ("POSGEN_SLURM_PARTITION", "POSGEN_SLURM_ACCOUNT"):
            os.environ.pop(key, None)
        os.environ.update(env or {})
        with open(PROFILE / "config.yaml") as f:
            return dict(ProfileConfigFileParser().parse(f))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def gpu_asks() -> dict[str, dict]:
    """set-resources of profiles/slurm as {rule: {resource: value}}."""
    asks: dict[str, dict] = {}
    for item in profile_settings()["set-resources"]:
        rule_res, value = item.split("=", 1)
        rule, res = rule_res.split(":", 1)
        asks.setdefault(rule, {})[res] = yaml.safe_load(value)
    return asks


# -- without a cluster ---------------------------------------------------------------------------------------


def test_fail_once_is_inert_without_env(tmp_path, monkeypatch):
    monkeypatch.delenv(FAIL_ONCE_ENV, raising=False)
    fail_once(FAIL_RULE)  # must not raise
    monkeypatch.setenv(FAIL_ONCE_ENV, f"other_rule:{tmp_path / 'marker'}")
    fail_once(FAIL_RULE)
    assert not (tmp_path / "marker").exists()


def test_fail_once_fails_exactly_once(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv(FAIL_ONCE_ENV, f"{FAIL_RULE}:{marker}")
    with pytest.raises(InjectedFailure, match=FAIL_RULE):
        fail_once(FAIL_RULE)
    assert marker.read_text().startswith(f"{FAIL_RULE} ")
    fail_once(FAIL_RULE)  # the retry finds the marker and runs
    monkeypatch.setenv(FAIL_ONCE_ENV, "no-marker-given")
    with pytest.raises(ValueError, match=FAIL_ONCE_ENV):
        fail_once(FAIL_RULE)


def test_profile_partition_and_account_come_from_env():
    bare = profile_settings()
    assert bare["executor"] == "slurm"
    assert not any(r.startswith(("slurm_partition=", "slurm_account=")) for r in bare["default-resources"])
    # a partition named like a Python builtin must stay a string when snakemake evaluates the resource
    set_ = profile_settings({"POSGEN_SLURM_PARTITION": "sum", "POSGEN_SLURM_ACCOUNT": "proj-42"})
    assert "slurm_partition='sum'" in set_["default-resources"]
    assert "slurm_account='proj-42'" in set_["default-resources"]
    assert int(set_["retries"]) >= 1
    assert "HDF5_USE_FILE_LOCKING=FALSE" in set_["precommand"]


_RULES_PY = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import (ConfigSettings, OutputSettings, ResourceSettings, StorageSettings,
                                      WorkflowSettings)
with SnakemakeApi(OutputSettings()) as api:
    wf = api.workflow(resource_settings=ResourceSettings(), config_settings=ConfigSettings(),
                      storage_settings=StorageSettings(), workflow_settings=WorkflowSettings(),
                      snakefile=Path(sys.argv[1]), workdir=Path(sys.argv[2]))._workflow
    print(json.dumps({"rules": sorted(r.name for r in wf.rules), "local": sorted(wf._localrules)}))
"""


def test_profile_names_real_gpu_rules_and_keeps_acquisition_local(tmp_path):
    """set-resources silently ignores unknown rule names, so check them against the workflow itself (on the store
    path, which has every rule: the fused path has no decompose and bands jobs)."""
    default = (ROOT / "config.yaml").read_text()
    assert "  analysis: fused\n" in default
    (tmp_path / "config.yaml").write_text(default.replace("  analysis: fused\n", "  analysis: store\n"))
    proc = subprocess.run(
        [sys.executable, "-c", _RULES_PY, str(ROOT / "Snakefile"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    wf = json.loads(proc.stdout.strip().splitlines()[-1])
    rules, local = set(wf["rules"]), set(wf["local"])
    asks = gpu_asks()
    assert "extract" in asks
    assert set(asks) <= rules, f"profiles/slurm set-resources names unknown rules {set(asks) - rules}"
    for rule, res in asks.items():
        if rule in MODEL_RULES:  # a constant here would override the rule's model-following asks
            assert set(res) == {"cpus_per_gpu"} and res["cpus_per_gpu"] >= 1, rule
            continue
        assert res["gpu"] == 1 and res["cpus_per_gpu"] >= 1 and res["mem_mb"] > 0 and res["runtime"] > 0, rule
    required = {r for r in rules if must_be_local(r)}
    assert {"get_model", "windows"} <= required
    assert required <= local, f"{required - local} must be localrules"
    assert not set(asks) & local, f"GPU rules {set(asks) & local} are localrules"


def test_paper_config_plans_gpu_jobs_under_slurm_profile(tmp_path):
    from posgen.config import load, model_entry, variants
    from posgen.plan import rule_resources
    from posgen.workflow.sharding import shard_ranges

    paper = load(ROOT / "config.paper.yaml")
    repos = {m["source"].split("@")[0] for m in paper["models"]}
    assert repos == {
        "hf:meta-llama/Llama-3.1-8B",
        "hf:mistralai/Mistral-7B-v0.1",
        "hf:Qwen/Qwen2.5-7B",
        "hf:google/gemma-2-9b",
    }
    assert all(re.fullmatch(r"[0-9a-f]{40}", m["source"].split("@")[1]) for m in paper["models"]), "pin commits"
    assert (paper["n_samples"], paper["seq_len"], paper["dtype"]) == (32, 4096, "bfloat16")
    assert len(paper["random_init_seeds"]) == 3
    # the Snakefile's own configfile must exist in the working directory; --configfile then overrides it
    (tmp_path / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    dry = subprocess.run(
        [
            SNAKEMAKE,
            "-s",
            str(ROOT / "Snakefile"),
            "-d",
            str(tmp_path),
            "-n",
            "--profile",
            str(PROFILE),
            "--configfile",
            str(ROOT / "config.paper.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    blocks = re.findall(r"^rule extract:\n((?:\s{4}.*\n)+)", dry.stdout, re.M)
    n_shards = len(shard_ranges(paper["n_samples"], paper.get("shards", 1)))
    assert len(blocks) == len(paper["models"]) * len(variants(paper)) * n_shards == 16 * n_shards
    asks = gpu_asks()["extract"]
    for block in blocks:
        res = dict(kv.split("=", 1) for kv in re.search(r"resources: (.*)", block)[1].split(", "))
        wildcards = dict(kv.split("=", 1) for kv in re.search(r"wildcards: (.*)", block)[1].split(", "))
        # before get_model has run, the recorded shape of each paper model (posgen.shapes) sizes the job
        want = rule_resources(
            "extract",
            tmp_path / "resources" / "models" / wildcards["model"],
            model_entry(paper, wildcards["model"]),
            wildcards["variant"],
            wildcards.get("shard"),
            paper,
        )
        assert want["gpu"] == 1 and 16_000 < want["gpu_mem_mb"] < 80_000, want  # an 8-9B model on one GPU
        assert res["cpus_per_gpu"] == str(asks["cpus_per_gpu"]), block
        for key in ("gpu", "mem_mb", "runtime", "gpu_mem_mb", "disk_mb"):
            assert res[key] == str(want[key]), (key, block)


# -- against the cluster -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if NO_SLURM:
        pytest.skip(f"no test SLURM cluster: {NO_SLURM}")
    c = SlurmCluster(tmp_path_factory.mktemp("slurm") / "cluster")
    c.start()
    yield c
    c.stop()
    assert not any(c.alive().values()), f"daemons left running: {c.alive()}"


class SlurmRun:
    """The tiny workflow run through the cluster, with everything the tests inspect."""

    def __init__(self, run, proc, seconds, records, marker):
        self.run, self.proc, self.seconds, self.records, self.marker = run, proc, seconds, records, marker
        logs = sorted((run.workdir / ".snakemake" / "log").glob("*.snakemake.log"))
        log = logs[-1].read_text() if logs else proc.stdout + proc.stderr
        # drop the failed jobs' logs that --show-failed-logs quotes: they hold the job step's own "rule X:" lines
        self.log = re.sub(r"^Logfile .*:\n={80}\n.*?^={80}\n", "", log, flags=re.M | re.S)
        # (local?, rule, snakemake jobid) of every job start; a retried job starts twice
        self.starts = [
            (bool(m[1]), m[2], int(m[3]))
            for m in re.finditer(r"^(local)?rule (\S+):\n(?:\s{4}.*\n)*?\s{4}jobid: (\d+)$", self.log, re.M)
        ]
        self.submitted: dict[int, list[str]] = {}
        for m in re.finditer(r"Job (\d+) has been submitted with SLURM jobid (\d+)", self.log):
            self.submitted.setdefault(int(m[1]), []).append(m[2])

    def context(self) -> str:
        return f"snakemake rc={self.proc.returncode} after {self.seconds:.0f} s\n{self.log[-6000:]}"

    def sbatch_of_rule(self, rule: str) -> list[dict]:
        pattern = rf"rule_{rule}(_wildcards_.*)?"
        return [r for r in self.records if re.fullmatch(pattern, _opt(r["argv"], "--comment") or "")]


def _opt(argv: list[str], name: str) -> str | None:
    """Value of ``name`` in an sbatch argv, as ``--name value`` or ``--name=value``."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _job_info(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], env=cluster.env(), capture_output=True, text=True, timeout=30
    ).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


@pytest.fixture(scope="module")
def slurm_run(cluster, tiny_run_config, tmp_path_factory):
    # the local run's config; that run itself is only needed by the comparison (on another worker under xdist)
    run = make_run(tmp_path_factory.mktemp("tiny-slurm"), tiny_run_config)
    record = run.workdir / "sbatch-record.jsonl"
    bin_dir = cluster.client_shims(run.workdir / "bin", record)
    marker = run.workdir / "fail-once.marker"
    env = cluster.env()
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        POSGEN_SLURM_PARTITION=PARTITION,
        **{FAIL_ONCE_ENV: f"{FAIL_RULE}:{marker}"},
    )
    cmd = [
        SNAKEMAKE,
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(run.workdir),
        "--configfile",
        str(run.configfile),
        "--profile",
        str(PROFILE),
        # no accounting database on the test cluster: poll squeue (finished jobs stay for MinJobAge)
        "--slurm-status-command",
        "squeue",
        # poll every few seconds rather than the cluster-friendly 40 s
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--seconds-between-status-checks",
        "2",
        "--latency-wait",
        "5",
        "--slurm-keep-successful-logs",
        *cluster_targets(tiny_run_config),
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=run.workdir, env=env, capture_output=True, text=True, timeout=WORKFLOW_TIMEOUT_S)
    seconds = time.monotonic() - t0
    records = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return SlurmRun(run, proc, seconds, records, marker)


@needs_slurm
def test_workflow_completes_through_slurm(slurm_run):
    assert slurm_run.proc.returncode == 0, slurm_run.context()
    print(f"SLURM workflow run: {slurm_run.seconds:.0f} s, {len(slurm_run.records)} sbatch calls")


@needs_slurm
def test_every_cluster_job_went_through_sbatch(slurm_run, cluster):
    r = slurm_run
    assert r.proc.returncode == 0, r.context()
    remote = [(rule, jid) for local, rule, jid in r.starts if not local]
    local_rules = {rule for local, rule, _ in r.starts if local}
    assert remote, r.context()
    assert {"get_model", "windows"} <= local_rules, f"saw local runs of {local_rules} only"
    assert not any(must_be_local(rule) for rule, _ in remote), remote
    # each start of a non-local job was one sbatch submission with its own SLURM job id ...
    for rule, jid in set(remote):
        assert len(r.submitted.get(jid, [])) == remote.count((rule, jid)), f"{rule} job {jid}: {r.submitted}"
    logged_ids = sorted(i for ids in r.submitted.values() for i in ids)
    recorded_ids = sorted(rec["stdout"].strip().split(";")[0] for rec in r.records)
    # ... recorded by the sbatch wrapper, and nothing else was submitted (local rules never reach sbatch)
    assert all(rec["rc"] == 0 for rec in r.records), r.records
    assert logged_ids == recorded_ids
    assert {_opt(rec["argv"], "--comment").split("_wildcards_")[0][5:] for rec in r.records} == {
        rule for rule, _ in remote
    }
    # ... and SLURM ran it on the node: it knows the job, and the job's SLURM log is the jobstep's output
    for jid, ids in r.submitted.items():
        for slurm_id in ids:
            info = _job_info(cluster, slurm_id)
            assert info.get("JobState") in {"COMPLETED", "FAILED"}, (slurm_id, info)
            assert info.get("NodeList") == "posgen-node"
            logfile = next(
                Path(rec["argv"][rec["argv"].index("--output") + 1].replace("%j", slurm_id))
                for rec in r.records
                if rec["stdout"].strip() == slurm_id
            )
            assert logfile.exists() and "snakemake" in logfile.read_text().lower(), logfile


@needs_slurm
def test_extract_submission_asks_for_gpu_cpus_memory(slurm_run, cluster):
    from posgen.config import load, model_entry
    from posgen.plan import rule_resources

    r = slurm_run
    cfg = load(r.run.configfile)
    model = cfg["models"][0]["name"]
    # the tiny model's asks (its shards all sit at the floors of posgen.plan), first try and retry
    want = {
        attempt: rule_resources(
            "extract",
            r.run.workdir / "resources" / "models" / model,
            model_entry(cfg, model),
            "trained",
            None,
            cfg,
            attempt,
        )
        for attempt in (1, 2)
    }
    assert want[2]["mem_mb"] > want[1]["mem_mb"] and want[2]["runtime"] > want[1]["runtime"], want
    asks = {**gpu_asks()[FAIL_RULE], "gpu": want[1]["gpu"]}
    subs = r.sbatch_of_rule("extract")
    starts = [j for local, rule, j in r.starts if rule == "extract" and not local]
    # one per model, variant and shard, plus one per retry
    assert len(set(starts)) >= 4 and len(subs) == len(starts), [s["argv"][:12] for s in subs]
    # each shard of each variant was its own SLURM job (the comment names the job's wildcards)
    comments = {_opt(sub["argv"], "--comment") for sub in subs}
    for variant in ("trained", "random-seed0"):
        for shard in ("0-2", "2-3"):
            assert any(f"_{variant}_" in c and f"_{shard}" in c for c in comments), comments
    attempts = []
    for sub in subs:
        argv = sub["argv"]
        assert _opt(argv, "--gpus") == str(asks["gpu"]) or _opt(argv, "--gres") == f"gpu:{asks['gpu']}", argv
        assert _opt(argv, "--cpus-per-gpu") == str(asks["cpus_per_gpu"]), argv
        asked = (_opt(argv, "--mem"), _opt(argv, "-t"))
        attempt = next((a for a, w in want.items() if asked == (str(w["mem_mb"]), str(w["runtime"]))), None)
        assert attempt is not None, (asked, want)
        attempts.append(attempt)
        assert _opt(argv, "-p") == PARTITION, argv
        assert _opt(argv, "--wrap").startswith("export HDF5_USE_FILE_LOCKING=FALSE &&"), argv
        # SLURM took the asks as GPU asks and ran the job with them (the CPUs come per GPU)
        info = _job_info(cluster, sub["stdout"].strip())
        assert info["TresPerJob"] == f"gres:gpu:{asks['gpu']}", info
        assert info["CpusPerTres"] == f"gres:gpu:{asks['cpus_per_gpu']}", info
        assert int(info["NumCPUs"]) == asks["gpu"] * asks["cpus_per_gpu"], info
        mem = int(asked[0])
        assert info["MinMemoryNode"] in {f"{mem}M", f"{mem / 1024:.2f}G"}, info
    # the injected failure's resubmission asked for more (posgen.plan.RETRY_GROWTH); the rest for the estimate
    assert sorted(attempts) == [1] * (len(subs) - 1) + [2], attempts


@needs_slurm
def test_injected_failure_is_retried(slurm_run, cluster):
    r = slurm_run
    assert r.marker.exists(), (
        "POSGEN_FAIL_ONCE did not fire: workflow scripts must call posgen.testing.faults.fail_once"
    )
    rule, host, _pid, failed_id = r.marker.read_text().split()
    assert rule == FAIL_RULE and failed_id != "-", "the injected failure happened outside SLURM"
    assert _job_info(cluster, failed_id)["JobState"] == "FAILED"
    retried = [ids for ids in r.submitted.values() if failed_id in ids]
    assert len(retried) == 1 and len(retried[0]) == 2 and retried[0][0] == failed_id, r.submitted
    assert _job_info(cluster, retried[0][1])["JobState"] == "COMPLETED"
    assert "Trying to restart job" in r.log
    assert r.proc.returncode == 0, r.context()


def _compare_netcdf(a: Path, b: Path) -> None:
    with xr.open_dataset(a, engine="h5netcdf") as da, xr.open_dataset(b, engine="h5netcdf") as db:
        xr.testing.assert_allclose(da.load(), db.load(), rtol=1e-5, atol=1e-5)
        keys = (set(da.attrs) | set(db.attrs)) - VOLATILE_ATTRS
        assert {k: str(da.attrs.get(k)) for k in keys} == {k: str(db.attrs.get(k)) for k in keys}, a


@needs_slurm
def test_outputs_equal_local_run(slurm_run, tiny_workflow, tiny_workflow_files, tiny_run_config):
    assert slurm_run.proc.returncode == 0, slurm_run.context()
    local_root, slurm_root = tiny_workflow.workdir / "results", slurm_run.run.workdir / "results"
    # the local run's files as its run left them (other tests add experiments to its folder)
    local = sorted(Path(p).relative_to("results") for p in tiny_workflow_files)
    remote = sorted(p.relative_to(slurm_root) for p in slurm_root.rglob("*") if p.is_file())
    assert remote and set(remote) <= set(local), sorted(set(remote) - set(local))
    assert {Path(t).relative_to("results") for t in cluster_targets(tiny_run_config)} <= set(remote)
    compared = 0
    for rel in remote:
        # trained classifiers and loss differences of ablated LLM heads depend on the job's thread count (float
        # reduction order) beyond 1e-5: for them, the same files exist on both sides (checked above)
        if rel.parts[0] == "synthetic" or rel.name in {"head_ablation.nc", "reproduction_synthetic.csv"}:
            continue
        if rel.suffix in {".nc", ".h5"}:
            _compare_netcdf(local_root / rel, slurm_root / rel)
            compared += 1
        elif rel.suffix == ".csv":
            a, b = pd.read_csv(local_root / rel), pd.read_csv(slurm_root / rel)
            assert list(a.columns) == list(b.columns) and len(a) == len(b), rel
            num = a.select_dtypes("number").columns
            np.testing.assert_allclose(a[num].to_numpy(float), b[num].to_numpy(float), rtol=1e-5, atol=1e-5)
            pd.testing.assert_frame_equal(a.drop(columns=num), b.drop(columns=num))
            compared += 1
    assert compared >= 3, remote


@needs_slurm
def test_cluster_stops_cleanly_by_pid(cluster, slurm_run):
    """Last in this module: stop the cluster and prove nothing of it is left."""
    pids = dict(cluster.pids)
    assert all(cluster.alive().values())
    t0 = time.monotonic()
    cluster.stop()
    assert time.monotonic() - t0 < 30
    assert not any(cluster.alive().values()), cluster.alive()
    assert {name: cluster.procs[name].returncode for name in pids} == {name: 0 for name in pids}
    assert cluster.leftover_steps == []
    ping = subprocess.run(["scontrol", "ping"], env=cluster.env(), capture_output=True, text=True, timeout=60)
    assert "DOWN" in ping.stdout or ping.returncode != 0, ping.stdout
