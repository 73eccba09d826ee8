"""Sustained rates of a job's device for the cost model (``posgen.plan``, ``posgen.synthetic.cost``): the CPU's,
calibrated on the project's 2-core machine, and the GPU's, ASSUMED until a device check (``python -m posgen.bench
gpu``) is committed as ``docs/gpu/gpu-report.json``; its measured rates then replace the assumed ones, each
labelled with the device, date and command that measured it. Only a full-size CUDA report counts (``--tiny`` and
CPU reports are for the test suite).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

GPU_REPORT = Path(__file__).resolve().parents[2] / "docs" / "gpu" / "gpu-report.json"


@lru_cache(maxsize=8)  # read once per process: the plan asks for every job
def gpu_report(path: str | Path | None = None) -> dict | None:
    """The committed device check's report, or None when there is none or it is not a full-size CUDA run."""
    path = Path(path) if path is not None else GPU_REPORT
    if not path.is_file():
        return None
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable device-check report ({err})") from None
    if report.get("device") != "cuda" or report.get("tiny", True) or "rates" not in report:
        return None
    return report


def source(report: dict) -> str:
    """Where a measured rate comes from, in words."""
    return f"MEASURED on {report['device_name']} ({report['date'][:10]}, `{report['command']}`)"


@dataclass(frozen=True)
class Rates:
    """Sustained rates of one job's device (per job: 1-2 threads on the CPU, one GPU)."""

    forward: float  # FLOP/s of the model's forward pass in the run's dtype
    moments: float  # FLOP/s of the float64 moment products (many small batched products)
    factor: float  # FLOP/s of float64 FFTs and large products (Method B's sums)
    memory: float  # bytes/s streamed from memory (Method B's solves read its cached inverse)
    error: float  # FLOP/s of the float32 error-and-bound pass, its elementwise work included
    disk: float  # bytes/s written or read (HDF5, NetCDF, weights)
    start_s: float  # per job: interpreter, imports, CUDA context


# Calibrated with `python -m posgen.bench scale` on the project's 2-core machine (docs/slurm.md, "Planning a run"):
# each compute rate is the geometric mean of a busy 1-thread run and a quiet 2-thread run (2.0-2.6x apart), so a
# job on either side of that range is predicted within a factor of 2.
CPU = Rates(forward=84e9, moments=4.6e9, factor=24e9, memory=2e9, error=9.8e9, disk=4e8, start_s=10.0)
# ASSUMPTIONS for one NVIDIA H100 (80 GB), not yet measured: bfloat16 forward at ~30 % of its 990 TFLOP/s dense
# peak; float64 products at ~30 % of its 67 TFLOP/s; memory streamed at ~60 % of 3.3 TB/s; the float32 error
# pass (no TF32) at ~20 % of 67 TFLOP/s; a parallel file system at 1 GB/s; a minute to start a job and build the
# CUDA context.
GPU = Rates(forward=300e12, moments=20e12, factor=20e12, memory=2e12, error=12e12, disk=1e9, start_s=60.0)
MEASURED_ON_GPU = ("forward", "moments", "error")  # the rates the device check measures (posgen.bench gpu)


def device_rates(device: str, report: dict | None = None) -> tuple[Rates, str]:
    """The rates of ``device`` and a label saying which are measured: on the GPU, those of a committed device
    check (``report``, posgen.measured) replace the assumed ones they measure; the rest stay ASSUMED."""
    if device == "cpu":
        return CPU, "calibrated on the 2-core bench machine"
    measured = {
        name: float(report["rates"][name]) for name in MEASURED_ON_GPU if name in (report or {}).get("rates", {})
    }
    if not measured:
        return GPU, "ASSUMED H100 rates, unmeasured (no docs/gpu/gpu-report.json)"
    assumed = [name for name in Rates.__dataclass_fields__ if name not in measured]
    label = f"{', '.join(measured)} {source(report)}; ASSUMED: {', '.join(assumed)}"
    return replace(GPU, **measured), label
