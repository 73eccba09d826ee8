"""Training throughput of the synthetic-family classifier against a plain torch loop of the same shapes.

Ours: ``posgen.synthetic.train.train`` for one epoch (batching, LR schedule, progress bar, the per-epoch test
accuracy on one batch) on the task generated from the config's sizes. Plain: the same encoder written inline
(embedding, pre-LN layers with fused QKV projection, RoPE inline when the PE is rope, SDPA with the padding mask,
ReLU FFN, masked mean pooling, linear head) and a bare AdamW forward/backward loop over the same batches. Both run
in alternating rounds on the same device (medians), so machine noise hits them alike. Prints samples/s of each
and the ratio ours / plain time (target <= 1.3).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from posgen.config import SCHEMA
from posgen.device import resolve_device
from posgen.synthetic.model import build
from posgen.synthetic.pe import Rotary
from posgen.synthetic.tasks import TEST, TRAIN, make_task
from posgen.synthetic.train import load_split, model_config, train


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

    from posgen.config import validate

    parser = argparse.ArgumentParser(prog="python -m posgen.bench synthetic", description=__doc__)
    parser.add_argument(
        "--config", default=None, help="config file whose synthetic sizes to use (default: schema defaults)"
    )
    parser.add_argument("--task", default="distance", choices=["distance", "count"])
    parser.add_argument("--pe", default="rope", choices=["nope", "rope"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    device = resolve_device(args.device)
    config = yaml.safe_load(open(args.config)) if args.config else {}
    config = {
        "models": [{"name": "x", "source": "embedded:smollm2-135m"}],
        "corpus": {"source": "embedded"},
        "n_samples": 8,
        "seq_len": 1200,
        **{k: v for k, v in config.items() if k == "synthetic"},
    }
    options = validate(config, SCHEMA)["synthetic"]
    data = make_task(args.task, options, 0)
    train_set, test_set = load_split(data, TRAIN, device), load_split(data, TEST, device)
    t = options["train"]
    test_set = tuple(x[: t["batch_size"]] for x in test_set)
    cfg = model_config(options, data, args.pe)
    n = len(train_set[1])

    def ours():
        torch.manual_seed(0)
        model = build({**cfg, "dropout": 0.0}).to(device)
        _sync(device)
        start = time.perf_counter()
        train(
            model,
            train_set,
            test_set,
            epochs=1,
            batch_size=t["batch_size"],
            lr=t["lr"],
            weight_decay=t["weight_decay"],
            warmup_fraction=t["warmup_fraction"],
            betas=t["betas"],
            seed=0,
            desc="ours",
        )
        _sync(device)
        return time.perf_counter() - start

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

    ours(), plain()  # warm-up
    times = {"ours": [], "plain": []}
    for _ in range(args.rounds):
        times["ours"].append(ours())
        times["plain"].append(plain())
    result = {
        "task": args.task,
        "pe": args.pe,
        "device": str(device),
        "threads": args.threads,
        "train_samples": n,
        "batch_size": t["batch_size"],
        "max_len": cfg["max_len"],
        "model": options["model"],
        "ours_samples_per_s": n / statistics.median(times["ours"]),
        "plain_samples_per_s": n / statistics.median(times["plain"]),
    }
    result["ratio"] = statistics.median(times["ours"]) / statistics.median(times["plain"])
    print(json.dumps(result, indent=1))
    print(
        f"ours {result['ours_samples_per_s']:.0f} samples/s, plain torch {result['plain_samples_per_s']:.0f} "
        f"samples/s: ratio {result['ratio']:.2f}x (target <= 1.3x)"
    )
    return result
