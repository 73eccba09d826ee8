"""Random-init weights of a paper shape: ``posgen.models.init_weights`` against a floor and the old path.

Floor: one bare ``torch.empty(n).normal_()`` of the model's parameter count, same dtype and device (the least any
init can cost: one draw per element). New: ``init_weights`` (meta-device structure, each tensor drawn once on
the device). Old: ``torch.manual_seed`` then ``AutoModelForCausalLM.from_config``, what ``init_weights`` was
before (torch's kaiming init of every linear layer, then transformers' normal init over it, on the host).
The three run in alternating rounds in one process (the old path for ``--old-rounds`` rounds only: it is slow),
medians compared, so host noise hits them alike. Prints seconds per billion parameters and the ratios
new / floor (target <= 2) and old / new (target >= 5).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _timed(function, device) -> float:
    import torch

    start = time.perf_counter()
    result = function()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    del result
    return seconds


def measure(shape: str, layers: int, dtype: str, device: str, rounds: int, old_rounds: int) -> dict:
    """Seconds per billion parameters of the floor, the new and the old init (medians over rounds)."""
    import torch
    from transformers import AutoModelForCausalLM

    from posgen.device import resolve_device
    from posgen.models import init_weights
    from posgen.shapes import parameter_count, shape_config

    dev = resolve_device(device)
    config = shape_config(shape, layers)
    n = parameter_count(config)
    kind = getattr(torch, dtype)

    def floor():
        return torch.empty(n, dtype=kind, device=dev).normal_(0.0, 0.02)

    def new():
        return init_weights(config, 0, dev, dtype=kind)

    def old():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, dtype=kind).to(dev)

    times = {"floor": [], "new": [], "old": []}
    for round_ in range(rounds):
        times["floor"].append(_timed(floor, dev))
        times["new"].append(_timed(new, dev))
        if round_ < old_rounds:
            times["old"].append(_timed(old, dev))
    per_billion = {k: statistics.median(v) / (n / 1e9) for k, v in times.items() if v}
    result = {
        "shape": shape,
        "layers": layers,
        "parameters": n,
        "dtype": dtype,
        "device": str(dev),
        "threads": torch.get_num_threads(),
        "rounds": {k: len(v) for k, v in times.items()},
        **{f"{k}_s_per_billion": v for k, v in per_billion.items()},
        "new_over_floor": per_billion["new"] / per_billion["floor"],
    }
    if "old" in per_billion:
        result["old_over_new"] = per_billion["old"] / per_billion["new"]
    return result


def main(argv=None):
    import torch

    parser = argparse.ArgumentParser(prog="python -m posgen.bench init", description=__doc__)
    parser.add_argument("--shape", default="llama-3.1-8b", help="a recorded shape (posgen.shapes)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers kept (default 2)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--old-rounds", type=int, default=1, help="rounds of the old path (0: skip it)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure(args.shape, args.layers, args.dtype, args.device, args.rounds, args.old_rounds)
    print(json.dumps(result, indent=1))
    line = (
        f"{args.shape} x {args.layers} layers, {result['parameters'] / 1e9:.2f} B parameters, {args.dtype} on "
        f"{result['device']}: floor {result['floor_s_per_billion']:.2f} s/B, init_weights "
        f"{result['new_s_per_billion']:.2f} s/B ({result['new_over_floor']:.2f}x the floor, target <= 2)"
    )
    if "old_over_new" in result:
        line += (
            f", from_config {result['old_s_per_billion']:.1f} s/B ({result['old_over_new']:.1f}x slower, target >= 5)"
        )
    print(line)
    return result
