"""Training one classifier on one task: AdamW with linear warm-up then cosine decay, deterministic given the seed.

Writes the checkpoint (state dict + model config) and a NetCDF with the learning curves (dim ``step`` = epoch)
and the final test accuracy.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr
from tqdm import tqdm

from posgen.models import resolve_device
from posgen.store import atomic_path, open_dataset, provenance, write_netcdf
from posgen.synthetic.model import Classifier, build
from posgen.synthetic.tasks import TEST, TRAIN


def load_split(data: xr.Dataset, split: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (sample, token) and labels (sample,) of one split, trimmed to its longest sequence."""
    chosen = np.asarray(data["split"].values) == split
    tokens = np.asarray(data["tokens"].values)[chosen]
    length = int(np.asarray(data["length"].values)[chosen].max())
    labels = np.asarray(data["label"].values)[chosen]
    return (
        torch.as_tensor(tokens[:, :length], dtype=torch.long, device=device),
        torch.as_tensor(labels, dtype=torch.long, device=device),
    )


def batch_tokens(tokens: torch.Tensor, faithful: bool) -> torch.Tensor:
    """Clean mode drops the batch's all-pad tail columns (masked anyway); faithful mode keeps every pad."""
    if faithful:
        return tokens
    used = int((tokens != 0).any(0).nonzero().max()) + 1
    return tokens[:, :used]


@torch.no_grad()
def accuracy(model: Classifier, tokens, labels, batch_size: int, head_gate=None) -> float:
    """Fraction of correctly classified sequences (eval mode)."""
    was_training = model.training
    model.eval()
    correct = 0
    for start in range(0, len(labels), batch_size):
        x = batch_tokens(tokens[start : start + batch_size], model.dims.faithful)
        correct += int((model(x, head_gate).argmax(-1) == labels[start : start + batch_size]).sum())
    model.train(was_training)
    return correct / len(labels)


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def train(
    model: Classifier,
    train_set,
    test_set,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    warmup_fraction: float,
    betas,
    seed: int,
    desc: str = "train",
    eval_batch_size: int = 1024,
) -> dict:
    """Train in place; returns per-epoch curves (train loss, train and test accuracy) and timing."""
    tokens, labels = train_set
    n = len(labels)
    steps_per_epoch = math.ceil(n / batch_size)
    total = epochs * steps_per_epoch
    warmup = max(1, int(round(warmup_fraction * total)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=tuple(betas))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total, warmup))
    order = torch.Generator().manual_seed(seed)  # shuffling; dropout draws from the seeded global generator
    curves = {"train_loss": [], "train_accuracy": [], "test_accuracy": []}
    model.train()
    start = time.perf_counter()
    with tqdm(total=total, desc=desc, mininterval=2.0) as bar:
        for _ in range(epochs):
            perm = torch.randperm(n, generator=order).to(tokens.device)
            loss_sum, correct = 0.0, 0
            for first in range(0, n, batch_size):
                idx = perm[first : first + batch_size]
                x, y = batch_tokens(tokens[idx], model.dims.faithful), labels[idx]
                logits = model(x)  # (B, n_classes)
                loss = F.cross_entropy(logits, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
                loss_sum += float(loss.detach()) * len(idx)
                correct += int((logits.detach().argmax(-1) == y).sum())
                bar.update()
            curves["train_loss"].append(loss_sum / n)
            curves["train_accuracy"].append(correct / n)
            curves["test_accuracy"].append(accuracy(model, *test_set, eval_batch_size))
            bar.set_postfix(loss=f"{curves['train_loss'][-1]:.3f}", test=f"{curves['test_accuracy'][-1]:.3f}")
    curves["seconds"] = time.perf_counter() - start
    curves["samples_per_second"] = epochs * n / curves["seconds"]
    return curves


def model_config(options: dict, data: xr.Dataset, pe: str) -> dict:
    """Classifier keyword arguments from the ``synthetic`` config section and the task's data set."""
    m = options["model"]
    return dict(
        vocab_size=int(data.attrs["vocab_size"]),
        n_classes=int(data.attrs["n_classes"]),
        max_len=int(data.sizes["token"]),
        pe=pe,
        n_layers=m["n_layers"],
        n_heads=m["n_heads"],
        d_model=m["d_model"],
        d_ff=m["d_ff"],
        dropout=m["dropout"],
        faithful=options["faithful"],
        rope_heads=options["rope_heads"],
        rope_base=float(options["rope_base"]),
    )


def train_job(
    task_path,
    checkpoint_path,
    curves_path,
    *,
    pe: str,
    seed: int,
    options: dict,
    device: str = "auto",
    config_hash: str = "",
) -> xr.Dataset:
    """Train one (task, pe, seed) classifier; write its checkpoint and its curves NetCDF."""
    dev = resolve_device(device)
    data = open_dataset(task_path, lazy=False)
    task = data.attrs["task"]
    torch.manual_seed(seed)
    config = model_config(options, data, pe)
    model = build(config).to(dev)
    train_set, test_set = load_split(data, TRAIN, dev), load_split(data, TEST, dev)
    t = options["train"]
    curves = train(
        model,
        train_set,
        test_set,
        epochs=t["epochs"],
        batch_size=t["batch_size"],
        lr=t["lr"],
        weight_decay=t["weight_decay"],
        warmup_fraction=t["warmup_fraction"],
        betas=t["betas"],
        seed=seed,
        desc=f"train {task}/{pe}/seed{seed}",
    )
    with atomic_path(checkpoint_path) as tmp:
        torch.save({"config": config, "state_dict": model.state_dict(), "task": task, "seed": seed}, tmp)
    steps = np.arange(1, t["epochs"] + 1)
    # the best constant guess: the test split's most frequent label
    majority = float(np.bincount(test_set[1].cpu().numpy()).max() / len(test_set[1]))
    ds = xr.Dataset(
        {
            name: ("step", np.asarray(curves[name], dtype=np.float64))
            for name in ("train_loss", "train_accuracy", "test_accuracy")
        },
        coords={"step": steps},
        attrs=provenance(
            task=task,
            pe=pe,
            seed=seed,
            model_config=config,
            train=t,
            device=str(dev),
            train_seconds=curves["seconds"],
            samples_per_second=curves["samples_per_second"],
            test_accuracy=curves["test_accuracy"][-1],
            chance_accuracy=majority,
            n_train=len(train_set[1]),
            n_test=len(test_set[1]),
            config_hash=config_hash,
        ),
    )
    ds["step"].attrs["long_name"] = "epoch"
    write_netcdf(ds, curves_path)
    print(
        f"{task}/{pe}/seed{seed}: test accuracy {curves['test_accuracy'][-1]:.4f} "
        f"({curves['seconds']:.1f} s, {curves['samples_per_second']:.0f} samples/s)"
    )
    return ds


def load_classifier(checkpoint_path, device="cpu") -> Classifier:
    state = torch.load(checkpoint_path, map_location=device, weights_only=True)
    model = build(state["config"]).to(device)
    model.load_state_dict(state["state_dict"])
    return model.eval()
