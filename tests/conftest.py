"""Shared fixtures of the unit and workflow tests: tiny random checkpoints and one tiny end-to-end workflow run
per test session (the helpers they use live in posgen.testing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from posgen.testing.runs import WorkflowRun, make_run, tiny_config  # noqa: E402
from posgen.testing.tiny import make_tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory):
    """Factory: path of a tiny random checkpoint ('llama' or 'gemma3'), built once per session."""
    made = {}

    def get(arch: str = "llama") -> Path:
        if arch not in made:
            made[arch] = make_tiny(tmp_path_factory.mktemp(f"tiny-{arch}-src"), arch)
        return made[arch]

    return get


@pytest.fixture(scope="session")
def tiny_workflow(tmp_path_factory, tiny_source) -> WorkflowRun:
    """The whole default target list of the workflow, run once locally on the tiny Llama."""
    run = make_run(tmp_path_factory.mktemp("tiny-workflow"), tiny_config(tiny_source("llama")))
    run.snakemake("--cores", "2")
    return run
