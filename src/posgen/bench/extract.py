"""Capture overhead: plain forward vs capture (no HDF5) vs full extraction (with HDF5) vs the fused extraction
(capture + decomposition + band statistics in memory, docs/method.md "Fused and store paths") vs the store path
(extraction, then the decompose and bands jobs reading qk.h5), same model and windows. The content digests the
writer computes per (sample, layer) block of q and k (posgen.integrity) are timed on the same stored arrays and
reported as a share of the capture + HDF5 path.

Each configuration runs over the same windows, in alternating rounds so that machine noise hits all of them;
the median seconds per window of each is reported with the ratios to the plain forward pass. The analysis uses
the decomposition settings of the workflow's config.yaml (dummy distances, bound samples).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import torch

from posgen.config import load
from posgen.corpus import cut_windows, load_text
from posgen.decomposition import DecompositionOptions, decompose_store
from posgen.integrity import digest
from posgen.llm.bands import band_stats
from posgen.llm.capture import Capture, load_capturing
from posgen.llm.extract import extract, verify_logits
from posgen.llm.families import plain_backend
from posgen.llm.fused import Analysis
from posgen.llm.options import ExtractOptions
from posgen.llm.run import ModelRun
from posgen.models import acquire, load_model
from posgen.store import open_dataset, write_netcdf


def _plain(model, windows):
    times = []
    positions = torch.arange(windows.shape[1])[None]
    with torch.inference_mode():
        for row in windows:
            start = time.perf_counter()
            model.base_model(input_ids=torch.from_numpy(row)[None], position_ids=positions, use_cache=False)
            times.append(time.perf_counter() - start)
    return times


def _capture(model, windows, ref_layers):
    times = []
    positions = torch.arange(windows.shape[1])[None]
    capture = Capture(model, ref_layers)
    with torch.inference_mode(), capture:
        for i, row in enumerate(windows):
            start = time.perf_counter()
            capture.reset(windows.shape[1], keep_logits=i == 0)
            model.base_model(input_ids=torch.from_numpy(row)[None], position_ids=positions, use_cache=False)
            q, k = capture.stacked()
            if i == 0:
                params = capture.rope()
                refs = {layer % capture.n_layers: capture.logits[layer % capture.n_layers][0] for layer in ref_layers}
                verify_logits(q, k, params, refs, 1e-4)
            times.append(time.perf_counter() - start)
    return times


def _digests(qk_path) -> list[float]:
    """Seconds per window of the digests QKWriter computes while writing: one per (layer) block of q and of k."""
    times = []
    with open_dataset(qk_path, lazy=False) as ds:
        for sample in range(ds.sizes["sample"]):
            blocks = [ds[name].isel(sample=sample).values for name in ("q", "k")]  # (layer, ...) each, as stored
            start = time.perf_counter()
            for x in blocks:
                [digest(block) for block in x]
            times.append(time.perf_counter() - start)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m posgen.bench extract", description=__doc__)
    parser.add_argument("--model-dir", default="resources/models/smollm2-135m")
    parser.add_argument("--source", default="embedded:smollm2-135m", help="acquired into --model-dir if missing")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--configfile", type=Path, default=Path(__file__).resolve().parents[3] / "config.yaml")
    args = parser.parse_args(argv)
    # the error and bound on the first window, as the default config's bound_samples does on its first ones
    settings = dataclasses.replace(
        DecompositionOptions.of(load(args.configfile)["decomposition"], device="cpu"), bound_samples=1
    )

    model_dir = Path(args.model_dir)
    if not (model_dir / "manifest.json").exists():
        acquire(args.source, model_dir)
    plain, tokenizer, _ = load_model(model_dir, attn_implementation=plain_backend)
    captured, _, _ = load_capturing(model_dir)
    windows = cut_windows(load_text("embedded"), tokenizer, args.windows, args.seq_len, 0, "embedded")
    ids = windows["token_id"].values
    results = {
        "plain forward": [],
        "capture, no HDF5": [],
        "capture + HDF5 (gzip 1)": [],
        "capture + HDF5 (no gzip)": [],
        "fused (keep_qk 0)": [],
        "store: + decompose + bands": [],
        "digests of q/k (in the above)": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        windows_path = Path(tmp) / "windows.h5"

        def job(out):
            return ModelRun(
                model_dir, windows_path, out, model="bench", variant="trained", dtype="float32", device="cpu"
            )

        write_netcdf(windows, windows_path)
        _plain(plain, ids[:1])  # warm-up (allocator, thread pool)
        for _ in range(args.rounds):
            results["plain forward"] += _plain(plain, ids)
            results["capture, no HDF5"] += _capture(captured, ids, [0, -1])
            for level, name in [(1, "capture + HDF5 (gzip 1)"), (0, "capture + HDF5 (no gzip)")]:
                report = extract(job(Path(tmp) / "qk.h5"), ExtractOptions.defaults(compression=level))
                results[name] += report["seconds_per_window"]
            # the store path: the no-gzip extraction's windows plus the two jobs reading its qk.h5, per window
            start = time.perf_counter()
            decompose_store(Path(tmp) / "qk.h5", Path(tmp) / "dec.nc", settings, progress=False)
            band_stats(Path(tmp) / "qk.h5", Path(tmp) / "bands.nc", progress=False)
            per_window = (time.perf_counter() - start) / len(ids)
            results["store: + decompose + bands"] += [t + per_window for t in report["seconds_per_window"]]
            results["digests of q/k (in the above)"] += _digests(Path(tmp) / "qk.h5")
            analysis = Analysis(
                settings, decomposition_path=Path(tmp) / "fused-dec.nc", bands_path=Path(tmp) / "fused-bands.nc"
            )
            report = extract(job(Path(tmp) / "fused-qk.h5"), ExtractOptions.defaults(keep_qk=0), analysis=analysis)
            results["fused (keep_qk 0)"] += report["seconds_per_window"]
    base = statistics.median(results["plain forward"])
    print(
        f"model {model_dir.name}, {args.windows} windows x {args.seq_len} tokens, {args.rounds} rounds, "
        f"torch threads {torch.get_num_threads()}"
    )
    for name, times in results.items():
        med = statistics.median(times)
        print(f"{name:28s} {med:8.3f} s/window   ratio {med / base:5.2f}x")
    share = statistics.median(results["digests of q/k (in the above)"]) / statistics.median(
        results["capture + HDF5 (no gzip)"]
    )
    print(f"the digests are {100 * share:.1f} % of capture + HDF5 (no gzip)")


if __name__ == "__main__":
    main()
