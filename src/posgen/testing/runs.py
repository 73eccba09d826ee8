"""Snakemake runs of the repository's Snakefile in a scratch directory, with a config small enough for tests.

Needs a source checkout (the Snakefile, rules and workflow scripts sit beside ``src/``): posgen installed
editable, as ``make setup`` does.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

# the checkout: src/posgen/testing/runs.py -> the repository root
ROOT = Path(__file__).resolve().parents[3]
if not (ROOT / "Snakefile").is_file():
    raise ImportError(
        f"posgen.testing.runs needs a source checkout (posgen installed editable): no Snakefile in {ROOT}"
    )
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

# small enough for the tiny end-to-end run (about 20 s on 2 cores)
TINY_SYNTHETIC = {
    "pes": ["nope", "rope", "alibi", "decoupled"],
    "seeds": [0, 1],
    "distance": {"n_samples": 120, "max_side": 3, "max_middle": 5},
    "count": {"n_samples": 120, "seq_len": 10, "n_triggers": 2, "max_count": 5},
    "model": {"n_layers": 2, "n_heads": 2, "d_model": 8, "d_ff": 16},
    "train": {"epochs": 2, "batch_size": 32},
    "toeplitz_samples": 3,
    # one training and one analysis job per task, as config.yaml's clean (a job per classifier is tested apart)
    "experiments": {"clean": {"jobs": "task"}},
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
        "band_interventions": {"n_samples": 2, "seq_len": 32},
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
