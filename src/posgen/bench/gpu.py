"""One prepared device check for a GPU session: ``python -m posgen.bench gpu --out DIR [--budget-s 480]``.

Within the budget, on whatever device is present (``--device cpu --tiny``: the same code on small sizes, which the
test suite runs so that it cannot rot):

(a) the Llama-3.1-8B shape at full depth, random-init on the device, a plain forward pass and the fused
    extraction (capture + analysis in memory) on 2 windows of 4096 tokens: seconds per window, fused / forward,
    peak GPU memory, the init's seconds per billion parameters, and a breakdown of the windows' time that adds up
    to it (posgen.bench.steps: each analysis step, the capture, the copies to the host, the self-check, the
    writer, the band statistics, the copy of the statistics, the first window's setup, the rest), with the
    transparency check and the held-out windows timed once beside it;
(b) one layer of the same shape at 32k tokens, forward and fused;
(b') the fused analysis's two layouts (posgen.decomposition.Decomposer ``batched``) on one layer of the 8B shape
    at 4096 tokens: seconds per layer, operations and host syncs each, and their agreement;
(c) the second paper's classifier at the authors' size (config.paper.yaml: 6 layers x 16 heads, width 256, FFN
    512, batch 512, distance task of 122 tokens): optimiser steps/s of one classifier in float32, TF32 and
    bfloat16, the bfloat16 one also through ``torch.compile`` (``compiled_over_eager``), and of an ensemble of 3
    seeds;
(d) the rates these imply for ``posgen.plan`` (forward, moments and error FLOP/s; seconds per classifier step);
(e) the paper smoke (posgen.bench.smoke): the real workflow through Snakemake on config.paper.yaml reduced to one
    random-init model of the 8B shape (4 layers), two variants, 8 windows of 4096 tokens, every step of the first
    paper, and ``python -m posgen.integrity`` over its results.

Each part runs in its own process with what is left of its share of the budget; a part that does not finish is
killed and reported as not fitting, never waited for. Writes ``DIR/gpu-report.json`` (what ``posgen.plan`` reads
once committed as ``docs/gpu/gpu-report.json``) and ``DIR/gpu-report.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from posgen.bench.context import in_child
from posgen.bench.scale import analysis_rates, bench_config, run_stages

REPO = Path(__file__).resolve().parents[3]
PAPER_CONFIG = REPO / "config.paper.yaml"
# (shape, layers kept (0: all), tokens per window, windows) of parts (a) and (b), full size and --tiny
WINDOWS = {
    "full_depth": {False: ("llama-3.1-8b", 0, 4096, 2), True: ("smollm2-135m", 2, 128, 2)},
    "long_window": {False: ("llama-3.1-8b", 1, 32768, 1), True: ("smollm2-135m", 1, 512, 1)},
}
# the self-check's whole-window logits: none for the long window (H T^2 floats per layer; the schema's advice)
REF_LAYERS = {"full_depth": (0, -1), "long_window": ()}
# (shape, tokens) of part (b')
LAYOUTS = {False: ("llama-3.1-8b", 4096), True: ("smollm2-135m", 128)}
# of the budget; the rest is slack
SHARES = {"full_depth": 0.3, "long_window": 0.1, "layouts": 0.05, "classifier": 0.2, "paper_smoke": 0.3}
DUMMY_DISTANCES = [0, 250, 500, 1000, 2000]
CLASSIFIER_STEPS = {False: 30, True: 3}


def classifier_options(tiny: bool) -> dict:
    """The resolved synthetic experiment whose size part (c) measures: config.paper.yaml's paper-decisive (the
    authors' classifier), or the schema defaults (--tiny)."""
    from posgen.bench.synthetic import synthetic_options
    from posgen.config import load
    from posgen.experiments import resolve

    if tiny:
        return resolve(synthetic_options(), "clean")
    return resolve(load(PAPER_CONFIG)["synthetic"], "paper-decisive")


def _classifier(tiny: bool, device: str) -> dict:
    import torch

    from posgen.bench.synthetic import training_rates

    precisions = ["float32", "tf32", "bfloat16"] if torch.cuda.is_available() else ["float32", "bfloat16"]
    options = classifier_options(tiny)
    steps = CLASSIFIER_STEPS[tiny]
    # bfloat16 through torch.compile beside eager (issue 52 item 5): what the decisive study would train with
    return training_rates(options, "distance", "rope+sinusoidal", device, steps, 3, precisions, compiled=["bfloat16"])


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def implied_rates(windows: dict, classifier: dict) -> dict:
    """The rates of posgen.plan (``Rates`` field names) and posgen.synthetic.cost that the measured parts imply."""
    from posgen import plan_model
    from posgen.shapes import SHAPES

    rates = {}
    full = windows.get("full_depth", {})
    forward, fused = full.get("plain forward", {}), full.get("fused (extract + analysis)", {})
    if "seconds" in forward:
        name, layers, tokens, n_windows = full["setup"]
        shape = plan_model.Shape.from_dict(
            {**SHAPES[name], "num_hidden_layers": layers or SHAPES[name]["num_hidden_layers"]}
        )
        rates["forward"] = (
            plan_model.forward_flops(shape, tokens) / forward["seconds"]
        )  # also when the fused part failed
        rates["init_s_per_billion"] = forward["init_s_per_billion"]
        if "steps" in fused:
            cfg = bench_config(tokens, n_windows, DUMMY_DISTANCES)
            steps = fused["steps"]
            rates |= analysis_rates(shape, cfg, forward["seconds"], steps["moments"], steps["bound"])
            rates["capture_and_analysis_over_forward"] = fused["seconds"] / forward["seconds"]
    if "float32_steps_per_s" in classifier:
        best = max(
            # what the workflow trains with: eager (a compiled rate waits for the paired verdict check)
            (
                k
                for k in classifier
                if k.endswith("_steps_per_s") and not k.startswith("ensemble") and "compiled" not in k
            ),
            key=lambda k: classifier[k],
        )
        rates["classifier"] = {
            "seconds_per_step": 1 / classifier[best],
            "precision": best.removesuffix("_steps_per_s"),
            "layers": classifier["model"]["n_layers"],
            "batch": classifier["batch_size"],
            "tokens": classifier["tokens"],
        }
        if "ensemble_steps_per_s" in classifier:
            # classifiers trained per device at once, in one-classifier units: the ensemble's packing
            packing = (
                classifier["ensemble_members"] * classifier["ensemble_steps_per_s"] / classifier["float32_steps_per_s"]
            )
            rates["classifier"]["jobs_per_device"] = packing
    return rates


def report_markdown(report: dict) -> str:
    lines = [
        f"# Device check: {report['device_name']}",
        "",
        f"{report['date']}, `{report['command']}`, torch {report['torch']}, budget {report['budget_s']:.0f} s "
        f"({report['seconds']:.0f} s used).",
        "",
        "| part | stage | s/window | peak GPU GB | init s/B params | note |",
        "|---|---|---|---|---|---|",
    ]
    for part in ("full_depth", "long_window"):
        result = report["parts"].get(part, {})
        name, layers, tokens, n_windows = result.get("setup", WINDOWS[part][report["tiny"]])
        label = f"{part}: {name} x {layers or 'all'} layers, {n_windows} x {tokens} tokens"
        for stage, value in result.items():
            if stage == "setup" or not isinstance(value, dict):
                continue
            if "timed_out" in value:
                lines.append(f"| {label} | {stage} | - | - | - | did not fit ({value['timed_out']:.0f} s left) |")
                continue
            init = f"{value['init_s_per_billion']:.2f}" if "init_s_per_billion" in value else ""
            lines.append(f"| {label} | {stage} | {value['seconds']:.3f} | {value['peak_gpu_gb']:.1f} | {init} | |")
            for step, seconds in value.get("steps", {}).items():
                lines.append(f"| | step {step} | {seconds / n_windows:.3f} | | | all windows' mean |")
            for step, seconds in value.get("once_per_shard", {}).items():
                lines.append(f"| | {step} | {seconds:.3f} | | | once, before the windows |")
    layouts = report["parts"].get("layouts", {})
    if "host" in layouts:
        name, tokens = layouts["setup"]
        lines += ["", f"Fused analysis, one layer of {name} at {tokens} tokens:", ""]
        lines += ["| layout | s/layer | operations | kernels | host syncs |", "|---|---|---|---|---|"]
        for layout in ("host", "device"):
            v = layouts[layout]
            lines.append(f"| {layout} | {v['seconds_per_layer']:.4f} | {v['ops']} | {v['kernels']} | {v['syncs']} |")
        lines += [
            "",
            f"device / host time {layouts['device_over_host']:.3f}; largest difference of r "
            f"{layouts['max_abs_difference_r']:.2e}, over every statistic "
            f"{layouts['max_rel_difference']:.2e} of its largest value.",
        ]
    smoke = report["parts"].get("paper_smoke", {})
    if "seconds" in smoke and "rules" in smoke:
        shape, layers, windows, tokens = smoke["setup"]
        lines += [
            "",
            f"Paper smoke ({shape} x {layers} layers, 2 variants, {windows} x {tokens} tokens, through Snakemake): "
            f"{smoke['jobs']} jobs in {smoke['seconds']:.0f} s; integrity: {smoke['integrity']['said']}",
            "",
            "| rule | jobs | seconds | peak RSS GB |",
            "|---|---|---|---|",
        ]
        for rule, v in smoke["rules"].items():
            lines.append(f"| {rule} | {v['jobs']} | {v['seconds']:.1f} | {v['peak_rss_gb']:.2f} |")
    classifier = report["parts"].get("classifier", {})
    lines += ["", "| classifier | steps/s |", "|---|---|"]
    if "timed_out" in classifier:
        lines.append(f"| did not fit | ({classifier['timed_out']:.0f} s left) |")
    for key, value in classifier.items():
        if key.endswith("_steps_per_s"):
            lines.append(f"| {key.removesuffix('_steps_per_s')} | {value:.2f} |")
    lines += ["", "Rates for posgen.plan:", "", "```", json.dumps(report["rates"], indent=1), "```"]
    if report["did_not_fit"]:
        lines += ["", f"Did not fit the budget: {', '.join(report['did_not_fit'])}."]
    if report["failed"]:
        lines += ["", f"Failed: {'; '.join(report['failed'])}."]
    return "\n".join(lines) + "\n"


def where(err: BaseException) -> str:
    """Where ``err`` arose: the innermost frame in posgen's own code, else the innermost frame (a child
    process's, from the traceback multiprocessing attaches as the cause), as ``file:line in function``."""
    text = str(err.__cause__) if err.__cause__ is not None else "".join(traceback.format_tb(err.__traceback__))
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', text)
    if not frames:
        return ""
    own = [frame for frame in frames if "/posgen/" in frame[0]]
    path, line, function = (own or frames)[-1]
    return f"{path.rsplit('/posgen/', 1)[-1] if own else Path(path).name}:{line} in {function}"


def attempt(function, *args, **kwargs) -> dict:
    """``function``'s result, or ``{"failed": "<error> (at <where>)"}``: one part's failure leaves the others
    measured, and the report says where it stopped (one device call is all a session may have)."""
    try:
        return function(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - reported in the file, the other parts still run
        at = where(err)
        message = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        return {"failed": message + (f" (at {at})" if at else "")}


def main(argv=None) -> dict:
    import torch

    from posgen.bench.ops import compare_layouts  # torch at import: inside the check, as above
    from posgen.bench.smoke import run_smoke
    from posgen.device import resolve_device

    parser = argparse.ArgumentParser(prog="python -m posgen.bench gpu", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder of gpu-report.json and gpu-report.md")
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="small sizes (the test suite's CPU run)")
    parser.add_argument("--dtype", default="bfloat16", help="of the 8B-shape model (config.paper.yaml's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke-cores", type=int, default=2, help="snakemake --cores of the paper smoke")
    args = parser.parse_args(argv)
    device = resolve_device(args.device).type
    start = time.monotonic()
    deadline = start + args.budget_s
    parts, did_not_fit, failed = {}, [], []
    for part in ("full_depth", "long_window"):
        name, layers, tokens, n_windows = WINDOWS[part][args.tiny]
        share = max(min(SHARES[part] * args.budget_s, deadline - time.monotonic()), 0.0)
        stages = attempt(
            run_stages,
            name,
            layers,
            tokens,
            n_windows,
            args.threads,
            device,
            args.dtype,
            ["forward", "fused"],
            DUMMY_DISTANCES,
            timeout=share,
            ref_layers=REF_LAYERS[part],
        )
        did_not_fit += [f"{part} {stage}" for stage, value in stages.items() if "timed_out" in value]
        failed += [f"{part}: {stages['failed']}"] if "failed" in stages else []
        parts[part] = {"setup": [name, layers, tokens, n_windows], **stages}

    def one_part(name: str, run) -> None:
        """Part ``name``: ``run(share)`` within its share of what is left, its result recorded."""
        share = max(min(SHARES[name] * args.budget_s, deadline - time.monotonic()), 1.0)
        parts[name] = result = run(share)
        did_not_fit.extend([name] if "timed_out" in result else [])
        failed.extend([f"{name}: {result['failed']}"] if "failed" in result else [])

    one_part("layouts", lambda share: attempt(in_child, compare_layouts, *LAYOUTS[args.tiny], device, timeout=share))
    one_part("classifier", lambda share: attempt(in_child, _classifier, args.tiny, device, timeout=share))
    one_part("paper_smoke", lambda share: attempt(run_smoke, args.tiny, device, PAPER_CONFIG, args.smoke_cores, share))
    report = {
        "device_name": device_name(device),
        "device": device,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m posgen.bench gpu " + shlex.join(sys.argv[2:] if argv is None else argv),
        "torch": torch.__version__,
        "tiny": args.tiny,
        "budget_s": args.budget_s,
        "seconds": time.monotonic() - start,
        "parts": parts,
        "rates": implied_rates(parts, parts["classifier"]),
        "did_not_fit": did_not_fit,
        "failed": failed,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-report.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
    (args.out / "gpu-report.md").write_text(report_markdown(report))
    print(report_markdown(report))
    return report
