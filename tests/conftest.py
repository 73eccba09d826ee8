"""Shared fixtures: tiny random checkpoints and one tiny end-to-end workflow run per test session."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

from posgen.tiny import make_tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory):
    """Factory: path of a tiny random checkpoint ('llama' or 'gemma3'), built once per session."""
    made = {}

    def get(arch: str = "llama") -> Path:
        if arch not in made:
            made[arch] = make_tiny(tmp_path_factory.mktemp(f"tiny-{arch}-src"), arch)
        return made[arch]

    return get


# small enough for the tiny end-to-end run (about 20 s on 2 cores)
TINY_SYNTHETIC = {
    "pes": ["nope", "rope", "alibi", "decoupled"],
    "seeds": [0, 1],
    "distance": {"n_samples": 120, "max_side": 3, "max_middle": 5},
    "count": {"n_samples": 120, "seq_len": 10, "n_triggers": 2, "max_count": 5},
    "model": {"n_layers": 2, "n_heads": 2, "d_model": 8, "d_ff": 16},
    "train": {"epochs": 2, "batch_size": 32},
    "toeplitz_samples": 3,
}


def tiny_config(source_dir: Path, name: str = "tiny-llama") -> dict:
    """A complete workflow config small enough to run end to end in about a minute on 2 cores."""
    return {
        "models": [{"name": name, "source": f"local:{source_dir}"}],
        "corpus": {"source": "embedded"},
        "n_samples": 3,
        "shards": 2,
        "seq_len": 48,
        "window_seed": 0,
        "random_init_seeds": [0],
        "dtype": "float32",
        "device": "cpu",
        "extract": {"ref_samples": [0], "ref_layers": [0, -1]},
        "decomposition": {"dummy_distances": [0, 100], "dummy_distance": 100},
        "intervals": {"bootstrap": 200},
        "perturb": {"n_samples": 2, "seq_len": 32, "rates": [0, 0.1, 0.5], "caps": [4, 16]},
        "figures": {"map_tokens": 32},
        "synthetic": copy.deepcopy(TINY_SYNTHETIC),
    }


@dataclass
class WorkflowRun:
    workdir: Path
    configfile: Path

    def snakemake(
        self, *args: str, check: bool = True, env: dict | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess:
        """Run snakemake on the repository's Snakefile in this run's directory."""
        cmd = [
            SNAKEMAKE,
            "-s",
            str(ROOT / "Snakefile"),
            "--directory",
            str(self.workdir),
            "--configfile",
            str(self.configfile),
            *args,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
        return proc


def make_run(workdir: Path, config: dict) -> WorkflowRun:
    workdir.mkdir(parents=True, exist_ok=True)
    configfile = workdir / "config.yaml"
    configfile.write_text(yaml.safe_dump(config, sort_keys=False))
    return WorkflowRun(workdir, configfile)


@pytest.fixture(scope="session")
def tiny_workflow(tmp_path_factory, tiny_source) -> WorkflowRun:
    """The whole default target list of the workflow, run once locally on the tiny Llama."""
    run = make_run(tmp_path_factory.mktemp("tiny-workflow"), tiny_config(tiny_source("llama")))
    run.snakemake("--cores", "2")
    return run
