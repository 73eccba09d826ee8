"""What a collection of the second paper's classifiers costs to train: optimiser steps and device-hours
(``python -m posgen.plan --study <collection>``; docs/slurm.md, "Planning a run").

Steps per classifier: ``epochs * ceil(n_train / batch_size)``, with ``n_train`` the train split of the
experiment's own task sizes. Seconds per step: a measured rate at one reference size, scaled to the experiment's
size by ``layers * batch * tokens ** TOKEN_EXPONENT`` (an assumption beyond the reference):

* ``gpu``: MEASURED on one H100 80GB (2026-11-26, torch 2.11 + CUDA 13, TF32 allowed, issue 38): 3.0-3.3
  optimiser steps/s per training job at the authors' size (6 layers x 16 heads, width 256, FFN 512, batch 512,
  122 tokens), about 15 steps/s for the whole GPU with 5 jobs side by side. Device-hours assume that packing.
* ``cpu``: MEASURED on this project's 2-core machine (2026-11-26, one thread, idle host): 0.137 s per step at
  2 layers x 16 heads, width 128, FFN 128, batch 64, 34 tokens. The token exponent from two training jobs side
  by side on one host (2026-11-28, dropout 0.1, freed blocks over 32 MB kept: posgen.allocator): 0.069 s per
  step at 34 tokens, 0.52 s at 122. Core-hours; a 2-core machine runs two jobs at once.

A committed device check (``docs/gpu/gpu-report.json``, ``python -m posgen.bench gpu``; posgen.rates)
replaces the ``gpu`` reference with its measured seconds per step at the experiments' ``train.precision`` (its
fastest where it did not measure that one) and its ensemble's packing (never below 1), and the table says so.

On a GPU a small classifier's step is bound by kernel launches, not arithmetic: scaled down from the reference it
would be priced far below what was measured. MEASURED on one H200 (2026-11-27, docs/results.md): the regime study,
105 classifiers of 2 layers x 16 heads, width 128, batch 64, 34-122 tokens, 151,470 optimiser steps in all (seeds
as ensembles, 16 jobs at once), took 318 s of wall time with its analyses: a device step is priced at no less than
318 / 151,470 s (:data:`GPU_STEP_FLOOR`).

Training only: the analysis jobs (ablation, probes, Toeplitz view) add about a fifth on a CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from posgen.experiments import COLLECTIONS, classifiers, collection, resolve
from posgen.rates import gpu_report, source

# seconds per step ~ tokens^1.6 on the CPU (34 -> 122 tokens: 0.069 -> 0.52 s); 1.9 while blocks over 32 MB were
# unmapped at every free (0.74 s at 122 tokens)
TOKEN_EXPONENT = 1.6
# (seconds per step, layers, batch, tokens) of each device's measured reference, and jobs sharing one device
REFERENCE = {"gpu": (1 / 3.1, 6, 512, 122), "cpu": (0.137, 2, 64, 34)}
JOBS_PER_DEVICE = {"gpu": 15 / 3.1, "cpu": 1.0}  # the GPU ran ~15 steps/s with 5 jobs of 3.1 steps/s each
GPU_STEP_FLOOR = 318 / 151_470  # device-seconds per classifier step, the H200's regime study (module docstring)


@dataclass(frozen=True)
class StudyRow:
    experiment: str
    classifiers: int
    steps: int  # per classifier
    tokens: int
    hours: float  # one classifier's training, alone on its device (one core on a CPU)
    device_hours: float  # every classifier of the experiment, packed as measured (a GPU: at least the floor)


def tokens_of(options: dict, task: str) -> int:
    """Sequence length of a task's samples (the pad width every faithful pass keeps)."""
    sizes = options[task]
    return 2 * sizes["max_side"] + sizes["max_middle"] + 2 if task == "distance" else sizes["seq_len"]


def steps_of(options: dict, task: str) -> int:
    """Optimiser steps of one classifier of ``task`` in an experiment (resolved options)."""
    n_train = round((1 - options["test_fraction"]) * options[task]["n_samples"])
    return options["train"]["epochs"] * math.ceil(n_train / options["train"]["batch_size"])


def reference(device: str, precision: str = "float32") -> tuple[tuple, float, str]:
    """(seconds per step, layers, batch, tokens) of ``device``'s reference, the classifiers one device trains at
    once, and where they come from (a committed device check's measurement on the GPU when there is one: its
    rate at the experiments' ``train.precision`` where it measured that one, else its fastest)."""
    report = gpu_report() if device == "gpu" else None
    measured = (report or {}).get("rates", {}).get("classifier")
    if not measured:
        label = "H100 rate measured in issue 38's session" if device == "gpu" else "measured 2-core rate"
        return REFERENCE[device], JOBS_PER_DEVICE[device], label
    steps_per_s = report.get("parts", {}).get("classifier", {}).get(f"{precision}_steps_per_s")
    seconds, used = (
        (1 / steps_per_s, precision) if steps_per_s else (measured["seconds_per_step"], measured["precision"])
    )
    ref = (seconds, measured["layers"], measured["batch"], measured["tokens"])
    label = f"{used} rate {source(report)}"
    # an ensemble slower than its members one after another (compute-bound sizes) is not used: one at a time
    return ref, max(1.0, float(measured.get("jobs_per_device", 1.0))), label


def seconds_per_step(options: dict, tokens: int, device: str) -> float:
    (seconds, layers, batch, ref_tokens), _, _ = reference(device, options["train"]["precision"])
    scale = options["model"]["n_layers"] / layers * options["train"]["batch_size"] / batch
    return seconds * scale * (tokens / ref_tokens) ** TOKEN_EXPONENT


def study_cost(synthetic: dict, which: str, device: str = "gpu") -> list[StudyRow]:
    """One row per experiment of collection ``which``: its classifiers, steps and hours on ``device``."""
    rows = []
    for name in collection(synthetic, which):
        options = resolve(synthetic, name)
        keys = classifiers(options)
        per_task = {task: (steps_of(options, task), tokens_of(options, task)) for task in options["tasks"]}
        seconds = [per_task[task][0] * seconds_per_step(options, per_task[task][1], device) for task, _, _ in keys]
        packed = sum(seconds) / reference(device, options["train"]["precision"])[1]
        if device == "gpu":  # never below the launch-bound rate measured at small sizes
            packed = max(packed, GPU_STEP_FLOOR * sum(per_task[task][0] for task, _, _ in keys))
        rows.append(
            StudyRow(
                experiment=name,
                classifiers=len(keys),
                steps=max(steps for steps, _ in per_task.values()),
                tokens=max(tokens for _, tokens in per_task.values()),
                hours=max(seconds) / 3600,
                device_hours=packed / 3600,
            )
        )
    return rows


def _labels(synthetic: dict, which: str, device: str) -> str:
    """Where the rates of a collection's experiments come from (one label per precision they train in)."""
    precisions = dict.fromkeys(resolve(synthetic, name)["train"]["precision"] for name in collection(synthetic, which))
    return "; ".join(reference(device, precision)[2] for precision in precisions)


def study_table(synthetic: dict, which: str, device: str = "gpu") -> str:
    """The plan of one collection as text."""
    unit = "GPU-hours" if device == "gpu" else "core-hours"
    lines = [
        f"training plan of synthetic.{which} on {device}: {unit} ({_labels(synthetic, which, device)}), scaled from "
        "the reference "
        "size (posgen.synthetic.cost)",
        f"{'experiment':24s} {'classifiers':>11s} {'steps':>7s} {'tokens':>6s} {'h/classifier':>12s} {'total':>8s}",
    ]
    rows = study_cost(synthetic, which, device)
    for r in rows:
        lines.append(
            f"{r.experiment:24s} {r.classifiers:11d} {r.steps:7d} {r.tokens:6d} {r.hours:12.2f} {r.device_hours:8.2f}"
        )
    total = sum(r.device_hours for r in rows)
    lines.append(
        f"total: {sum(r.classifiers for r in rows)} classifiers, {total:.2f} {unit} ({60 * total:.1f} minutes)"
    )
    return "\n".join(lines)


def study_plan(cfg: dict, study: str, configfiles, device: str) -> str:
    """The training plan of ``study`` (a synthetic collection); one line where there is no such study, or where the
    config trains nothing in it (it would price nothing)."""
    if study not in COLLECTIONS:
        raise SystemExit(f"posgen.plan: --study {study}: no such study (the studies: {', '.join(COLLECTIONS)})")
    if not cfg["synthetic"].get(study):
        files = " ".join(configfiles)
        raise SystemExit(
            f"posgen.plan: --study {study}: {files} trains no experiment in synthetic.{study} (nothing to price: "
            f"name its experiments in synthetic.{study}, as config.paper.yaml does for decisive_study)"
        )
    return study_table(cfg["synthetic"], study, device)
