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

from posgen.device import resolve_device
from posgen.store import atomic_path, open_dataset, provenance, write_netcdf
from posgen.synthetic.ablation import single_head_accuracy
from posgen.synthetic.experiments import parse_pe
from posgen.synthetic.model import Classifier, batch_tokens, build
from posgen.synthetic.tasks import TEST, TRAIN


def load_split(data: xr.Dataset, split: int, device, faithful: bool = False, limit: int | None = None):
    """Tokens (sample, token) and labels (sample,) of one split (its first ``limit`` samples).

    Clean mode trims the split to its longest sequence (pads are masked, so the width changes nothing).
    Faithful mode keeps the task's full width for every split and pass: its pads are attended and pooled, so a
    narrower tensor would be a different input."""
    chosen = np.flatnonzero(np.asarray(data["split"].values) == split)[:limit]
    tokens = np.asarray(data["tokens"].values)[chosen]
    width = tokens.shape[1] if faithful else int(np.asarray(data["length"].values)[chosen].max())
    labels = np.asarray(data["label"].values)[chosen]
    return (
        torch.as_tensor(tokens[:, :width], dtype=torch.long, device=device),
        torch.as_tensor(labels, dtype=torch.long, device=device),
    )


@torch.no_grad()
def predict(model: Classifier, tokens, batch_size: int = 1024, head_gate=None) -> torch.Tensor:
    """Predicted classes (sample,) in eval mode."""
    was_training = model.training
    model.eval()
    out = [
        model(batch_tokens(tokens[start : start + batch_size], model.dims.faithful), head_gate).argmax(-1)
        for start in range(0, len(tokens), batch_size)
    ]
    model.train(was_training)
    return torch.cat(out)


def accuracy(model: Classifier, tokens, labels, batch_size: int = 1024, head_gate=None) -> float:
    """Fraction of correctly classified sequences (eval mode)."""
    return float((predict(model, tokens, batch_size, head_gate) == labels).float().mean())


def scores(predicted: torch.Tensor, labels: torch.Tensor) -> dict:
    """Exact accuracy, mean absolute error (in label units: a distance or a count), within-one accuracy, and the
    accuracy over the samples whose label is not 0 (what the authors' code reports: it masks label 0, the
    count task's zero-trigger samples; the distance task has no label 0)."""
    error = (predicted - labels).abs().float()  # (sample,)
    nonzero = labels != 0
    return {
        "accuracy": float((error == 0).float().mean()),
        "mae": float(error.mean()),
        "within_one": float((error <= 1).float().mean()),
        "accuracy_label0_masked": float((error[nonzero] == 0).float().mean()) if bool(nonzero.any()) else np.nan,
    }


def head_rows(layer_module, head: int) -> slice:
    """Rows of the query/key/value projections that make head ``head``."""
    d = layer_module.dims.head_dim
    return slice(head * d, (head + 1) * d)


def init_gradients(model: Classifier, tokens, labels, batch_size: int, ignore_index: int) -> np.ndarray:
    """Per-head gradient norms (layer, head, [query, key]) of the mean training loss at initialisation:
    ||dL/dW_Q[rows of h]|| and ||dL/dW_K[rows of h]|| (weights and biases), dropout off, the model untouched."""
    was_training = model.training
    model.eval()
    model.zero_grad(set_to_none=True)
    n = len(labels)
    for start in range(0, n, batch_size):
        x, y = batch_tokens(tokens[start : start + batch_size], model.dims.faithful), labels[start : start + batch_size]
        loss = F.cross_entropy(model(x), y, ignore_index=ignore_index, reduction="sum") / n
        loss.backward()
    norms = np.zeros((model.dims.n_layers, model.dims.n_heads, 2))
    for layer, block in enumerate(model.layers):
        for head in range(model.dims.n_heads):
            rows = head_rows(block, head)
            for side, proj in enumerate((block.query, block.key)):
                grad = torch.cat([proj.weight.grad[rows].ravel(), proj.bias.grad[rows]])
                norms[layer, head, side] = float(grad.norm())
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return norms


def layer_drops(model: Classifier, tokens, labels, layers, batch_size: int = 1024) -> tuple[float, np.ndarray]:
    """Base accuracy and the accuracy drop (len(layers), head) with each head of ``layers`` ablated alone."""
    base, ablated = single_head_accuracy(model, tokens, labels, layers, batch_size)
    return base, base - ablated


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
    ignore_index: int = -100,
    snapshot_steps=(),
    snapshot=None,
    desc: str = "train",
    eval_batch_size: int = 1024,
) -> dict:
    """Train in place; returns per-epoch curves (train loss, train and test accuracy), timing, and
    ``snapshots``: ``snapshot(model)`` taken before optimiser step s for every s in ``snapshot_steps`` (0 = at
    initialisation), the time they took excluded.

    ``ignore_index``: a label left out of the loss (the authors' code passes 0, which drops every count-0
    sample of the count task; -100 leaves every label in)."""
    tokens, labels = train_set
    n = len(labels)
    steps_per_epoch = math.ceil(n / batch_size)
    total = epochs * steps_per_epoch
    warmup = max(1, int(round(warmup_fraction * total)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=tuple(betas))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total, warmup))
    order = torch.Generator().manual_seed(seed)  # shuffling; dropout draws from the seeded global generator
    curves = {"train_loss": [], "train_accuracy": [], "test_accuracy": [], "lr_factor": []}
    snapshots, pending = {}, sorted(set(snapshot_steps))
    snapshot_seconds, step = 0.0, 0
    model.train()
    start = time.perf_counter()
    with tqdm(total=total, desc=desc, mininterval=2.0) as bar:
        for _ in range(epochs):
            perm = torch.randperm(n, generator=order).to(tokens.device)
            loss_sum, correct = 0.0, 0
            for first in range(0, n, batch_size):
                idx = perm[first : first + batch_size]
                while pending and pending[0] <= step:
                    t0 = time.perf_counter()
                    snapshots[pending.pop(0)] = snapshot(model)
                    snapshot_seconds += time.perf_counter() - t0
                step += 1
                x, y = batch_tokens(tokens[idx], model.dims.faithful), labels[idx]
                logits = model(x)  # (B, n_classes)
                loss = F.cross_entropy(logits, y, ignore_index=ignore_index)
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
            curves["lr_factor"].append(lr_factor(step - 1, total, warmup))  # the rate of the epoch's last step
            bar.set_postfix(loss=f"{curves['train_loss'][-1]:.3f}", test=f"{curves['test_accuracy'][-1]:.3f}")
    for pending_step in pending:  # steps at or past the end: the trained model
        snapshots[pending_step] = snapshot(model)
    curves["seconds"] = time.perf_counter() - start - snapshot_seconds
    curves["samples_per_second"] = epochs * n / curves["seconds"]
    curves["snapshots"] = snapshots
    return curves


def model_config(options: dict, data: xr.Dataset, pe: str) -> dict:
    """Classifier keyword arguments from an experiment's options, the task's data set and a PE label
    (``partial-rope-2``: partial RoPE on 2 heads; posgen.synthetic.experiments)."""
    m = options["model"]
    name, rope_heads = parse_pe(pe, m["n_heads"])
    return dict(
        vocab_size=int(data.attrs["vocab_size"]),
        n_classes=int(data.attrs["n_classes"]),
        max_len=int(data.sizes["token"]),
        pe=name,
        n_layers=m["n_layers"],
        n_heads=m["n_heads"],
        d_model=m["d_model"],
        d_ff=m["d_ff"],
        dropout=m["dropout"],
        faithful=options["faithful"],
        rope_heads=rope_heads,
        rope_base=float(options["rope_base"]),
    )


def snapshot_steps(fractions, total: int) -> list[int]:
    """Optimiser steps of the dynamics snapshots: ``round(fraction * total)`` for each fraction, and the end."""
    return sorted({int(round(f * total)) for f in fractions} | {total})


def train_job(
    task_path,
    checkpoint_path,
    curves_path,
    *,
    pe: str,
    seed: int,
    options: dict,
    experiment: str = "",
    device: str = "auto",
    config_hash: str = "",
) -> xr.Dataset:
    """Train one (experiment, task, pe, seed) classifier; write its checkpoint and its curves NetCDF, with the
    final test scores, the per-head query/key gradient norms at initialisation and the layer-0 single-head
    drops at the dynamics snapshots (``train.snapshots``, on the first ``train.snapshot_samples`` test samples)."""
    dev = resolve_device(device)
    data = open_dataset(task_path, lazy=False)
    task = data.attrs["task"]
    torch.manual_seed(seed)
    config = model_config(options, data, pe)
    model = build(config).to(dev)
    faithful = options["faithful"]
    train_set, test_set = load_split(data, TRAIN, dev, faithful), load_split(data, TEST, dev, faithful)
    t = options["train"]
    ignore_index = -100 if t["ignore_index"] is None else t["ignore_index"]
    grads = init_gradients(model, *train_set, t["batch_size"], ignore_index)  # (layer, head, side)
    probe_set = (test_set[0][: t["snapshot_samples"]], test_set[1][: t["snapshot_samples"]])
    total = t["epochs"] * math.ceil(len(train_set[1]) / t["batch_size"])
    steps = snapshot_steps(t["snapshots"], total)
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
        ignore_index=ignore_index,
        snapshot_steps=steps,
        snapshot=lambda m: layer_drops(m, *probe_set, layers=[0]),
        desc=f"train {experiment}/{task}/{pe}/seed{seed}",
    )
    with atomic_path(checkpoint_path) as tmp:
        torch.save({"config": config, "state_dict": model.state_dict(), "task": task, "seed": seed}, tmp)
    final = scores(predict(model, test_set[0]), test_set[1])
    epochs = np.arange(1, t["epochs"] + 1)
    snapshot_accuracy = np.array([curves["snapshots"][s][0] for s in steps])
    snapshot_drop = np.stack([curves["snapshots"][s][1][0] for s in steps])  # (snapshot, head)
    ds = xr.Dataset(
        {
            **{
                name: ("step", np.asarray(curves[name], dtype=np.float64))
                for name in ("train_loss", "train_accuracy", "test_accuracy", "lr_factor")
            },
            "init_grad_norm": (("layer", "head", "side"), grads),
            "snapshot_accuracy": ("snapshot", snapshot_accuracy),
            "snapshot_drop": (("snapshot", "head"), snapshot_drop),
        },
        coords={
            "step": epochs,
            "layer": np.arange(config["n_layers"]),
            "head": np.arange(config["n_heads"]),
            "side": ["query", "key"],
            "snapshot": steps,
        },
        attrs=provenance(
            experiment=experiment,
            task=task,
            pe=pe,
            seed=seed,
            model_config=config,
            train=t,
            device=str(dev),
            train_seconds=curves["seconds"],
            samples_per_second=curves["samples_per_second"],
            test_accuracy=final["accuracy"],
            test_mae=final["mae"],
            test_within_one=final["within_one"],
            test_accuracy_label0_masked=final["accuracy_label0_masked"],
            train_steps=total,
            threads=torch.get_num_threads(),
            n_train=len(train_set[1]),
            n_test=len(test_set[1]),
            config_hash=config_hash,
        ),
    )
    ds["step"].attrs["long_name"] = "epoch"
    ds["lr_factor"].attrs["description"] = "learning rate / its peak at the epoch's last step (warm-up, cosine)"
    ds["snapshot"].attrs["long_name"] = "optimiser steps taken (0: initialisation)"
    ds["init_grad_norm"].attrs["description"] = "norm of the head's query/key weight+bias gradient at initialisation"
    ds["snapshot_drop"].attrs["description"] = "layer-0 accuracy drop with the head ablated, at the snapshot"
    write_netcdf(ds, curves_path)
    print(
        f"{experiment}/{task}/{pe}/seed{seed}: test accuracy {final['accuracy']:.4f}, MAE {final['mae']:.3f} "
        f"({curves['seconds']:.1f} s, {curves['samples_per_second']:.0f} samples/s)"
    )
    return ds


def load_classifier(checkpoint_path, device="cpu") -> Classifier:
    state = torch.load(checkpoint_path, map_location=device, weights_only=True)
    model = build(state["config"]).to(device)
    model.load_state_dict(state["state_dict"])
    return model.eval()
