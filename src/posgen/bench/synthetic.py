"""Training throughput of the synthetic-family classifier against a plain torch loop of the same shapes.

Ours: ``posgen.synthetic.train.train`` for one epoch (batching, LR schedule, progress bar, the per-epoch test
accuracy on one batch) on the task generated from the config's sizes. Plain: the same encoder written inline
(embedding, pre-LN layers with fused QKV projection, RoPE inline when the PE is rope, SDPA with the padding mask,
ReLU FFN, masked mean pooling, linear head) and a bare AdamW forward/backward loop over the same batches. Both run
in alternating rounds on the same device (medians), so machine noise hits them alike. Prints samples/s of each
and the ratio ours / plain time (target <= 1.3).

In the same rounds: ``--members`` seeds trained one after another against the same seeds as one batched
ensemble (``train_ensemble``; samples/s counts every member's samples; target >= 2x), and one classifier in
bfloat16 autocast beside float32 (``--precision``), and one classifier with SDPA throughout beside ours, which
writes attention out when dropout is on on a CPU (``posgen.synthetic.model.written_out_attention``; the same bits;
only with ``--dropout`` above 0: without dropout both call SDPA).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from posgen.config import SCHEMA, validate
from posgen.device import resolve_device
from posgen.experiments import TrainOptions
from posgen.synthetic.model import build
from posgen.synthetic.pe import Rotary
from posgen.synthetic.tasks import TEST, TRAIN, make_task
from posgen.synthetic.train import load_split, model_config, train, train_ensemble


def synthetic_options(synthetic: dict | None = None) -> dict:
    """The validated ``synthetic`` section of a config holding only ``synthetic`` (None: the schema defaults)."""
    minimal = {
        "models": [{"name": "x", "source": "embedded:smollm2-135m"}],
        "corpus": {"source": "embedded"},
        "n_samples": 8,
        "seq_len": 1200,
    }
    return validate({**minimal, **({"synthetic": synthetic} if synthetic else {})}, SCHEMA)["synthetic"]


def one_epoch(train_options: dict) -> dict:
    """The training keywords of one epoch under an experiment's ``train`` options."""
    keys = ("batch_size", "lr", "weight_decay", "warmup_fraction", "betas")
    return {"epochs": 1, **{key: train_options[key] for key in keys}}


class PlainEncoder(nn.Module):
    def __init__(self, vocab_size, n_classes, max_len, n_layers, n_heads, d_model, d_ff, rope: bool):
        super().__init__()
        self.n_heads, self.rope = n_heads, rope
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                {
                    "norm1": nn.LayerNorm(d_model),
                    "qkv": nn.Linear(d_model, 3 * d_model),
                    "out": nn.Linear(d_model, d_model),
                    "norm2": nn.LayerNorm(d_model),
                    "up": nn.Linear(d_model, d_ff),
                    "down": nn.Linear(d_ff, d_model),
                }
            )
            for _ in range(n_layers)
        )
        self.rotary = Rotary(d_model // n_heads, max_len, 10000.0)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, tokens):
        B, T = tokens.shape
        real = tokens != 0  # (B, T)
        mask = torch.zeros(B, 1, 1, T, device=tokens.device).masked_fill(~real[:, None, None], float("-inf"))
        h = self.embedding(tokens)  # (B, T, D)
        for layer in self.layers:
            q, k, v = layer["qkv"](layer["norm1"](h)).view(B, T, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
            if self.rope:
                q, k = self.rotary(q), self.rotary(k)
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, d)
            h = h + layer["out"](att.transpose(1, 2).reshape(B, T, -1))
            h = h + layer["down"](F.relu(layer["up"](layer["norm2"](h))))
        h = self.norm(h)
        weight = real.to(h.dtype)[..., None]
        return self.head((h * weight).sum(1) / weight.sum(1))


def plain_epoch(model, optimizer, tokens, labels, batch_size, generator):
    perm = torch.randperm(len(labels), generator=generator).to(tokens.device)
    for first in range(0, len(labels), batch_size):
        idx = perm[first : first + batch_size]
        x = tokens[idx]
        used = int((x != 0).any(0).nonzero().max()) + 1
        loss = F.cross_entropy(model(x[:, :used]), labels[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None):
    import yaml

    parser = argparse.ArgumentParser(prog="python -m posgen.bench synthetic", description=__doc__)
    parser.add_argument(
        "--config", default=None, help="config file whose synthetic sizes to use (default: schema defaults)"
    )
    parser.add_argument("--task", default="distance", choices=["distance", "count"])
    parser.add_argument("--pe", default="rope", choices=["nope", "rope"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--members", type=int, default=3, help="seeds of the ensemble row (0: skip it)")
    parser.add_argument("--precision", default="bfloat16", choices=["bfloat16", "tf32", "none"])
    parser.add_argument("--dropout", type=float, default=None, help="override the config's dropout")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    device = resolve_device(args.device)
    config = yaml.safe_load(open(args.config)) if args.config else {}
    options = synthetic_options(config.get("synthetic"))
    data = make_task(args.task, options, 0)
    train_set, test_set = load_split(data, TRAIN, device), load_split(data, TEST, device)
    t = options["train"]
    test_set = tuple(x[: t["batch_size"]] for x in test_set)
    cfg = model_config(TrainOptions.of_experiment(options), data, args.pe)
    n = len(train_set[1])
    dropout = 0.0 if args.dropout is None else args.dropout
    schedule = one_epoch(t)

    def fresh(seed):
        torch.manual_seed(seed)
        return build({**cfg, "dropout": dropout}).to(device)

    def timed(function):
        _sync(device)
        start = time.perf_counter()
        function()
        _sync(device)
        return time.perf_counter() - start

    def ours(precision="float32", attention="auto"):
        model = fresh(0).use_attention(attention)
        return timed(lambda: train(model, train_set, test_set, seed=0, desc="ours", precision=precision, **schedule))

    def sequential():
        models = [fresh(seed) for seed in range(args.members)]
        return timed(
            lambda: [train(m, train_set, test_set, seed=s, desc="one", **schedule) for s, m in enumerate(models)]
        )

    def ensemble():
        models = [fresh(seed) for seed in range(args.members)]
        seeds = list(range(args.members))
        return timed(lambda: train_ensemble(models, seeds, train_set, test_set, desc="ensemble", **schedule))

    def plain():
        torch.manual_seed(0)
        model = PlainEncoder(
            cfg["vocab_size"],
            cfg["n_classes"],
            cfg["max_len"],
            cfg["n_layers"],
            cfg["n_heads"],
            cfg["d_model"],
            cfg["d_ff"],
            rope=args.pe == "rope",
        ).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=t["lr"], weight_decay=t["weight_decay"])
        _sync(device)
        start = time.perf_counter()
        plain_epoch(model, optimizer, *train_set, t["batch_size"], torch.Generator().manual_seed(0))
        _sync(device)
        return time.perf_counter() - start

    arms = {"ours": ours, "plain": plain}
    if dropout > 0:  # without dropout ours calls SDPA too: nothing to compare
        arms["sdpa"] = lambda: ours(attention="sdpa")
    if args.members:
        arms |= {"sequential": sequential, "ensemble": ensemble}
    if args.precision != "none":
        arms["mixed"] = lambda: ours(args.precision)
    times = {name: [] for name in arms}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for name, arm in arms.items():
            seconds = arm()
            if round_:
                times[name].append(seconds)
    result = {
        "task": args.task,
        "pe": args.pe,
        "device": str(device),
        "threads": args.threads,
        "train_samples": n,
        "batch_size": t["batch_size"],
        "max_len": cfg["max_len"],
        "model": options["model"],
        "dropout": dropout,
        "members": args.members,
        "precision": args.precision,
        "host_load_1min": os.getloadavg()[0],
    }
    samples = {
        "ours": n,
        "plain": n,
        "sequential": args.members * n,
        "ensemble": args.members * n,
        "mixed": n,
        "sdpa": n,
    }
    for name, seconds in times.items():
        result[f"{name}_samples_per_s"] = samples[name] / statistics.median(seconds)
    result["ratio"] = statistics.median(times["ours"]) / statistics.median(times["plain"])
    lines = [
        f"ours {result['ours_samples_per_s']:.0f} samples/s, plain torch {result['plain_samples_per_s']:.0f} "
        f"samples/s: ratio {result['ratio']:.2f}x (target <= 1.3x)"
    ]
    if "sdpa" in times:
        result["ours_over_sdpa"] = statistics.median(times["ours"]) / statistics.median(times["sdpa"])
        lines.append(
            f"SDPA throughout {result['sdpa_samples_per_s']:.0f} samples/s, ours {result['ours_samples_per_s']:.0f} "
            f"samples/s: {result['ours_over_sdpa']:.2f} of the time (dropout {dropout})"
        )
    if args.members:
        result["ensemble_speedup"] = result["ensemble_samples_per_s"] / result["sequential_samples_per_s"]
        lines.append(
            f"{args.members} seeds: sequential {result['sequential_samples_per_s']:.0f} samples/s, ensemble "
            f"{result['ensemble_samples_per_s']:.0f} samples/s: {result['ensemble_speedup']:.2f}x (target >= 2x)"
        )
    if args.precision != "none":
        result["mixed_over_float32"] = result["mixed_samples_per_s"] / result["ours_samples_per_s"]
        lines.append(
            f"{args.precision} {result['mixed_samples_per_s']:.0f} samples/s, float32 "
            f"{result['ours_samples_per_s']:.0f} samples/s: {result['mixed_over_float32']:.2f}x"
        )
    print(json.dumps(result, indent=1))
    print("\n".join(lines))
    return result


def training_rates(
    synthetic: dict, task: str, pe: str, device: str, steps: int, members: int, precisions, faithful=None, compiled=()
) -> dict:
    """Optimiser steps per second of one classifier at the sizes of a resolved ``synthetic`` experiment (its
    model, batch and task sizes; only enough samples for ``steps`` steps are generated), per precision, and of
    an ensemble of ``members`` seeds (float32; ``ensemble_steps_per_s`` counts ensemble steps, each one step of
    every member). A warm-up epoch of 2 steps runs before each timed one (and compiles, for the precisions in
    ``compiled``: ``<precision>_compiled_steps_per_s``, the same classifier through ``torch.compile``, and
    ``compiled_over_eager`` at the first of them)."""
    from posgen.synthetic.train import train_ensemble

    dev = resolve_device(device)
    options = {**synthetic, "faithful": synthetic["faithful"] if faithful is None else faithful}
    t = options["train"]
    n_train = steps * t["batch_size"]
    sizes = {**options[task], "n_samples": math.ceil(n_train / (1 - options["test_fraction"])) + 2}
    data = make_task(task, {**options, task: sizes}, 0)
    train_set = tuple(x[:n_train] for x in load_split(data, TRAIN, dev, options["faithful"]))
    warm_set = tuple(x[: 2 * t["batch_size"]] for x in train_set)
    test_set = tuple(x[: t["batch_size"]] for x in load_split(data, TEST, dev, options["faithful"]))
    cfg = model_config(TrainOptions.of_experiment(options), data, pe)
    schedule = one_epoch(t)

    def rate(n_members: int, precision: str, compile_step: bool = False) -> float:
        seeds = list(range(n_members))
        models = []
        for seed in seeds:
            torch.manual_seed(seed)
            models.append(build(cfg).to(dev))
        runs = {"precision": precision, "compiled": compile_step, **schedule}
        train_ensemble(models, seeds, warm_set, test_set, desc="warm-up", **runs)
        _sync(dev)
        start = time.perf_counter()
        train_ensemble(models, seeds, train_set, test_set, desc=precision, **runs)
        _sync(dev)
        return steps / (time.perf_counter() - start)

    result = {f"{precision}_steps_per_s": rate(1, precision) for precision in precisions}
    for precision in compiled:
        result[f"{precision}_compiled_steps_per_s"] = rate(1, precision, compile_step=True)
    first = compiled[0] if compiled else None
    if first in precisions:
        result["compiled_over_eager"] = result[f"{first}_compiled_steps_per_s"] / result[f"{first}_steps_per_s"]
    if members > 1:
        result["ensemble_members"] = members
        result["ensemble_steps_per_s"] = rate(members, "float32")
    result |= {"model": options["model"], "batch_size": t["batch_size"], "tokens": int(data.sizes["token"])}
    result |= {"task": task, "pe": pe, "steps": steps, "device": str(dev)}
    return result
