"""Sustained rates of a job's device for the cost model (``posgen.plan``, ``posgen.synthetic.cost``): the CPU's,
calibrated on the project's 2-core machine, and the GPU's, ASSUMED until a device check (``python -m posgen.bench
gpu``) is committed as ``docs/gpu/gpu-report.json``; its measured rates then replace the assumed ones, each
labelled with the device, date and command that measured it. Only a full-size CUDA report counts (``--tiny`` and
CPU reports are for the test suite).

The report is read defensively (:func:`read_report`, its fields in REQUIRED, MEASURED_ON_GPU, CLASSIFIER): a damaged
one (truncated, a field missing or of the wrong kind) is one line on stderr naming the file, the field and the
fallback the plans take, never a traceback. ``$POSGEN_GPU_REPORT`` points the plans at another report.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_REPORT = ROOT / "docs" / "gpu" / "gpu-report.json"
REPORT_ENV = "POSGEN_GPU_REPORT"  # another report than the committed one (a trial, the tests' damaged copies)

# What the plans read of a report (posgen.bench.gpu writes it), by dotted field: its kind. REQUIRED fields say
# what the report is and where its rates come from; a damaged one leaves the whole report unused. Every other
# field is optional (a part that failed or did not fit measured nothing); a damaged one is left out alone, with the
# fallback of FALLBACKS. Each damage is one line on stderr naming the file, the field and the fallback.
REQUIRED = {
    "device": "text",
    "tiny": "flag",
    "device_name": "text",
    "date": "text",
    "command": "text",
    "rates": "section",
}
MEASURED_ON_GPU = ("forward", "moments", "error")  # the rates the device check measures (posgen.bench gpu)
CLASSIFIER = {"seconds_per_step": "rate", "precision": "text", "layers": "count", "batch": "count", "tokens": "count"}
KINDS = {
    "text": "a string",
    "flag": "true or false",
    "count": "a positive integer",
    "rate": "a positive number",
    "section": "an object",
}
UNUSED = "the plans do not use the report (the ASSUMED GPU rates and issue 38's H100 classifier rate instead)"
FALLBACKS = {
    "rates.classifier": "the plans use issue 38's H100 classifier rate instead",
    "rates.classifier.jobs_per_device": "the plans count 1 classifier per GPU instead",
    "parts": "the plans use rates.classifier.seconds_per_step instead",
}


def _is(value, kind: str) -> bool:
    """Whether ``value`` (as JSON gave it) is of ``kind`` (one of KINDS)."""
    if kind in ("count", "rate"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            return False
        return kind == "rate" or value == int(value)
    return isinstance(value, {"text": str, "flag": bool, "section": dict}[kind])


def _damage(field: str, value, kind: str, missing: bool = False) -> str:
    if missing:
        return f"{field} is missing"
    return f"{field} is {json.dumps(value)[:40]}, not {KINDS[kind]}"


def shown_report(path: Path) -> str:
    """``path`` as the messages show it: relative to the working directory or else to the checkout, if below it."""
    for base in (Path.cwd(), ROOT):
        try:
            return str(path.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(path)


def _classifier_damage(classifier) -> tuple | None:
    """(field, value, kind, missing) of the first damaged field of ``rates.classifier``, None when it is whole."""
    if not isinstance(classifier, dict):
        return "rates.classifier", classifier, "section", False
    for key, kind in CLASSIFIER.items():
        if key not in classifier or not _is(classifier[key], kind):
            return f"rates.classifier.{key}", classifier.get(key), kind, key not in classifier
    return None


def _optional(report: dict) -> list[tuple[str, str]]:
    """(damage, fallback) of every optional field of ``report`` that is damaged, each left out of ``report``."""
    found = []
    rates = report["rates"]
    for name in MEASURED_ON_GPU:
        if name in rates and not _is(rates[name], "rate"):
            found.append(
                (_damage(f"rates.{name}", rates.pop(name), "rate"), f"the plans use the ASSUMED {name} rate instead")
            )
    classifier = rates.get("classifier")
    if classifier is not None:
        bad = _classifier_damage(classifier)
        if bad:
            found.append((_damage(*bad), FALLBACKS["rates.classifier"]))
            del rates["classifier"]
        elif "jobs_per_device" in classifier and not _is(classifier["jobs_per_device"], "rate"):
            field = "rates.classifier.jobs_per_device"
            found.append((_damage(field, classifier.pop("jobs_per_device"), "rate"), FALLBACKS[field]))
    parts = report.get("parts", {})
    measured = parts.get("classifier", {}) if isinstance(parts, dict) else None
    if not isinstance(measured, dict):
        field = "parts" if measured is None else "parts.classifier"
        found.append((_damage(field, parts if measured is None else measured, "section"), FALLBACKS["parts"]))
        report["parts"] = {}
        return found
    for key in [k for k in measured if k.endswith("_steps_per_s") and not _is(measured[k], "rate")]:
        found.append((_damage(f"parts.classifier.{key}", measured.pop(key), "rate"), FALLBACKS["parts"]))
    return found


def read_report(path: Path) -> tuple[dict | None, str, list[str]]:
    """A device-check report read defensively: (the report with its damaged optional fields left out, or None where
    it is not used; why not, in words; one line per damage, naming the file, the field and the fallback taken)."""
    name = shown_report(path)
    if not path.is_file():
        return None, f"no {name}", []
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        return None, f"{name} is unreadable", [f"{name}: not a readable JSON file ({text}); {UNUSED}"]
    if not isinstance(report, dict):
        return None, f"{name} is damaged", [f"{name}: {_damage('the report', report, 'section')}; {UNUSED}"]
    for field, kind in REQUIRED.items():
        if field not in report or not _is(report[field], kind):
            damage = _damage(field, report.get(field), kind, missing=field not in report)
            return None, f"{name} is damaged", [f"{name}: {damage}; {UNUSED}"]
    if report["device"] != "cuda" or report["tiny"]:
        what = "a --tiny check" if report["tiny"] else f"a check on {report['device']}"
        return None, f"{name} is {what}, which the plans do not use", []
    found = _optional(report)
    return report, "", [f"{name}: {damage}; {fallback}" for damage, fallback in found]


@lru_cache(maxsize=8)  # read once per process: the plan asks for every job
def _read_once(path: Path) -> tuple[dict | None, str]:
    report, why, lines = read_report(path)
    for line in lines:
        print(line, file=sys.stderr)
    return report, why


def forget_reports() -> None:
    """Read every report anew at its next use (a test, or a session that changed one)."""
    _read_once.cache_clear()


def report_path(path: str | Path | None = None) -> Path:
    """``path``, else the report ``$POSGEN_GPU_REPORT`` names, else the committed one."""
    return Path(path if path is not None else os.environ.get(REPORT_ENV) or GPU_REPORT).resolve()


def gpu_report(path: str | Path | None = None) -> dict | None:
    """The device check's report (:func:`report_path`), or None when there is none, it is not a full-size CUDA run
    or it is damaged beyond use (each damage printed once, on stderr, as one line)."""
    return _read_once(report_path(path))[0]


def unused_because(path: str | Path | None = None) -> str:
    """Why :func:`gpu_report` gives None, in words (no such file, a --tiny or CPU check, a damaged report)."""
    return _read_once(report_path(path))[1]


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


def device_rates(device: str, report: dict | None = None, why: str = "") -> tuple[Rates, str]:
    """The rates of ``device`` and a label saying which are measured: on the GPU, those of a committed device
    check (``report``, :func:`gpu_report`) replace the assumed ones they measure; the rest stay ASSUMED. ``why``:
    why there is no report (:func:`unused_because`)."""
    if device == "cpu":
        return CPU, "calibrated on the 2-core bench machine"
    measured = {
        name: float(report["rates"][name]) for name in MEASURED_ON_GPU if name in (report or {}).get("rates", {})
    }
    if not measured:
        why = "it measured none of them" if report else why or "no docs/gpu/gpu-report.json"
        return GPU, f"ASSUMED H100 rates, unmeasured ({why})"
    assumed = [name for name in Rates.__dataclass_fields__ if name not in measured]
    label = f"{', '.join(measured)} {source(report)}; ASSUMED: {', '.join(assumed)}"
    return replace(GPU, **measured), label


def committed_rates(device: str) -> tuple[Rates, str]:
    """:func:`device_rates` of ``device`` with the device check's report, if it is used, and why not."""
    return device_rates(device, gpu_report(), unused_because())
