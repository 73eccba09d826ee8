"""Paper-scale shapes (``--seq-lens``: the scaling with the window length, posgen.bench.context): a paper model's exact config (posgen.shapes), random weights, truncated to a few layers on
the CPU (``--layers 0``: full depth, for a GPU), windows of paper length through a plain forward pass, extraction
(capture + HDF5), the store-then-decompose decomposition, and the fused path (extraction with the analysis in
memory, no q/k written). ``--device cuda`` runs every stage on the GPU and reports its peak GPU memory;
``--stages`` picks the stages (a full-depth 8B model on one GPU: ``forward fused``).

Each stage is one function (``_stage_*``, returning seconds per window, peak RSS and bytes written) run in its
own process, so its peak resident memory is its own; the stages run one after another on the same window.
Per-layer time is the stage time over the layer count; bytes written are the real file sizes. Beside every measured time the bench prints the cost model's prediction (``posgen.plan`` with its
calibrated CPU rates) and their ratio, per stage and per part of the decomposition, and the rates this run
implies (the calibration of docs/slurm.md, "Planning a run"). The last tables extrapolate to the full paper config
with ``posgen.plan``: the store path (float32 q/k of every window) and the fused path (as config.paper.yaml).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from posgen.bench.context import in_child, report, shape_model_dir, sweep
from posgen.rates import committed_rates
from posgen.shapes import SHAPES

VARIANT = "random-seed0"  # built from config.json alone: no weights on disk


def _peaks(device: str) -> dict:
    """This process's peak resident host memory and peak GPU memory (0 on the CPU), GB."""
    import torch

    return {
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB on Linux
        "peak_gpu_gb": torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else 0.0,
    }


def _synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()  # kernels run asynchronously: a timer stops only after they are done


def _windows(path: Path, vocab: int, n_windows: int, seq_len: int) -> None:
    import xarray as xr

    from posgen.corpus import write_windows

    ids = np.random.default_rng(0).integers(0, vocab, size=(n_windows, seq_len))
    coords = {"sample": np.arange(n_windows), "token": np.arange(seq_len)}
    write_windows(xr.Dataset({"token_id": (("sample", "token"), ids)}, coords=coords), path)


def _stage_forward(model_dir: str, windows: str, threads: int, device: str, dtype: str) -> dict:
    import torch

    from posgen.corpus import read_windows
    from posgen.llm.families import plain_backend
    from posgen.models import load_model

    torch.set_num_threads(threads)
    start = time.perf_counter()
    model, _, _ = load_model(model_dir, VARIANT, dtype=dtype, device=device, attn_implementation=plain_backend)
    _synchronize(device)
    init_seconds = time.perf_counter() - start  # random-init weights drawn on the device (posgen.models)
    parameters = sum(p.numel() for p in model.parameters())
    ids = torch.from_numpy(read_windows(windows)["token_id"].values).to(device)
    positions = torch.arange(ids.shape[1], device=device)[None]
    seconds = []
    with torch.inference_mode():
        # warm-up at the timed length: a device picks its kernels per shape on first use
        model.base_model(input_ids=ids[:1], position_ids=positions, use_cache=False)
        for row in ids:
            _synchronize(device)
            start = time.perf_counter()
            model.base_model(input_ids=row[None], position_ids=positions, use_cache=False)
            _synchronize(device)
            seconds.append(time.perf_counter() - start)
    return {
        "seconds": float(np.median(seconds)),
        "per_window": seconds,
        "init_seconds": init_seconds,
        "init_s_per_billion": init_seconds / (parameters / 1e9),
        **_peaks(device),
        "bytes": 0,
    }


def _stage_extract(
    model_dir: str, windows: str, threads: int, device: str, dtype: str, out: str, ref_layers: tuple
) -> dict:
    import torch

    from posgen.llm.extract import extract
    from posgen.llm.options import ExtractOptions
    from posgen.llm.run import ModelRun

    torch.set_num_threads(threads)
    job = ModelRun(model_dir, windows, out, model="bench", variant=VARIANT, dtype=dtype, device=device)
    report = extract(job, ExtractOptions.defaults(ref_layers=ref_layers))
    seconds = report["seconds_per_window"]
    return {
        # the first window also runs the self-check and opens the file
        "seconds": float(np.median(seconds[1:] if len(seconds) > 1 else seconds)),
        "per_window": seconds,
        **_peaks(device),
        "bytes": Path(out).stat().st_size,
    }


def _bench_options(dummy_distances: list[int], device: str):
    """The schema's decomposition options with the benchmark's sweep, D = 1000 and the bound on the first window."""
    from posgen.decomposition.options import DecompositionOptions

    return DecompositionOptions.defaults(
        dummy_distances=dummy_distances, dummy_distance=1000, bound_samples=1, device=device
    )


def _stage_fused(
    model_dir: str,
    windows: str,
    threads: int,
    device: str,
    dtype: str,
    out: str,
    dummy_distances: list[int],
    ref_layers: tuple,
) -> dict:
    import torch

    from posgen.bench.steps import ONCE_STEPS, StepTimer
    from posgen.llm.extract import extract
    from posgen.llm.fused import Analysis
    from posgen.llm.options import ExtractOptions
    from posgen.llm.run import ModelRun

    torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir()
    options = _bench_options(dummy_distances, device)
    analysis = Analysis(options, decomposition_path=out / "decomposition.nc", bands_path=out / "bands.nc")
    with StepTimer(sync=lambda: _synchronize(device), window_steps=True) as timer:
        report = extract(
            ModelRun(model_dir, windows, out / "qk.h5", model="bench", variant=VARIANT, dtype=dtype, device=device),
            ExtractOptions.defaults(ref_layers=ref_layers, keep_qk=0),
            analysis=analysis,
        )
    seconds = report["seconds_per_window"]
    steps = timer.steps()  # seconds of each step, all windows (posgen.bench.steps)
    once = {name: steps.pop(name) for name in ONCE_STEPS}  # before the windows
    steps["rest"] = float(np.sum(seconds)) - sum(steps.values())  # the windows' time no step accounts for
    return {
        "seconds": float(np.mean(seconds)),  # every window: the first also runs the error and bound, as in decompose
        "per_window": seconds,
        "steps": steps,  # they add up to the windows' time
        "once_per_shard": once,
        **_peaks(device),
        "bytes": sum(f.stat().st_size for f in out.iterdir()),
    }


def _stage_decompose(qk: str, threads: int, device: str, out: str, dummy_distances: list[int]) -> dict:
    import torch

    from posgen.bench.steps import StepTimer
    from posgen.decomposition import decompose_store

    torch.set_num_threads(threads)
    # time each part of Decomposer.unit; Method B's normal matrices are built inside method_b on first use
    start = time.perf_counter()
    with StepTimer() as timer:
        ds = decompose_store(qk, out, _bench_options(dummy_distances, device))
    _synchronize(device)
    seconds = time.perf_counter() - start
    steps = timer.steps()
    parts = {
        "moments": steps["moments"],
        "method_b": steps["method_b"],
        "error": steps["bound"],
    }
    return {
        "seconds": seconds / ds.sizes["sample"],
        **_peaks(device),
        "bytes": Path(out).stat().st_size,
        "parts": parts,
    }


def bench_config(seq_len: int, n_windows: int, dummy_distances: list[int]) -> dict:
    """The config the bench's own jobs amount to, as posgen.plan reads it."""
    return {
        "seq_len": seq_len,
        "n_samples": n_windows,
        "dtype": "float32",
        "extract": {"ref_samples": [0], "ref_layers": [0, -1], "analysis": "store"},
        "decomposition": {"dummy_distances": dummy_distances, "dummy_distance": 1000, "bound_samples": 1},
    }


def predictions(shape, cfg: dict, rates) -> dict:
    """Seconds per window of each stage and of each part of the decomposition, from posgen.plan."""
    from posgen import plan_model

    T, n = cfg["seq_len"], cfg["n_samples"]
    forward = plan_model.forward_flops(shape, T) / rates.forward
    refs = len(cfg["extract"]["ref_layers"]) * shape.logits_bytes(T) / n
    parts = plan_model.analysis_parts(shape, cfg, n, 1, rates)
    bands = parts.pop("bands")
    return {
        "plain forward": forward,
        "extract (capture + HDF5)": plan_model.CAPTURE_OVERHEAD * forward + (shape.qk_bytes(T) + refs) / rates.disk,
        "decompose (from qk.h5)": sum(parts.values()) / n + shape.qk_bytes(T) / rates.disk,
        # the fused stage (posgen.llm.extract.extract(..., analysis=...)): capture, decomposition and bands in memory,
        # no q/k written (keep_qk 0)
        "fused (extract + analysis)": plan_model.CAPTURE_OVERHEAD * forward + (sum(parts.values()) + bands) / n,
        "parts": {name: value / n for name, value in parts.items()},
    }


def analysis_rates(shape, cfg: dict, forward_s: float, moments_s: float, bound_s: float) -> dict:
    """The forward, moments and error FLOP/s (:class:`posgen.rates.Rates` fields) of a run of the bench's config
    ``cfg``: each part's work over its measured seconds (the forward pass per window; the moments of every window
    and layer; the error-and-bound pass of one window, ``bound_samples`` 1)."""
    from posgen import plan_model

    T, n = cfg["seq_len"], cfg["n_samples"]
    dec = cfg["decomposition"]
    n_distances = len(set(dec["dummy_distances"]) | {dec["dummy_distance"]})
    return {
        "forward": plan_model.forward_flops(shape, T) / forward_s,
        "moments": n * shape.n_layers * plan_model.moments_flops(shape, T, n_distances) / max(moments_s, 1e-9),
        "error": shape.n_layers * plan_model.error_flops(shape, T) / max(bound_s, 1e-9),
    }


def implied_rates(shape, cfg: dict, stages: dict, rates) -> dict:
    """The sustained rates this run measured (the calibration of ``rates``, posgen.rates.CPU or GPU): work over
    measured time."""
    from posgen import plan_model

    T, n = cfg["seq_len"], cfg["n_samples"]
    parts = stages["decompose (from qk.h5)"]["parts"]
    flops_b, read_b = plan_model.method_b_cost(shape, T)
    plain = stages["plain forward"]["seconds"]
    measured = analysis_rates(shape, cfg, plain, parts["moments"], parts["error"])
    return {
        "forward FLOP/s": measured["forward"],
        "capture overhead": stages["extract (capture + HDF5)"]["seconds"] / plain,
        "moments FLOP/s": measured["moments"],
        # Method B's conjugate gradients: their bytes over the time left after its FFTs
        "memory B/s": n
        * shape.n_layers
        * read_b
        / max(1e-9, parts["method_b"] - n * shape.n_layers * flops_b / rates.factor),
        "error FLOP/s": measured["error"],
    }


def extrapolate(paper_config: Path) -> None:
    """Totals of the paper config through posgen.plan: the store path and the fused path, CPU and GPU."""
    import copy

    from posgen import config as posgen_config
    from posgen import plan

    paper = posgen_config.load(paper_config)
    store = copy.deepcopy(paper)
    store["extract"].update(analysis="store", keep_qk="all", qk_dtype="float32")
    fused = copy.deepcopy(paper)
    fused["extract"].setdefault("analysis", "fused")
    opts = plan.config_options(fused)
    print(
        f"\nextrapolated to {paper_config.name} ({paper['n_samples']} windows x {paper['seq_len']} tokens, "
        f"{len(paper['models'])} models x {len(posgen_config.variants(paper))} variants) by posgen.plan:"
    )
    print(f"{'path':44s} {'jobs':>5s} {'disk GB':>9s} {'CPU-hours':>10s} {'GPU-hours*':>11s}")
    for label, cfg in (
        ("store (float32 q/k of every window)", store),
        (f"fused (keep_qk {opts['keep_qk']}, {opts['qk_dtype']}, {opts['shards']} shard(s))", fused),
    ):
        cpu = plan.totals(plan.plan(cfg, device="cpu"))
        gpu = plan.totals(plan.plan(cfg, device="gpu"))
        print(f"{label:44s} {gpu['jobs']:5d} {gpu['disk_gb']:9.1f} {cpu['hours']:10.1f} {gpu['hours']:11.1f}")
    print(f"* GPU-hours from posgen.plan's GPU rates: {committed_rates('gpu')[1]}")


def run_stages(
    shape_name: str,
    layers: int,
    seq_len: int,
    n_windows: int,
    threads: int,
    device: str,
    dtype: str,
    stages,
    dummy_distances,
    timeout: float | None = None,
    ref_layers: tuple = (0, -1),
) -> dict:
    """Each stage of ``stages`` (in :data:`STAGES` order) in its own process on random windows of a recorded
    shape truncated to ``layers`` (0: full depth): name -> its result, or ``{"timed_out": s}`` for a stage that
    did not finish within what is left of ``timeout`` seconds (the stages after it are not started).
    ``ref_layers``: the self-check's whole-window logits (config ``extract.ref_layers``); () for long windows,
    whose logits are H T^2 floats per layer (128 GiB for the 8B shape at 32k tokens), as the schema says."""
    deadline = None if timeout is None else time.monotonic() + timeout
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = shape_model_dir(root, shape_name, layers or None)
        windows = root / "windows.h5"
        _windows(windows, 512, n_windows, seq_len)
        common = (str(model_dir), str(windows), threads, device, dtype)
        calls = {
            "forward": (_stage_forward, *common),
            "extract": (_stage_extract, *common, str(root / "qk.h5"), ref_layers),
            "decompose": (
                _stage_decompose,
                str(root / "qk.h5"),
                threads,
                device,
                str(root / "decomposition.nc"),
                dummy_distances,
            ),
            "fused": (_stage_fused, *common, str(root / "fused"), dummy_distances, ref_layers),
        }
        for stage in STAGES:
            if stage not in stages:
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                results[STAGE_NAMES[stage]] = {"timed_out": 0.0}
                continue
            results[STAGE_NAMES[stage]] = in_child(*calls[stage], timeout=left)
    return results


STAGES = ("forward", "extract", "decompose", "fused")
STAGE_NAMES = {
    "forward": "plain forward",
    "extract": "extract (capture + HDF5)",
    "decompose": "decompose (from qk.h5)",
    "fused": "fused (extract + analysis)",
}


def main(argv=None):
    from posgen import plan_model
    from posgen.device import resolve_device

    parser = argparse.ArgumentParser(prog="python -m posgen.bench scale", description=__doc__)
    parser.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=2, help="truncate the model to its first N layers (0: all)")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--windows", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--dtype", default="float32", help="of the model (config.paper.yaml: bfloat16)")
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES, help="decompose needs extract")
    parser.add_argument("--dummy-distances", type=int, nargs="+", default=[0, 250, 500, 1000, 2000])
    parser.add_argument("--paper-config", type=Path, default=Path(__file__).resolve().parents[3] / "config.paper.yaml")
    group = parser.add_argument_group("context sweep (posgen.bench.context): one layer per shape, one window per T")
    group.add_argument("--seq-lens", type=int, nargs="+", help="run the sweep over these T instead")
    group.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["smollm2-135m", "llama-3.1-8b"])
    group.add_argument("--method-b-max", type=int, default=0, help="largest T of Method B (0: every T)")
    group.add_argument("--bound-max", type=int, default=0, help="largest T of the entry-by-entry bound (0: every T)")
    group.add_argument("--bound-rows", type=int, default=0, help="decomposition.bound_rows of the bound stage")
    args = parser.parse_args(argv)
    if args.seq_lens:
        swept = {}
        for shape in args.shapes:
            swept[shape] = sweep(
                shape,
                args.seq_lens,
                args.threads,
                args.dummy_distances,
                args.method_b_max,
                args.bound_max,
                args.bound_rows,
            )
            report(shape, swept[shape])
        return swept
    if "decompose" in args.stages and "extract" not in args.stages:
        parser.error("--stages: decompose reads the qk.h5 that extract writes")
    device = resolve_device(args.device).type
    depth = SHAPES[args.shape]["num_hidden_layers"]
    n_layers = args.layers or depth

    stages = run_stages(
        args.shape,
        args.layers,
        args.seq_len,
        args.windows,
        args.threads,
        device,
        args.dtype,
        args.stages,
        args.dummy_distances,
    )
    shape = plan_model.Shape.from_dict({**SHAPES[args.shape], "num_hidden_layers": n_layers})
    cfg = bench_config(args.seq_len, args.windows, args.dummy_distances)
    plan_device = "gpu" if device == "cuda" else "cpu"  # posgen.plan's name for the kind of device
    rates, label = committed_rates(plan_device)
    predicted = predictions(shape, cfg, rates)
    print(
        f"{args.shape}: {n_layers} of {depth} layers, {args.windows} window(s) x {args.seq_len} tokens, "
        f"{device}, {args.dtype}, {args.threads} threads, random weights, {len(args.dummy_distances)} dummy "
        f"distances, error bound on 1 window; predictions from posgen.plan ({label})"
    )
    print(
        f"{'stage':26s} {'s/window':>9s} {'s/layer':>8s} {'x fwd':>6s} {'predicted':>10s} {'meas/pred':>10s} "
        f"{'peak RSS GB':>12s} {'peak GPU GB':>12s} {'bytes/window':>13s}"
    )
    base = stages.get(STAGE_NAMES["forward"], {}).get("seconds", float("nan"))
    for name, stage in stages.items():
        per_layer = stage["seconds"] / n_layers
        written = stage["bytes"] / args.windows
        print(
            f"{name:26s} {stage['seconds']:9.2f} {per_layer:8.3f} {stage['seconds'] / base:6.2f} "
            f"{predicted[name]:10.2f} {stage['seconds'] / predicted[name]:10.2f} "
            f"{stage['peak_rss_gb']:12.2f} {stage['peak_gpu_gb']:12.2f} {written:13.3e}"
        )
        if "per_window" in stage and args.windows > 1:
            print(f"  {'per window':24s} " + " ".join(f"{t:.2f}" for t in stage["per_window"]))
        for part, measured in stage.get("parts", {}).items():
            guess = predicted["parts"][part]
            print(f"  {part:24s} {measured:9.2f} {'':8s} {'':6s} {guess:10.2f} {measured / guess:10.2f}")
    print(f"analytic q/k bytes per window: {shape.qk_bytes(args.seq_len):.3e}")
    if set(STAGE_NAMES.values()) <= set(stages):
        print(f"rates implied by this run (posgen.rates.{plan_device.upper()} holds the ones used):")
        for name, value in implied_rates(shape, cfg, stages, rates).items():
            print(f"  {name:18s} {value:10.3g}")
    if args.paper_config.exists():
        extrapolate(args.paper_config)
    return stages


if __name__ == "__main__":
    main()
