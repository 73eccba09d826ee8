"""Decomposition cost per (sample, layer) against its floor, the bare float32 matrix products it implies.

The floor is, per query head, the (T x d) @ (d x T) products W = q k^T, f for each sink handling (two mean
keys), and g for every dummy distance D of the sweep (g without the sink is g plus a row constant): what a
direct implementation must multiply before it can score anything. The products write into preallocated
outputs, so the floor is pure matrix-multiply time. ``floor_per_sink_g`` also multiplies g for each sink
handling, as a naive implementation would. The decomposition is timed as every sample gets it (all r
statistics, the sweep, Method B) and as the first ``decomposition.bound_samples`` samples get it (plus the
error of A and the section 5 bound, checked entry by entry). All are timed on the same inputs and device in
alternating rounds (medians reported), so machine noise hits them alike. Without ``--qk`` a synthetic store of
the default config's shape (1 sample x 1 layer, T = 1200, 9 heads, 3 KV heads, head_dim 64; see the shape
options) is written first and read back.

Each step of the decomposition is timed as well (posgen.bench.steps: operands, moments, Method A, Method B's
solve, the error and bound, the check, and the rest of ``Decomposer.unit``; the first call apart), in seconds and as a ratio to the floor, and printed side by side on stderr, so that a
regression in any one step shows even when the total hides it. On a GPU the step clocks synchronise the device
at every step boundary.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from posgen.bench.steps import STEPS, StepTimer
from posgen.decomposition import SINKS, Decomposer, DecompositionOptions, decompose_store
from posgen.rope import rotate
from posgen.rope_table import RopeTable
from posgen.store import QKLayout, QKWriter, open_dataset, read_rope


def synthetic_store(
    path,
    *,
    n_samples=1,
    n_layers=1,
    n_tokens=1200,
    n_heads=9,
    n_kv_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    sliding_window=0,
    seed=0,
    compression=1,
) -> Path:
    """A qk.h5 of random pre-RoPE q/k with a shared (mean) component, as real keys have."""
    rng = np.random.default_rng(seed)
    half = head_dim // 2
    inv_freq = (rope_theta ** (-np.arange(half) / half)).astype(np.float32)
    layout = QKLayout(
        samples=range(n_samples),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        n_tokens=n_tokens,
        head_dim=head_dim,
        ref_samples=[0],
        ref_layers=[0],
        compression=compression,
    )
    rope = RopeTable(
        inv_freq=np.tile(inv_freq, (n_layers, 1)),
        attention_scaling=np.ones(n_layers),
        scaling=np.full(n_layers, head_dim**-0.5),
        sliding_window=np.full(n_layers, sliding_window),
        kv_group=np.arange(n_heads) // (n_heads // n_kv_heads),
    )
    attrs = {"model": "synthetic", "variant": "trained", "init_seed": -1}
    with QKWriter(path, layout, rope=rope, attrs=attrs) as writer:
        for s in range(n_samples):
            q = rng.standard_normal((n_layers, n_heads, n_tokens, head_dim)) + rng.standard_normal(head_dim)
            k = rng.standard_normal((n_layers, n_kv_heads, n_tokens, head_dim)) + 2 * rng.standard_normal(head_dim)
            writer.write_sample(
                s,
                q.astype(np.float32),
                k.astype(np.float32),
                np.zeros(n_tokens, np.int64),
                np.zeros((1, n_heads, n_tokens, n_tokens), np.float32),
            )
    return Path(path)


def floor_inputs(dec: Decomposer, q, k, kv_group, rope):
    """Rotated operands of the floor's products and their outputs, prepared outside the timed region."""
    dev = dec.device
    q, k = torch.as_tensor(q, device=dev), torch.as_tensor(k, device=dev)
    T, d = q.shape[-2:]
    pos = torch.arange(T, device=dev)
    theta, amp = torch.as_tensor(rope.inv_freq).to(dev), rope.attention_scaling
    groups = []
    for g in np.unique(kv_group):
        qg = q[torch.as_tensor(np.flatnonzero(kv_group == g), device=dev)]
        kg = k[int(g)]
        kbars = [kg.mean(0), kg[1:].mean(0)]
        groups.append(
            {  # query heads of a KV head stacked into one (h T) x d operand
                "q_rot": rotate(qg, pos, theta, amp).reshape(-1, d),
                "k_rot_t": rotate(kg, pos, theta, amp).T.contiguous(),
                "kbar_rot_t": [rotate(kb.expand(T, d), pos, theta, amp).T.contiguous() for kb in kbars],
                "p": [rotate(qg, torch.tensor(D), theta, amp).reshape(-1, d) for D in dec.dummy_distances],
                "dk_t": [((kg - kb) * amp).T.contiguous() for kb in kbars],
                "out": torch.empty(qg.shape[0] * T, T, device=dev),
            }
        )
    return groups


def floor(groups, per_sink_g: bool = False) -> None:
    for g in groups:
        out = g["out"]
        torch.mm(g["q_rot"], g["k_rot_t"], out=out)
        for kb in g["kbar_rot_t"]:
            torch.mm(g["q_rot"], kb, out=out)
        for p in g["p"]:
            for dk in g["dk_t"][: 2 if per_sink_g else 1]:
                torch.mm(p, dk, out=out)


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, dev) -> float:
    _sync(dev)
    start = time.perf_counter()
    fn()
    _sync(dev)
    return time.perf_counter() - start


def _run_steps(timer: StepTimer, fn, dev) -> tuple[float, dict]:
    """Seconds of ``fn()`` and of each step inside it; ``rest``: what no step accounts for."""
    timer.reset()
    with timer:
        total = _timed(fn, dev)
    steps = timer.steps()
    steps["rest"] = total - sum(steps.values())
    return total, steps


def step_table(first: dict, unit: dict, bound: dict, floor_s: float) -> str:
    """Seconds per step, side by side: the first call (the bound tables built), every sample, with the bound."""
    lines = [f"{'step':10s} {'first call':>11s} {'every sample':>13s} {'ratio':>6s} {'with bound':>11s} {'ratio':>6s}"]
    for step in [*STEPS, "rest", "total"]:
        u, b = unit[step], bound[step]
        lines.append(f"{step:10s} {first[step]:11.5f} {u:13.5f} {u / floor_s:6.2f} {b:11.5f} {b / floor_s:6.2f}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m posgen.bench decompose", description=__doc__)
    parser.add_argument("--qk", help="an existing qk.h5 (default: a synthetic one of the default config's shape)")
    parser.add_argument("--sample", type=int, default=0)
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--precision", default="float32", choices=["float32", "float64"], help="decomposition.precision"
    )
    parser.add_argument(
        "--dummy-distances",
        type=int,
        nargs="+",
        default=[0, 250, 500, 1000, 2000],
        help="decomposition.dummy_distances, the sweep of the dummy distance D",
    )
    parser.add_argument(
        "--dummy-distance", type=int, default=1000, help="decomposition.dummy_distance, Method A's dummy distance D"
    )
    parser.add_argument(
        "--store-run",
        action="store_true",
        help="also run decompose_store over the whole store (time per unit, peak memory)",
    )
    parser.add_argument(
        "--bound-samples",
        type=int,
        default=2,
        help="decomposition.bound_samples for --store-run (default: the default config's)",
    )
    shape = parser.add_argument_group("synthetic store shape")
    shape.add_argument("--samples", type=int, default=1)
    shape.add_argument("--layers", type=int, default=1)
    shape.add_argument("--tokens", type=int, default=1200)
    shape.add_argument("--heads", type=int, default=9)
    shape.add_argument("--kv-heads", type=int, default=3)
    shape.add_argument("--head-dim", type=int, default=64)
    shape.add_argument("--rope-theta", type=float, default=100000.0)
    shape.add_argument("--sliding-window", type=int, default=0, help="tokens a query sees (0: every earlier one)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        qk = (
            Path(args.qk)
            if args.qk
            else synthetic_store(
                Path(tmp) / "qk.h5",
                n_samples=args.samples,
                n_layers=args.layers,
                n_tokens=args.tokens,
                n_heads=args.heads,
                n_kv_heads=args.kv_heads,
                head_dim=args.head_dim,
                rope_theta=args.rope_theta,
                sliding_window=args.sliding_window,
            )
        )
        ds = open_dataset(qk, lazy=False)
        start = time.perf_counter()
        q = ds["q"].isel(sample=args.sample, layer=args.layer).values
        k = ds["k"].isel(sample=args.sample, layer=args.layer).values
        read_s = time.perf_counter() - start
        table = read_rope(ds)
        kv_group, rope = table.kv_group, table.layer(args.layer)
        ds.close()

        dec = Decomposer(args.dummy_distances, args.dummy_distance, device=args.device, precision=args.precision)
        dev = dec.device
        timer = StepTimer(sync=lambda: _sync(dev))
        # first call: the bound tables, cached afterwards
        setup_s, first_steps = _run_steps(timer, lambda: dec.unit(q, k, kv_group, rope), dev)
        groups = floor_inputs(dec, q, k, kv_group, rope)
        floor(groups)
        t_floor, t_naive, t_unit, t_bound = [], [], [], []
        s_unit, s_bound = [], []  # seconds per step, per round
        for _ in range(args.rounds):
            t_floor.append(_timed(lambda: floor(groups), dev))
            t_naive.append(_timed(lambda: floor(groups, per_sink_g=True), dev))
            total, steps = _run_steps(timer, lambda: dec.unit(q, k, kv_group, rope, with_bound=False), dev)
            t_unit.append(total)
            s_unit.append(steps)
            total, steps = _run_steps(timer, lambda: dec.unit(q, k, kv_group, rope), dev)
            t_bound.append(total)
            s_bound.append(steps)
        base = statistics.median(t_floor)
        unit, bound = statistics.median(t_unit), statistics.median(t_bound)
        report = {
            "device": str(dev),
            "precision": args.precision,
            "torch_threads": torch.get_num_threads(),
            "shape": {
                "heads": int(q.shape[0]),
                "kv_heads": int(k.shape[0]),
                "tokens": int(q.shape[1]),
                "head_dim": int(q.shape[2]),
            },
            "dummy_distances": args.dummy_distances,
            "floor_matmuls_per_head": 1 + len(SINKS) + len(args.dummy_distances),
            "floor_per_sink_g_matmuls_per_head": 1 + len(SINKS) * (1 + len(args.dummy_distances)),
            "read_s": round(read_s, 4),
            "first_call_s": round(setup_s, 4),
            "floor_s": round(base, 5),
            "floor_per_sink_g_s": round(statistics.median(t_naive), 5),
            # every sample: all r statistics, the D sweep, Method B
            "decomposition_s": round(unit, 5),
            "ratio": round(unit / base, 2),
            # the first decomposition.bound_samples samples: plus the error of A and the bound, entry by entry
            "decomposition_with_bound_s": round(bound, 5),
            "ratio_with_bound": round(bound / base, 2),
            "target_ratio": 3.0,
            "lstsq_residual_max": dec.max_residual,
        }
        # each step's median over the rounds, so that a regression in one step shows beside the total
        first = {**first_steps, "total": setup_s}
        unit_steps = {step: statistics.median(r[step] for r in s_unit) for step in s_unit[0]}
        bound_steps = {step: statistics.median(r[step] for r in s_bound) for step in s_bound[0]}
        unit_steps["total"], bound_steps["total"] = unit, bound
        report["steps"] = {
            step: {
                "first_call_s": round(first[step], 5),
                "s": round(unit_steps[step], 5),
                "ratio": round(unit_steps[step] / base, 3),
                "with_bound_s": round(bound_steps[step], 5),
                "ratio_with_bound": round(bound_steps[step] / base, 3),
            }
            for step in first
        }
        print(step_table(first, unit_steps, bound_steps, base), file=sys.stderr)
        if args.store_run:
            start = time.perf_counter()
            options = DecompositionOptions.defaults(
                dummy_distances=args.dummy_distances,
                dummy_distance=args.dummy_distance,
                bound_samples=args.bound_samples,
                precision=args.precision,
                device=args.device,
            )
            out = decompose_store(qk, Path(tmp) / "decomposition.nc", options, progress=False)
            per_unit = (time.perf_counter() - start) / (out.sizes["sample"] * out.sizes["layer"])
            report["store_run"] = {
                "bound_samples": args.bound_samples,
                "s_per_unit": round(per_unit, 4),
                "ratio": round(per_unit / base, 2),
            }
        report["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
        if dev.type == "cuda":
            report["peak_cuda_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    print(json.dumps(report, indent=1))
    return report
