"""Shared fixtures of the unit and workflow tests: tiny random checkpoints and one tiny end-to-end workflow run
per test session (the helpers they use live in posgen.testing).

``make test`` runs the suite on two pytest-xdist workers (``-n 2``, scheduled by
:func:`pytest_xdist_make_scheduler`). Each module runs whole on one worker (its module fixtures are built once),
the modules that read the tiny run share one worker (some run snakemake in its folder), and the tiny checkpoints
and the tiny run are built once for both workers, under a lock, in the session's common temporary folder. Without
xdist the same fixtures build in the session's own folder."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from posgen.testing.runs import WorkflowRun, make_run, tiny_config  # noqa: E402
from posgen.testing.tiny import make_tiny  # noqa: E402

RUN_FILES = "run-files.json"  # the tiny run's result files as its own job left them
SLURM = "tests/workflow/test_slurm.py"
HUB = "tests/workflow/test_hub_mirror.py"  # a Hub server and a workflow run of its own
# the modules whose tests read the tiny run (one worker runs them in turn: some run snakemake in its folder)
TINY_RUN_MODULES = (
    "tests/workflow/test_atlas_page.py",
    "tests/workflow/test_damaged_inputs.py",
    "tests/workflow/test_lineage.py",
    "tests/workflow/test_read_side.py",
    "tests/workflow/test_report.py",
    "tests/workflow/test_synthetic_workflow.py",
    "tests/workflow/test_workflow.py",
)


def _scope(nodeid: str) -> str:
    """The unit a worker runs whole: the tiny run's readers together, else one module."""
    module = nodeid.split("::", 1)[0]
    return "tiny_workflow" if module in TINY_RUN_MODULES else module


def pytest_collection_modifyitems(config, items):
    strays = [
        i.nodeid
        for i in items
        if "tiny_workflow" in i.fixturenames and _scope(i.nodeid) not in ("tiny_workflow", SLURM)
    ]
    if strays:
        raise pytest.UsageError(f"tests/conftest.py: add the modules of {strays} to TINY_RUN_MODULES")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # the longest units first, the two longest one per worker (the scheduler below hands them out in
        # collection order)
        first = {"tiny_workflow": 0, SLURM: 1, HUB: 2}
        items.sort(key=lambda item: first.get(_scope(item.nodeid), 3))


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    config.option.loadscopereorder = False  # keep the collection order
    return Scheduling(config, log)


def _built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """``name``'s folder, built by ``build`` by whichever worker asks first; the others wait for it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # unset without xdist
    base = tmp_path_factory.getbasetemp()
    root = base.parent if worker else base  # xdist gives each worker a folder inside the session's
    folder = root / name
    with FileLock(str(folder) + ".lock"):
        done = folder / ".built"
        if not done.exists():
            folder.mkdir(parents=True, exist_ok=True)
            build(folder)
            done.write_text(str(worker))
    return folder


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory):
    """Factory: path of a tiny random checkpoint ('llama' or 'gemma3'), built once per session."""

    def get(arch: str = "llama") -> Path:
        return _built_once(tmp_path_factory, f"tiny-{arch}-src", lambda path: make_tiny(path, arch))

    return get


@pytest.fixture(scope="session")
def tiny_run_config(tiny_source) -> dict:
    """The tiny run's config (on the tiny Llama)."""
    return tiny_config(tiny_source("llama"))


@pytest.fixture(scope="session")
def tiny_workflow(tmp_path_factory, tiny_run_config) -> WorkflowRun:
    """The whole default target list of the workflow, run once locally on the tiny Llama; ``run-files.json``
    beside it lists its result files before any test added to them."""

    def build(folder: Path) -> None:
        run = make_run(folder / "run", tiny_run_config)
        run.snakemake("--cores", "2")
        made = sorted(str(p.relative_to(run.workdir)) for p in (run.workdir / "results").rglob("*") if p.is_file())
        (folder / RUN_FILES).write_text(json.dumps(made))

    folder = _built_once(tmp_path_factory, "tiny-workflow", build)
    return WorkflowRun(folder / "run", folder / "run" / "config.yaml")


@pytest.fixture(scope="session")
def tiny_workflow_files(tiny_workflow) -> list[str]:
    """The tiny run's result files (relative to its folder) as the run left them."""
    return json.loads((tiny_workflow.workdir.parent / RUN_FILES).read_text())


@pytest.fixture
def run_copy(tiny_workflow, tmp_path) -> WorkflowRun:
    """A copy of the tiny workflow's finished run, for a test that changes files (never the session's own: other
    tests read it)."""
    import shutil

    import yaml

    workdir = tmp_path / "run"
    shutil.copytree(tiny_workflow.workdir, workdir, symlinks=True)
    return make_run(workdir, yaml.safe_load(tiny_workflow.configfile.read_text()))
