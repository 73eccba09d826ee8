"""The `hf:` path against a real Hub server (issue 64): olah serving git repositories offline on 127.0.0.1
(posgen.testing.hub_mirror), HF_ENDPOINT naming it. Acquisition by commit, tag and branch; the tiny workflow, a
checkpoint series over branches and the `hf:` corpus through Snakemake; a second run that acquires nothing; the
token; each bad input and fault as one line with nothing left under resources/.

Skipped with the install hint where olah cannot be installed; `.ci/run` installs it (make setup-hub) and sets
POSGEN_HUB_REQUIRED, which turns that skip into a failure."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import xarray as xr

from posgen.models import verify_checkpoint
from posgen.testing.hub_mirror import DATASET_REPO, MODEL_REPO, HubMirror, OlahMissing, build_repos, free_port, olah_cli
from posgen.testing.runs import make_run, tiny_config

# rule all, and the series acquired over its branches (its analysis per step: test_trajectory.py, on a Hub cache)
TARGETS = ("all", "resources/models/series/manifest.json")
TOKEN = "hf_posgenTestToken0123456789"
HAVE_DATASETS = (
    importlib.util.find_spec("datasets") is not None
)  # a fake token: where it reaches, and what it must never be written to


@pytest.fixture(scope="module")
def hub(tmp_path_factory, tiny_source):
    """The test Hub (posgen.testing.hub_mirror.build_repos) served for this module; ``hub.commits``: revision ->
    commit of the model repository."""
    try:
        cli = olah_cli()
    except OlahMissing as err:
        if os.environ.get("POSGEN_HUB_REQUIRED"):
            pytest.fail(str(err))
        pytest.skip(str(err))
    folder = tmp_path_factory.mktemp("hub")
    commits = build_repos(folder / "mirrors", tiny_source("llama"))
    with HubMirror(cli, folder / "mirrors", folder / "server") as mirror:
        mirror.commits = commits
        yield mirror


def _acquire(hub, source, dest: Path, *flags, home: Path, **env) -> subprocess.CompletedProcess:
    """``python -m posgen.testing.hub_mirror acquire`` (a process of its own: the Hub client reads HF_ENDPOINT at
    import) with ``home`` as HF_HOME."""
    command = [sys.executable, "-m", "posgen.testing.hub_mirror", "acquire", source, str(dest), *flags]
    return subprocess.run(command, env=hub.env(home, **env), capture_output=True, text=True, timeout=120)


def _acquired(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _refused(proc, dest: Path) -> str:
    """The one line an acquisition stopped with (the last of its output: the Hub client's warnings come first);
    nothing of it is left beside ``dest``."""
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ModelSourceError: "), proc.stderr[-3000:]
    assert not dest.parent.exists() or not list(dest.parent.iterdir()), sorted(dest.parent.iterdir())
    return last.removeprefix("ModelSourceError: ")


def _repo_hashes(hub, commit: str) -> dict[str, str]:
    """sha256 of every file of the model repository at ``commit``, from git (a Git LFS pointer names it)."""
    repo = hub.mirrors / "models" / MODEL_REPO
    git = ["git", "-C", str(repo)]
    names = subprocess.run([*git, "ls-tree", "--name-only", commit], capture_output=True, text=True).stdout.split()
    hashes = {}
    for name in names:
        data = subprocess.run([*git, "show", f"{commit}:{name}"], capture_output=True, check=True).stdout
        pointer = data.startswith(b"version https://git-lfs")
        hashes[name] = data.split(b"oid sha256:")[1][:64].decode() if pointer else hashlib.sha256(data).hexdigest()
    return hashes


def test_acquires_by_commit_tag_and_branch_and_records_the_resolved_commit(hub, tmp_path):
    home = tmp_path / "hf-home"
    step0, step10 = hub.commits["step0"], hub.commits["step10"]
    for revision, commit in ((step0, step0), ("v1", step10), ("step10", step10), ("main", hub.commits["main"])):
        source = f"hf:{MODEL_REPO}@{revision}"
        manifest = _acquired(_acquire(hub, source, tmp_path / "models" / revision, home=home))
        assert manifest["source"] == source and manifest["revision"] == commit and manifest["hub_checked"] is True
        assert manifest["architecture"] == "LlamaForCausalLM"
        want = {name: digest for name, digest in _repo_hashes(hub, commit).items() if name != "README.md"}
        assert manifest["files"] == want  # the files of that commit, every hash as git and Git LFS record it
        on_disk = json.loads((tmp_path / "models" / revision / "manifest.json").read_text())
        assert on_disk == manifest
    weights = {p.parent.name: p.read_bytes() for p in (tmp_path / "models").glob("*/model.safetensors")}
    assert weights["v1"] == weights["step10"] == weights["main"] != weights[step0]


@pytest.mark.parametrize(
    "source, line",
    [
        (
            f"hf:{MODEL_REPO}@step99",
            f"hf:{MODEL_REPO}@step99: no revision 'step99' in {MODEL_REPO} at {{endpoint}} (not a branch, tag or "
            "commit of it; branches: main, step0, step10; tags: v1)",
        ),
        (
            "hf:acme/no-such-model",
            "hf:acme/no-such-model: repository acme/no-such-model not found at {endpoint}, or gated (set HF_TOKEN "
            "for gated models)",
        ),
        (
            "hf:acme/tiny-pickle",
            "hf:acme/tiny-pickle: the repository holds only pickle weights (pytorch_model.bin); set allow_pickle: "
            "true for this model to accept them",
        ),
        (
            "hf:acme/tiny-custom",
            "hf:acme/tiny-custom: config.json asks for custom code (auto_map); set trust_remote_code: true to allow it",
        ),
    ],
    ids=["revision", "repository", "pickle", "custom-code"],
)
def test_bad_source_is_one_line_and_leaves_nothing(hub, tmp_path, source, line):
    dest = tmp_path / "resources" / "models" / "m"
    proc = _acquire(hub, source, dest, home=tmp_path / "hf-home")
    assert _refused(proc, dest) == line.format(endpoint=hub.endpoint)


def test_what_the_refusals_ask_for_acquires(hub, tmp_path):
    home = tmp_path / "hf-home"
    pickled = _acquired(_acquire(hub, "hf:acme/tiny-pickle", tmp_path / "p", "--allow-pickle", home=home))
    assert "pytorch_model.bin" in pickled["files"] and pickled["hub_checked"] is True
    custom = _acquired(_acquire(hub, "hf:acme/tiny-custom", tmp_path / "c", "--trust-remote-code", home=home))
    assert "custom_llama.py" in custom["files"] and custom["trust_remote_code"] is True


def test_unreachable_hub_is_one_line_naming_the_endpoint(hub, tmp_path):
    dest = tmp_path / "resources" / "models" / "m"
    nobody = f"http://127.0.0.1:{free_port()}"
    proc = _acquire(hub, f"hf:{MODEL_REPO}@main", dest, home=tmp_path / "hf-home", HF_ENDPOINT=nobody)
    assert _refused(proc, dest) == (
        f"hf:{MODEL_REPO}@main: cannot reach the Hub at {nobody} (HF_ENDPOINT) and no cached copy exists "
        "(HF_HUB_OFFLINE=0; LocalEntryNotFoundError); check HF_ENDPOINT, or acquire it first where the Hub can be "
        "reached: snakemake get_model"
    )


def test_server_stopped_mid_download_then_a_rerun_completes_with_every_hash_checked(hub, tmp_path):
    home, dest = tmp_path / "hf-home", tmp_path / "resources" / "models" / "m"
    source = f"hf:{MODEL_REPO}@step0"
    hub.stop_during("model.safetensors", after=100_000)
    try:
        proc = _acquire(hub, source, dest, home=home)
    finally:
        hub.start()  # the server comes back at the same address
    assert _refused(proc, dest) == (
        f"{source}: the download from {hub.endpoint} broke off (ConnectError: [Errno 111] Connection refused); run "
        "it again: the Hub cache resumes it and every file's hash is checked"
    )
    manifest = _acquired(_acquire(hub, source, dest, home=home))
    assert manifest["hub_checked"] is True and manifest["files"] == _repo_hashes(hub, hub.commits["step0"])
    assert verify_checkpoint(dest) == manifest  # and the files on disk are those


def test_a_file_damaged_in_the_hub_cache_is_named_and_refetched_once_deleted(hub, tmp_path):
    home, dest = tmp_path / "hf-home", tmp_path / "resources" / "models" / "again"
    source = f"hf:{MODEL_REPO}@step10"
    _acquired(_acquire(hub, source, tmp_path / "first", home=home))
    cached = home / "hub" / f"models--{MODEL_REPO.replace('/', '--')}"
    blob = (cached / "snapshots" / hub.commits["step10"] / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF  # one byte of a tensor: the file still reads, only its hash tells
    blob.write_bytes(bytes(data))
    line = _refused(_acquire(hub, source, dest, home=home), dest)
    assert line.startswith(f"{source}: model.safetensors from {hub.endpoint} has sha256 ")
    assert line.endswith(f"(damaged in the Hub cache): delete {cached} and run again")
    shutil.rmtree(cached)  # what the line says
    assert _acquired(_acquire(hub, source, dest, home=home))["hub_checked"] is True


# ------------------------------------------------------------------------------------- through Snakemake


@pytest.fixture(scope="module")
def hub_run(hub, tmp_path_factory, tiny_source):
    """The tiny workflow (rule all) on an `hf:` model named by branch with the `hf:` corpus from the dataset
    repository, and a checkpoint series (trajectory.models) acquired over the branches step0 and step10; HF_TOKEN
    set."""
    folder = tmp_path_factory.mktemp("hub-run")
    config = tiny_config(tiny_source("llama"), name="tiny-hub")
    config["models"][0]["source"] = f"hf:{MODEL_REPO}@step10"
    if HAVE_DATASETS:
        config["corpus"] = {"source": f"hf:{DATASET_REPO}:train:text"}
    config["n_samples"], config["seq_len"], config["shards"] = 2, 32, 1
    config["perturb"].update(n_samples=2, seq_len=16, rates=[0, 0.05, 0.2], caps=[4, 8])
    config["band_interventions"] = {**config.get("band_interventions", {}), "n_samples": 1, "seq_len": 16}
    # the trained weights and one task only: the controls and the second paper are the tiny run's (test_workflow)
    config["random_init_seeds"] = []
    config["synthetic"].update(tasks=["distance"], pes=["nope", "rope"], seeds=[0])
    config["trajectory"] = {
        "models": [{"name": "series", "source": f"hf:{MODEL_REPO}", "revisions": ["step0", "step10"]}]
    }
    run = make_run(folder / "run", config)
    env = hub.env(folder / "hf-home", HF_TOKEN=TOKEN)
    hub.seen.clear()
    run.snakemake("--cores", "2", *TARGETS, env=env)
    seen = list(hub.seen)
    return run, env, seen


def test_hf_model_runs_the_default_workflow_and_a_series_is_acquired_over_branches(hub, hub_run):
    run, _, _ = hub_run
    results = run.workdir / "results"
    assert (results / "summary.csv").stat().st_size > 0 and (results / "atlas.html").is_file()
    manifest = json.loads((run.workdir / "resources/models/tiny-hub/manifest.json").read_text())
    assert manifest["source"] == f"hf:{MODEL_REPO}@step10" and manifest["revision"] == hub.commits["step10"]
    assert manifest["hub_checked"] is True
    with xr.open_dataset(results / "tiny-hub/trained/decomposition.nc", engine="h5netcdf") as decomposition:
        assert decomposition.attrs["model_revision"] == hub.commits["step10"]
    # the series: one folder per branch, each with the commit it resolved to
    series = run.workdir / "resources/models/series"
    listed = json.loads((series / "manifest.json").read_text())
    assert listed["commits"] == {"step0": hub.commits["step0"], "step10": hub.commits["step10"]}
    for step in ("step0", "step10"):
        one = json.loads((series / step / "manifest.json").read_text())
        assert one["revision_name"] == step and one["revision"] == hub.commits[step] and one["hub_checked"] is True
    weights = {step: (series / step / "model.safetensors").read_bytes() for step in ("step0", "step10")}
    assert weights["step0"] != weights["step10"]  # two branches, two sets of weights


@pytest.mark.skipif(not HAVE_DATASETS, reason="the hf: corpus needs the datasets package (requirements.txt)")
def test_hf_corpus_comes_from_the_dataset_repository(hub_run):
    from posgen.corpus import load_text

    run, _, seen = hub_run
    assert any(s.path.startswith(f"/datasets/{DATASET_REPO}/resolve/") for s in seen)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run.workdir / "resources/models/tiny-hub")
    with xr.open_dataset(run.workdir / "results/tiny-hub/windows.h5", engine="h5netcdf") as windows:
        first = tokenizer.decode(windows["token_id"].values[0][1:])
    assert first.strip()[:40] in load_text("embedded")  # the dataset holds the embedded corpus's documents


def test_token_is_sent_to_the_hub_and_written_nowhere(hub_run):
    run, _, seen = hub_run
    sent = {s.headers.get("authorization") for s in seen}
    assert sent == {f"Bearer {TOKEN}"}  # every request: model files, the series, the dataset
    for where in ("results", "resources", "logs", ".snakemake"):
        for path in (run.workdir / where).rglob("*"):
            if path.is_file():
                assert TOKEN.encode() not in path.read_bytes(), path


def test_second_run_acquires_nothing(hub, hub_run):
    run, env, _ = hub_run
    hub.seen.clear()
    proc = run.snakemake("--cores", "2", *TARGETS, env=env)
    assert "Nothing to be done" in proc.stdout + proc.stderr
    assert hub.seen == []


def test_missing_revision_through_get_model_is_the_jobs_last_line(hub, hub_run, tmp_path):
    run, env, _ = hub_run
    config = _config_of(run)
    config["models"] = [{"name": "typo", "source": f"hf:{MODEL_REPO}@step11"}]
    config.pop("trajectory")
    bad = make_run(tmp_path / "run", config)
    proc = bad.snakemake("--cores", "1", "resources/models/typo/manifest.json", check=False, env=env)
    assert proc.returncode != 0
    last = (bad.workdir / "logs/get_model/typo.log").read_text().strip().splitlines()[-1]
    assert last == (
        f"ModelSourceError: hf:{MODEL_REPO}@step11: no revision 'step11' in {MODEL_REPO} at {hub.endpoint} (not a "
        "branch, tag or commit of it; branches: main, step0, step10; tags: v1)"
    )
    resources = bad.workdir / "resources"
    assert not (resources / "models/typo").exists() and not [p for p in resources.rglob("*") if p.is_file()]


def _config_of(run) -> dict:
    import yaml

    return yaml.safe_load(run.configfile.read_text())
