"""Paper-scale shapes on the CPU: a paper model's exact config (posgen.shapes), random weights, truncated to a
few layers, one window of paper length through a plain forward pass, extraction (capture + HDF5) and the
store-then-decompose decomposition.

Each stage runs in its own process, so its peak resident memory is its own; the stages run one after another on
the same window. Per-layer time is the stage time over the layer count; bytes written are the real file sizes,
printed beside the analytic size ``L (H + H_kv) T d 4`` of the stored q/k. The last table extrapolates per-layer
figures to the full paper config (every layer, ``n_samples`` windows, trained + random-init variants).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from posgen.shapes import PAPER_SHAPES, parameter_count, shape_config

VARIANT = "random-seed0"  # built from config.json alone: no weights on disk


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _model_dir(root: Path, shape: str, n_layers: int) -> Path:
    """A checkpoint folder with config, tokenizer and manifest but no weights (random-init variants need none)."""
    from posgen.tiny import _tokenizer

    model_dir = root / shape
    model_dir.mkdir()
    config = shape_config(shape, n_layers)
    config.architectures = [f"{type(config).__name__.removesuffix('Config')}ForCausalLM"]
    config.save_pretrained(model_dir)
    _tokenizer(512).save_pretrained(model_dir)
    manifest = {"source": f"shape:{shape}", "revision": "random-init", "architecture": config.architectures[0]}
    (model_dir / "manifest.json").write_text(json.dumps({**manifest, "files": {}}, indent=2) + "\n")
    return model_dir


def _windows(path: Path, vocab: int, n_windows: int, seq_len: int) -> None:
    import xarray as xr

    from posgen.corpus import write_windows

    ids = np.random.default_rng(0).integers(0, vocab, size=(n_windows, seq_len))
    coords = {"sample": np.arange(n_windows), "token": np.arange(seq_len)}
    write_windows(xr.Dataset({"token_id": (("sample", "token"), ids)}, coords=coords), path)


def _stage_forward(model_dir: str, windows: str, threads: int) -> dict:
    import torch

    from posgen.corpus import read_windows
    from posgen.models import load_model

    torch.set_num_threads(threads)
    model, _, _ = load_model(model_dir, VARIANT, attn_implementation="sdpa")
    ids = torch.from_numpy(read_windows(windows)["token_id"].values)
    positions = torch.arange(ids.shape[1])[None]
    seconds = []
    with torch.inference_mode():
        model.base_model(input_ids=ids[:1, :64], position_ids=positions[:, :64], use_cache=False)  # warm-up
        for row in ids:
            start = time.perf_counter()
            model.base_model(input_ids=row[None], position_ids=positions, use_cache=False)
            seconds.append(time.perf_counter() - start)
    return {"seconds": float(np.median(seconds)), "peak_rss_gb": _peak_rss_gb(), "bytes": 0}


def _stage_extract(model_dir: str, windows: str, threads: int, out: str) -> dict:
    import torch

    from posgen.extract import extract

    torch.set_num_threads(threads)
    report = extract(model_dir, windows, out, model_name="bench", variant=VARIANT, ref_layers=(0, -1))
    seconds = report["seconds_per_window"]
    return {
        # the first window also runs the self-check and opens the file
        "seconds": float(np.median(seconds[1:] if len(seconds) > 1 else seconds)),
        "peak_rss_gb": _peak_rss_gb(),
        "bytes": Path(out).stat().st_size,
    }


def _stage_decompose(qk: str, threads: int, out: str) -> dict:
    import torch

    from posgen.decompose import decompose_store

    torch.set_num_threads(threads)
    start = time.perf_counter()
    ds = decompose_store(qk, out, dummy_distances=[1000], dummy_distance=1000, device="cpu", bound_samples=1)
    return {
        "seconds": (time.perf_counter() - start) / ds.sizes["sample"],
        "peak_rss_gb": _peak_rss_gb(),
        "bytes": Path(out).stat().st_size,
    }


def _in_child(function, *args) -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def qk_bytes(config, n_tokens: int) -> int:
    """Bytes of one window's pre-RoPE q/k of every layer, float32."""
    n_heads = config.num_attention_heads
    n_kv = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    return config.num_hidden_layers * (n_heads + n_kv) * n_tokens * head_dim * 4


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m posgen.bench scale", description=__doc__)
    parser.add_argument("--shape", default="llama-3.1-8b", choices=sorted(PAPER_SHAPES))
    parser.add_argument("--layers", type=int, default=2, help="truncate the model to its first N layers")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--windows", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--paper-windows", type=int, default=32, help="windows per variant in the paper config")
    parser.add_argument("--paper-variants", type=int, default=4, help="trained + random-init seeds")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = _model_dir(root, args.shape, args.layers)
        windows = root / "windows.h5"
        _windows(windows, 512, args.windows, args.seq_len)
        stages = {
            "plain forward": _in_child(_stage_forward, str(model_dir), str(windows), args.threads),
            "extract (capture + HDF5)": _in_child(
                _stage_extract, str(model_dir), str(windows), args.threads, str(root / "qk.h5")
            ),
        }
        stages["decompose (from qk.h5)"] = _in_child(
            _stage_decompose, str(root / "qk.h5"), args.threads, str(root / "decomposition.nc")
        )

    config = shape_config(args.shape, args.layers)
    print(
        f"{args.shape}: {args.layers} of {PAPER_SHAPES[args.shape]['num_hidden_layers']} layers, "
        f"{args.windows} window(s) x {args.seq_len} tokens, {args.threads} threads, random weights"
    )
    print(f"{'stage':26s} {'s/window':>9s} {'s/layer':>8s} {'ratio':>6s} {'peak RSS GB':>12s} {'bytes/window':>13s}")
    base = stages["plain forward"]["seconds"]
    for name, stage in stages.items():
        per_layer = stage["seconds"] / args.layers
        written = stage["bytes"] / args.windows
        print(
            f"{name:26s} {stage['seconds']:9.2f} {per_layer:8.2f} {stage['seconds'] / base:6.2f} "
            f"{stage['peak_rss_gb']:12.2f} {written:13.3e}"
        )
    print(f"analytic q/k bytes per window: {qk_bytes(config, args.seq_len):.3e}")

    print(f"\nextrapolated to the paper config ({args.paper_windows} windows x {args.paper_variants} variants):")
    print(f"{'model':14s} {'params':>7s} {'layers':>6s} {'qk.h5 disk GB':>14s} {'CPU-hours store path':>21s}")
    store_s_per_layer = (
        stages["extract (capture + HDF5)"]["seconds"] + stages["decompose (from qk.h5)"]["seconds"]
    ) / args.layers
    ref_layer_cost = _layer_cost(config, args.seq_len)
    total_gb = total_h = 0.0
    for name in PAPER_SHAPES:
        full = shape_config(name)
        units = args.paper_windows * args.paper_variants
        disk_gb = qk_bytes(full, args.seq_len) * units / 1e9
        # per-layer cost scales with the layer's FLOPs (projections + attention) relative to the measured shape
        hours = store_s_per_layer * _layer_cost(full, args.seq_len) / ref_layer_cost * full.num_hidden_layers
        hours = hours * units / 3600
        total_gb, total_h = total_gb + disk_gb, total_h + hours
        print(
            f"{name:14s} {parameter_count(full) / 1e9:6.2f}B {full.num_hidden_layers:6d} {disk_gb:14.1f} {hours:21.1f}"
        )
    print(f"{'total':14s} {'':7s} {'':6s} {total_gb:14.1f} {total_h:21.1f}")


def _layer_cost(config, n_tokens: int) -> float:
    """FLOPs of one decoder layer on one window: q/k/v/o and MLP projections plus causal attention."""
    n_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    n_kv = config.num_key_value_heads
    projections = config.hidden_size * head_dim * (2 * n_heads + 2 * n_kv) + 3 * config.hidden_size * (
        config.intermediate_size
    )
    attention = 2 * n_heads * head_dim * n_tokens  # per query, causal half of QK^T and AV
    return 2 * n_tokens * (projections + attention)


if __name__ == "__main__":
    main()
