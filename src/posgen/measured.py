"""Rates measured on a GPU by the device check (``python -m posgen.bench gpu``), once its report is committed as
``docs/gpu/gpu-report.json``: what ``posgen.plan`` and ``posgen.synthetic.cost`` use in place of their assumed
GPU rates, each labelled with the device, date and command that measured it.

Only a full-size CUDA report counts (``--tiny`` and CPU reports are for the test suite).
"""

from __future__ import annotations

import json
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
