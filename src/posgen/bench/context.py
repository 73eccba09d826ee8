"""Scaling with the window length T: ``python -m posgen.bench scale --seq-lens 1024 2048 ...``.

One layer of a paper shape (posgen.shapes, random weights), one window per T. Per T, each stage runs in its own
process, so that its peak resident memory is its own:

- ``forward``: the plain forward pass (the model's own attention kernel);
- ``capture``: the forward pass through the capturing backend, which also writes the layer's q/k for the rest;
- ``load``: reading those q/k and nothing else, the baseline of the analysis stages' memory;
- ``moments``: the rotations, Method A's and A-drift's sums, and the position shares (Decomposer steps
  ``operands``, ``moments``, ``position_shares``; the r from the sums are ``correlations``, a few small
  operations after Method B);
- ``method_b``: Method B's sums and fit (matrix-free conjugate gradients), up to ``--method-b-max``;
- ``bound``: the error of A and the section 5 bound, entry by entry, up to ``--bound-max`` (over about
  ``--bound-rows`` query rows, ``decomposition.bound_rows``; 0: every row).

The table gives seconds and the peak memory over the ``load`` baseline per stage, the analysis (moments, Method
B's fit, bound) over the forward pass, and the least-squares exponent of each column against T.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from posgen.allocator import keep_freed_memory
from posgen.shapes import shape_config

ANALYSIS = ("moments", "method_b", "bound")  # the stages of the analysis of one window


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _timed_pass(model, seq_len: int, before=None) -> float:
    """Seconds of a forward pass over ``seq_len`` random tokens, after a short pass of the same kind (allocator,
    thread pool); ``before(n)`` runs ahead of each pass and inside the time (a capture's reset)."""
    import torch

    ids = torch.randint(0, 512, (1, seq_len), generator=torch.Generator().manual_seed(0))
    for n in (min(64, seq_len), seq_len):  # the warm-up, then the timed pass
        start = time.perf_counter()
        if before is not None:
            before(n)
        model.base_model(input_ids=ids[:, :n], position_ids=torch.arange(n)[None], use_cache=False)
    return time.perf_counter() - start


def _forward(model_dir: str, seq_len: int, threads: int) -> dict:
    import torch

    from posgen.llm.families import plain_backend
    from posgen.models import load_model

    torch.set_num_threads(threads)
    model, _, _ = load_model(model_dir, "random-seed0", attn_implementation=plain_backend)
    with torch.inference_mode():
        seconds = _timed_pass(model, seq_len)
    return {"seconds": seconds, "peak_gb": _peak_gb()}


def _capture(model_dir: str, seq_len: int, threads: int, out: str) -> dict:
    import torch

    from posgen.llm.capture import Capture, load_capturing

    torch.set_num_threads(threads)
    model, _, _ = load_capturing(model_dir, "random-seed0")
    capture = Capture(model)
    with torch.inference_mode(), capture:
        seconds = _timed_pass(model, seq_len, capture.reset)
        start = time.perf_counter()
        q, k = capture.stacked()
        seconds += time.perf_counter() - start
        table = capture.rope()
    rope = table.layer(0)
    np.savez(out, q=q[0], k=k[0], kv_group=table.kv_group, inv_freq=np.asarray(rope.inv_freq))
    return {"seconds": seconds, "peak_gb": _peak_gb(), "scaling": rope.scaling, "amp": rope.attention_scaling}


def _analysis(
    stage: str, qk: str, scaling: float, amp: float, threads: int, dummy_distances: list, bound_rows: int
) -> dict:
    import torch

    from posgen.decomposition import Decomposer
    from posgen.rope_table import LayerRope

    torch.set_num_threads(threads)
    data = np.load(qk)
    q, k, kv = data["q"], data["k"], data["kv_group"]
    rope = LayerRope(data["inv_freq"], scaling, amp)
    dec = Decomposer(dummy_distances, 1000, device="cpu", bound_rows=bound_rows)
    out = {}
    if stage != "load":
        Decomposer(dummy_distances, 1000, device="cpu").unit(q[:, :64], k[:, :64], kv, rope)  # warm-up
        start = time.perf_counter()
        ops = dec.operands(q, k, kv, rope)
        if stage == "method_b":
            moments = dec.moments(ops)  # Method B reads Method A's sums of W
            start = time.perf_counter()
            dec.method_b(ops, moments)
        elif stage == "moments":
            dec.moments(ops)
            dec.position_shares(ops)
        else:
            dec.error_and_bound(ops)
        out["seconds"] = time.perf_counter() - start
    return {**out, "peak_gb": _peak_gb()}


def shape_model_dir(root: Path, shape: str, n_layers: int | None) -> Path:
    """A checkpoint folder with config, tokenizer and manifest but no weights (random-init variants need none);
    ``n_layers`` None keeps the full depth."""
    from posgen.testing.tiny import corpus_tokenizer

    model_dir = root / shape
    model_dir.mkdir()
    config = shape_config(shape, n_layers)
    config.architectures = [f"{type(config).__name__.removesuffix('Config')}ForCausalLM"]
    config.save_pretrained(model_dir)
    corpus_tokenizer(512).save_pretrained(model_dir)
    manifest = {"source": f"shape:{shape}", "revision": "random-init", "architecture": config.architectures[0]}
    (model_dir / "manifest.json").write_text(json.dumps({**manifest, "files": {}}, indent=2) + "\n")
    return model_dir


def in_child(function, *args, timeout: float | None = None) -> dict:
    """``function(*args)`` in a fresh process (spawned: nothing inherited), so that its peak memory is its own.
    Past ``timeout`` seconds the process is killed and the answer is ``{"timed_out": timeout}``."""
    with multiprocessing.get_context("spawn").Pool(1, initializer=keep_freed_memory) as pool:
        pending = pool.apply_async(function, args)
        try:
            return pending.get(timeout)
        except multiprocessing.TimeoutError:
            pool.terminate()
            return {"timed_out": timeout}


def exponent(seq_lens, values) -> float:
    """Least-squares slope of log(value) against log(T) over the finite, positive values (NaN under two)."""
    pairs = [(math.log(t), math.log(v)) for t, v in zip(seq_lens, values) if v == v and v > 0]
    if len(pairs) < 2:
        return float("nan")
    x, y = np.array(pairs).T
    return float(np.polyfit(x, y, 1)[0])


def sweep(
    shape: str, seq_lens, threads: int, dummy_distances, method_b_max: int, bound_max: int, bound_rows: int = 0
) -> dict:
    """{T: {stage: {"seconds", "extra_gb", ...}}} for one layer of ``shape``."""
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(shape_model_dir(Path(tmp), shape, 1))
        for T in seq_lens:
            qk = str(Path(tmp) / f"qk{T}.npz")
            row = {"forward": in_child(_forward, model_dir, T, threads)}
            row["capture"] = in_child(_capture, model_dir, T, threads, qk)
            scaling, amp = row["capture"].pop("scaling"), row["capture"].pop("amp")
            common = (qk, scaling, amp, threads, dummy_distances, bound_rows)
            base = in_child(_analysis, "load", *common)["peak_gb"]
            for stage, limit in (("moments", 0), ("method_b", method_b_max), ("bound", bound_max)):
                if not limit or T <= limit:
                    row[stage] = in_child(_analysis, stage, *common)
                    row[stage]["extra_gb"] = row[stage]["peak_gb"] - base
            rows[T] = row
            print(f"  T={T}: " + ", ".join(f"{s} {v['seconds']:.2f} s" for s, v in row.items()), flush=True)
    return rows


def report(shape: str, rows: dict) -> None:
    """The table of one shape's sweep, with the exponents of every column."""
    seq_lens = sorted(rows)

    def col(stage, key):
        return [rows[T].get(stage, {}).get(key, float("nan")) for T in seq_lens]

    columns = {
        "forward s": col("forward", "seconds"),
        "capture s": col("capture", "seconds"),
        "moments s": col("moments", "seconds"),
        "method_b s": col("method_b", "seconds"),
        "bound s": col("bound", "seconds"),
        "moments +GB": col("moments", "extra_gb"),
        "method_b +GB": col("method_b", "extra_gb"),
        "bound +GB": col("bound", "extra_gb"),
        "forward GB": col("forward", "peak_gb"),
    }
    analysis = [
        sum(rows[T][s]["seconds"] for s in ANALYSIS if s in rows[T]) / rows[T]["forward"]["seconds"] for T in seq_lens
    ]
    print(f"\n{shape}, one layer, random weights; seconds per window, memory over the q/k baseline")
    print(f"{'T':>7s} " + " ".join(f"{name:>12s}" for name in columns) + f" {'analysis/fwd':>13s}")
    for i, T in enumerate(seq_lens):
        print(f"{T:7d} " + " ".join(f"{v[i]:12.4g}" for v in columns.values()) + f" {analysis[i]:13.3f}")
    print(f"{'exponent':>7s} " + " ".join(f"{exponent(seq_lens, v):12.2f}" for v in columns.values()))
    print("(analysis/fwd: moments + Method B's fit + bound over the forward pass, the stages measured at that T)")
