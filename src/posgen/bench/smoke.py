"""The paper smoke of the device check (``python -m posgen.bench gpu``, part (e)): the real workflow, through
Snakemake, on config.paper.yaml reduced to one random-init model of the Llama-3.1-8B shape (truncated to a few
layers: the full depth is part (a)'s), its two variants (its saved random weights as "trained", and random-seed0),
8 windows of 4,096 tokens in two shards, and every step of the first paper the config runs (fused extraction with
the held-out windows, gather, summaries, perturbation and capping, head ablation with both probes); then
``python -m posgen.integrity`` over its results. ``--tiny``: the SmolLM2 shape, two layers, two windows of 128 tokens,
on the CPU, which the test suite runs.

It answers whether a paper run gets through on the card, not how fast (parts (a)-(c) measure that): the seconds
of the whole run, of each job (Snakemake's benchmark files), and the integrity check's verdict.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

# (shape, layers, windows, tokens per window) of the smoke, full size and --tiny
SMOKE = {False: ("llama-3.1-8b", 4, 8, 4096), True: ("smollm2-135m", 2, 2, 128)}
MODEL = "smoke"
REPO = Path(__file__).resolve().parents[3]


def smoke_model(root: Path, shape: str, n_layers: int, dtype: str) -> Path:
    """A checkpoint of ``shape`` truncated to ``n_layers``, random weights (seed 0) saved as safetensors: the model
    whose "trained" variant the smoke runs (a local source, as a user's own model would be)."""
    import torch
    from transformers import AutoConfig

    from posgen.bench.context import shape_model_dir
    from posgen.models import init_weights

    root.mkdir(parents=True, exist_ok=True)
    folder = shape_model_dir(root, shape, n_layers)
    model = init_weights(AutoConfig.from_pretrained(folder), seed=0).to(getattr(torch, dtype))
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "manifest.json").unlink()  # acquisition writes its own
    return folder


def smoke_config(paper: dict, model_dir: Path, tiny: bool, device: str) -> dict:
    """config.paper.yaml (``paper``) reduced to the smoke's model, windows and variants; the rest as the paper
    config sets it."""
    from posgen.config import schema_defaults

    _, _, windows, tokens = SMOKE[tiny]
    config = {key: value for key, value in paper.items() if key != "synthetic"}
    config.update(
        models=[{"name": MODEL, "source": f"local:{model_dir}"}],
        corpus={"source": "embedded"},  # no network on the device
        n_samples=windows,
        seq_len=tokens,
        heldout_windows=2,
        random_init_seeds=[0],
        shards=2,
        device=device,
        dtype=paper["dtype"] if device == "cuda" else "float32",
    )
    perturb = {**schema_defaults("perturb"), **paper.get("perturb", {})}
    caps = [cap for cap in perturb["caps"] if cap < tokens - 1] or [tokens // 4]  # a cap must fit the window
    config["perturb"] = {**paper.get("perturb", {}), "n_samples": min(windows, 4), "seq_len": tokens, "caps": caps}
    config["band_interventions"] = {
        **paper.get("band_interventions", {}),
        "n_samples": min(windows, 2),
        "seq_len": tokens,
    }
    figures = {**schema_defaults("figures"), **paper.get("figures", {})}
    config["figures"] = {**paper.get("figures", {}), "map_tokens": min(figures["map_tokens"], tokens)}
    return config


def smoke_targets(config: dict) -> list[str]:
    """What rule ``all`` builds for the first paper on the smoke's model: its q/k shards, tables, summaries,
    perturbation, capping and head ablation (not the second paper's classifiers, figures or reproduction)."""
    from posgen.config import merge, read_yaml, validate
    from posgen.workflow.targets import final_outputs

    # as Snakemake reads it: the Snakefile's config.yaml, the smoke's config merged over it
    merged = validate(merge(read_yaml(REPO / "config.yaml"), yaml.safe_load(yaml.safe_dump(config))))
    return [path for path in final_outputs(merged) if path.startswith(f"results/{MODEL}/")]


def run_smoke(
    tiny: bool, device: str, paper_config: Path, cores: int, timeout: float | None = None, keep: Path | None = None
) -> dict:
    """The smoke in a fresh folder (``keep``: this one, left in place): seconds, jobs, per-rule seconds and peak
    memory from the benchmark files, and whether ``python -m posgen.integrity`` finds every result current. Past
    ``timeout`` seconds of Snakemake the run is killed and the answer is ``{"timed_out": timeout}``."""
    from posgen.config import read_yaml
    from posgen.testing.runs import SNAKEMAKE, make_run

    shape, layers, windows, tokens = SMOKE[tiny]
    root = Path(keep or tempfile.mkdtemp(prefix="posgen-smoke-"))
    try:
        paper = read_yaml(paper_config)
        model_dir = smoke_model(root / "model", shape, layers, paper["dtype"] if device == "cuda" else "float32")
        config = smoke_config(paper, model_dir, tiny, device)
        run = make_run(root / "run", config)
        targets = smoke_targets(config)
        out = {"setup": [shape, layers, windows, tokens], "targets": len(targets)}
        start = time.monotonic()
        cmd = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(run.workdir)]
        cmd += ["--configfile", str(run.configfile), "--cores", str(cores), *targets]
        # a session of its own: past the time left, the whole run (its jobs too) is killed, not left running
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {**out, "timed_out": timeout}
        out["seconds"] = time.monotonic() - start
        if proc.returncode != 0:
            last = [line for line in log.splitlines() if line.strip()][-3:]
            return {**out, "failed": "snakemake: " + " | ".join(last)}
        out["jobs"] = _finished_jobs(log)
        out["missing"] = sum(not (run.workdir / target).exists() for target in targets)  # a job writes several
        out["rules"] = _rule_benchmarks(run.workdir / "benchmarks")
        check = subprocess.run(
            [sys.executable, "-m", "posgen.integrity", "results"], cwd=run.workdir, capture_output=True, text=True
        )
        said = [line for line in check.stdout.splitlines() if line.strip()]
        out["integrity"] = {"current": check.returncode == 0, "said": said[-1] if said else ""}
        return out
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _finished_jobs(log: str) -> int:
    """The number of jobs of the run's last progress line ("n of m steps (100%) done")."""
    done = [line for line in log.splitlines() if "steps (100%) done" in line]
    return int(done[-1].split(" of ")[1].split()[0]) if done else 0


def _rule_benchmarks(folder: Path) -> dict:
    """Per rule, the seconds summed over its jobs and the largest peak RSS (GB), from Snakemake's benchmark files."""
    rules: dict = {}
    for path in sorted(folder.rglob("*.tsv")) if folder.exists() else []:
        rule = path.relative_to(folder).parts[0]
        with open(path) as fh:
            row = next(csv.DictReader(fh, delimiter="\t"), None)
        if row is None:
            continue
        entry = rules.setdefault(rule, {"seconds": 0.0, "peak_rss_gb": 0.0, "jobs": 0})
        entry["seconds"] += float(row["s"])
        entry["jobs"] += 1
        rss = row.get("max_rss", "NA")
        if rss not in ("NA", "-", ""):
            entry["peak_rss_gb"] = max(entry["peak_rss_gb"], float(rss) / 1024)
    return rules
