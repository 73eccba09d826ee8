"""Training one classifier on one task: AdamW with linear warm-up then cosine decay, deterministic given the seed.

Writes the checkpoint (state dict + model config) and a NetCDF with the learning curves (dim ``step`` = epoch)
and the final test accuracy.
"""

from __future__ import annotations

import dataclasses
import io
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr
from tqdm import tqdm

from posgen.device import resolve_device
from posgen.experiments import TrainOptions, parse_pe
from posgen.integrity import content_digest, damaged, digest
from posgen.schedule import warmup_cosine
from posgen.store import atomic_path, open_dataset, provenance, require_space, write_netcdf
from posgen.synthetic.ablation import single_head_accuracy
from posgen.synthetic.ensemble import Ensemble, matmul_precision
from posgen.synthetic.model import Classifier, batch_tokens, build
from posgen.synthetic.tasks import TEST, TRAIN
from posgen.workflow.job import listed


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


def used_lengths(tokens: torch.Tensor) -> np.ndarray:
    """Per sample, one past its last real token (sample,): read to the host once, before training."""
    columns = torch.arange(1, tokens.shape[1] + 1, device=tokens.device)  # (T,)
    return ((tokens != 0) * columns).amax(1).cpu().numpy()


def batch_plan(perms: torch.Tensor, lengths: np.ndarray | None, batch_size: int) -> list[tuple[int, int, int]]:
    """The epoch's batches as (first, last, width): members' sample rows ``perms[:, first:last]`` (member, n),
    trimmed to ``width`` columns, the longest real sequence of any member's batch (clean mode; the pads past it
    are masked anyway). ``lengths`` None keeps the full width (faithful mode). Host arithmetic on the CPU
    permutations: no read from the device."""
    n = perms.shape[1]
    plan = []
    for first in range(0, n, batch_size):
        last = min(first + batch_size, n)
        width = 0 if lengths is None else int(lengths[perms[:, first:last].numpy()].max())
        plan.append((first, last, width))
    return plan


def train(model: Classifier, train_set, test_set, *, seed: int, snapshot=None, **options) -> dict:
    """Train one classifier in place (:func:`train_ensemble` with one member); returns its curves."""
    one = None if snapshot is None else (lambda models: [snapshot(models[0])])
    return train_ensemble([model], [seed], train_set, test_set, snapshot=one, **options)[0]


class Snapshots:
    """The dynamics snapshots of a training: ``snapshot(models)[i]`` of member i taken before optimiser step s for
    every s of ``steps`` (0: at initialisation), and the seconds those taken during the steps took, which the
    training time leaves out."""

    def __init__(self, snapshot, steps, models: list[Classifier]):
        self.snapshot, self.models = snapshot, models
        self.pending = sorted(set(steps))
        self.taken = [{} for _ in models]  # per member, {step: snapshot}
        self.seconds = 0.0

    def before(self, step: int) -> None:
        """Take those due before optimiser step ``step``."""
        while self.pending and self.pending[0] <= step:
            self.seconds += self._take(self.pending.pop(0))

    def at_end(self) -> None:
        """Take those at or past the end: the trained models."""
        for step in self.pending:
            self._take(step)

    def _take(self, at: int) -> float:
        t0 = time.perf_counter()
        for index, value in enumerate(self.snapshot(self.models)):
            self.taken[index][at] = value
        return time.perf_counter() - t0


def train_ensemble(
    models: list[Classifier],
    seeds: list[int],
    train_set,
    test_set,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    warmup_fraction: float,
    betas,
    ignore_index: int = -100,
    snapshot_steps=(),
    snapshot=None,
    desc: str = "train",
    eval_batch_size: int = 1024,
    precision: str = "float32",
    compiled: bool = False,
) -> list[dict]:
    """Train same-shape classifiers in place, member i with its own data order (seeded by ``seeds[i]``, as it
    would be alone); returns per member the per-epoch curves (train loss, train and test accuracy), timing, and
    ``snapshots``: ``snapshot(models)[i]`` taken before optimiser step s for every s in ``snapshot_steps``
    (0 = at initialisation), the time they took excluded.

    ``ignore_index``: a label left out of the loss (the authors' code passes 0, which drops every count-0
    sample of the count task; -100 leaves every label in). ``precision``: float32, bfloat16 (autocast forward
    pass, float32 weights and optimiser) or tf32 (float32 with TF32 matrix products on CUDA). Host reads
    happen once per epoch (the curves), never inside a step. ``compiled``: one member through ``torch.compile``
    (:class:`posgen.synthetic.ensemble.Ensemble`; the benches only, so far)."""
    tokens, labels = train_set
    members, n = len(models), len(labels)
    faithful = models[0].dims.faithful
    lengths = None if faithful else used_lengths(tokens)
    steps_per_epoch = math.ceil(n / batch_size)
    total = epochs * steps_per_epoch
    warmup = max(1, int(round(warmup_fraction * total)))
    ensemble = Ensemble(models, precision, compiled)
    optimizer, schedule = _optimiser(ensemble, lr, weight_decay, betas, total, warmup)
    orders = [torch.Generator().manual_seed(seed) for seed in seeds]  # shuffling; dropout: the global generator
    curves = [{"train_loss": [], "train_accuracy": [], "test_accuracy": [], "lr_factor": []} for _ in models]
    snapshots, step = Snapshots(snapshot, snapshot_steps, models), 0
    ensemble.train()
    start = time.perf_counter()
    with matmul_precision(precision), tqdm(total=total, desc=desc, mininterval=2.0) as bar:
        for _ in range(epochs):
            perms = torch.stack([torch.randperm(n, generator=order) for order in orders])  # (E, n), host
            rows = perms.to(tokens.device)
            loss_sum = torch.zeros(members, device=tokens.device)
            correct = torch.zeros(members, dtype=torch.long, device=tokens.device)
            for first, last, width in batch_plan(perms, lengths, batch_size):
                snapshots.before(step)
                step += 1
                idx = rows[:, first:last]  # (E, B)
                x = tokens[idx] if faithful else tokens[idx][..., :width]  # (E, B, T)
                loss, hits = ensemble.step(x, labels[idx], optimizer, schedule, ignore_index)
                loss_sum += loss * (last - first)
                correct += hits
                bar.update()
            train_loss, train_correct = (loss_sum / n).tolist(), correct.tolist()  # the epoch's one host read
            lr_factor = warmup_cosine(step - 1, total, warmup)  # the rate of the epoch's last step
            train_scores = (train_loss, [hits / n for hits in train_correct])
            _record_epoch(curves, models, train_scores, test_set, eval_batch_size, lr_factor)
            bar.set_postfix(loss=f"{curves[0]['train_loss'][-1]:.3f}", test=f"{curves[0]['test_accuracy'][-1]:.3f}")
    snapshots.at_end()
    seconds = time.perf_counter() - start - snapshots.seconds
    for curve, taken in zip(curves, snapshots.taken, strict=True):
        curve |= {"seconds": seconds, "samples_per_second": members * epochs * n / seconds, "members": members}
        curve["snapshots"] = taken
    return curves


def _optimiser(ensemble: Ensemble, lr: float, weight_decay: float, betas, total: int, warmup: int):
    """AdamW over the ensemble's stacked parameters and its schedule, linear warm-up over ``warmup`` of the
    ``total`` steps then cosine decay: (optimiser, scheduler)."""
    # fused: one kernel per step, and its step counters stay on the device (foreach AdamW reads them back)
    optimizer = torch.optim.AdamW(
        ensemble.params.values(), lr=lr, weight_decay=weight_decay, betas=tuple(betas), fused=True
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_cosine(step, total, warmup))
    return optimizer, schedule


def _record_epoch(curves: list[dict], models, train_scores, test_set, eval_batch_size: int, lr_factor: float) -> None:
    """Each member's points of the epoch on its curves: ``train_scores`` = (mean loss, accuracy) on the training
    set, a list over members each, its accuracy on ``test_set``, and ``lr_factor``."""
    for curve, model, loss, train_accuracy in zip(curves, models, *train_scores, strict=True):
        curve["train_loss"].append(loss)
        curve["train_accuracy"].append(train_accuracy)
        curve["test_accuracy"].append(accuracy(model, *test_set, eval_batch_size))
        curve["lr_factor"].append(lr_factor)


def model_config(options: TrainOptions, data: xr.Dataset, pe: str) -> dict:
    """Classifier keyword arguments from an experiment's training options, the task's data set and a PE label
    (``partial-rope-2``: partial RoPE on 2 heads; posgen.experiments)."""
    m = options.model
    name, rope_heads = parse_pe(pe, m.n_heads)
    return dict(
        vocab_size=int(data.attrs["vocab_size"]),
        n_classes=int(data.attrs["n_classes"]),
        max_len=int(data.sizes["token"]),
        pe=name,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        d_model=m.d_model,
        d_ff=m.d_ff,
        dropout=m.dropout,
        faithful=options.faithful,
        rope_heads=rope_heads,
        rope_base=float(options.rope_base),
    )


def snapshot_steps(fractions, total: int) -> list[int]:
    """Optimiser steps of the dynamics snapshots: ``round(fraction * total)`` for each fraction, and the end."""
    return sorted({int(round(f * total)) for f in fractions} | {total})


def train_job(
    task_path,
    outputs: dict,
    *,
    pe: str,
    options: TrainOptions,
    experiment: str = "",
    device: str = "auto",
    config_hash: str = "",
) -> list[xr.Dataset]:
    """Train the (experiment, task, pe) classifiers of the seeds in ``outputs`` ({seed: (checkpoint path, curves
    path)}) as one :class:`Ensemble`; write each one's checkpoint and curves NetCDF, with the final test scores,
    the per-head query/key gradient norms at initialisation and the layer-0 single-head drops at the dynamics
    snapshots (``train.snapshots``, on the first ``train.snapshot_samples`` test samples). Each member starts
    from the weights it would have alone (``torch.manual_seed(seed)`` then ``build``)."""
    dev = resolve_device(device)
    data = open_dataset(task_path, lazy=False)
    task = data.attrs["task"]
    config = model_config(options, data, pe)
    train_set, test_set = load_split(data, TRAIN, dev, options.faithful), load_split(data, TEST, dev, options.faithful)
    t = options.train
    seeds = sorted(outputs)
    models, grads = [], []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(build(config).to(dev))
        grads.append(init_gradients(models[-1], *train_set, t.batch_size, t.loss_ignore_index))  # (layer, head, side)
    probe_set = (test_set[0][: t.snapshot_samples], test_set[1][: t.snapshot_samples])
    total = t.epochs * math.ceil(len(train_set[1]) / t.batch_size)
    steps = snapshot_steps(t.snapshots, total)
    label = f"{experiment}/{task}/{pe}/seed{','.join(map(str, seeds))}"
    all_curves = train_ensemble(
        models,
        seeds,
        train_set,
        test_set,
        epochs=t.epochs,
        batch_size=t.batch_size,
        lr=t.lr,
        weight_decay=t.weight_decay,
        warmup_fraction=t.warmup_fraction,
        betas=t.betas,
        ignore_index=t.loss_ignore_index,
        snapshot_steps=steps,
        snapshot=lambda members: [layer_drops(m, *probe_set, layers=[0]) for m in members],
        desc=f"train {label}",
        precision=t.precision,
    )
    key = {"experiment": experiment, "task": task, "pe": pe}
    run = {"config": config, "train": dataclasses.asdict(t), "device": str(dev), "total": total, "steps": steps}
    run["n_train"] = len(train_set[1])
    return [
        _write_classifier(outputs[seed], model, grad, curves, test_set, {**key, "seed": seed}, run, config_hash)
        for seed, model, grad, curves in zip(seeds, models, grads, all_curves, strict=True)
    ]


def _write_classifier(files, model, grad, curves, test_set, key: dict, run: dict, config_hash: str) -> xr.Dataset:
    """One trained classifier's checkpoint and curves NetCDF (``files``), named by ``key`` (experiment, task, pe,
    seed), with what its training ``run`` was (model config, schedule, device, steps)."""
    checkpoint_path, curves_path = files
    state = {name: value.clone() for name, value in model.state_dict().items()}  # not the ensemble's stacks
    save_checkpoint(checkpoint_path, {"config": run["config"], "state_dict": state, **key})
    final = scores(predict(model, test_set[0]), test_set[1])
    ds = curves_dataset(curves, run["steps"], grad, run["config"])
    ds["checkpoint_digest"] = np.int64(state_digest(state))  # under train.nc's own digest
    ds["checkpoint_digest"].attrs["description"] = (
        "content digest of model.pt's state dict (its tensors' digests by name)"
    )
    ds.attrs.update(
        provenance(
            **key,
            model_config=run["config"],
            train=run["train"],
            device=run["device"],
            train_seconds=curves["seconds"],
            samples_per_second=curves["samples_per_second"],
            ensemble_members=curves["members"],
            test_accuracy=final["accuracy"],
            test_mae=final["mae"],
            test_within_one=final["within_one"],
            test_accuracy_label0_masked=final["accuracy_label0_masked"],
            train_steps=run["total"],
            threads=torch.get_num_threads(),
            n_train=run["n_train"],
            n_test=len(test_set[1]),
            config_hash=config_hash,
        )
    )
    write_netcdf(ds, curves_path)
    print(
        f"{'/'.join(str(v) for v in key.values())}: test accuracy {final['accuracy']:.4f}, MAE {final['mae']:.3f} "
        f"({curves['seconds']:.1f} s for {curves['members']} member(s), {curves['samples_per_second']:.0f} samples/s)"
    )
    return ds


def curves_dataset(curves: dict, steps: list[int], grads: np.ndarray, config: dict) -> xr.Dataset:
    """One classifier's learning curves (dim ``step`` = epoch), gradient norms at initialisation and snapshot
    drops as a Dataset (provenance added by the caller)."""
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
            "step": np.arange(1, len(curves["train_loss"]) + 1),
            "layer": np.arange(config["n_layers"]),
            "head": np.arange(config["n_heads"]),
            "side": ["query", "key"],
            "snapshot": steps,
        },
    )
    ds["step"].attrs["long_name"] = "epoch"
    ds["lr_factor"].attrs["description"] = "learning rate / its peak at the epoch's last step (warm-up, cosine)"
    ds["snapshot"].attrs["long_name"] = "optimiser steps taken (0: initialisation)"
    ds["init_grad_norm"].attrs["description"] = "norm of the head's query/key weight+bias gradient at initialisation"
    ds["snapshot_drop"].attrs["description"] = "layer-0 accuracy drop with the head ablated, at the snapshot"
    return ds


CHECKPOINT_KEYS = ("experiment", "task", "pe", "seed")  # what a checkpoint says it is, checked against its job


def state_digest(state_dict: dict) -> int:
    """A state dict's content digest, as a file's (posgen.integrity): each tensor's digest by name, combined."""
    digests = {name: digest(tensor.detach().cpu().numpy()) for name, tensor in state_dict.items()}
    return int(content_digest(digests), 16)


def save_checkpoint(path, payload: dict) -> None:
    """``torch.save`` of ``payload`` with stable bytes (the same weights give the same file: saved through memory,
    where torch names the archive ``archive``, not after the temporary file), written atomically."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    require_space(path, buffer.getbuffer().nbytes)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getvalue())


def load_classifier(checkpoint_path, device="cpu", expect: dict | None = None, digest: int | None = None) -> Classifier:
    """The classifier of a checkpoint, in eval mode. ``expect``: the job's (experiment, task, pe, seed), each
    compared with what the checkpoint says it is; ``digest``: the :func:`state_digest` its training recorded in
    train.nc. An unreadable file, another classifier's or edited weights stop with one line naming the file."""
    try:
        state = torch.load(checkpoint_path, map_location=device, weights_only=True)
        config, weights = state["config"], state["state_dict"]
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - torch words a truncated or foreign file without its path
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise damaged(checkpoint_path, f"not a readable classifier checkpoint ({type(err).__name__}: {text})") from None
    for key, wanted in (expect or {}).items():
        if str(state.get(key)) != str(wanted):
            raise damaged(checkpoint_path, f"holds {key} {state.get(key)!r}, this job's is {wanted!r}")
    if digest is not None and state_digest(weights) != int(digest):
        raise damaged(checkpoint_path, "its weights are not those its train.nc recorded (replaced or edited)")
    model = build(config).to(device)
    model.load_state_dict(weights)
    return model.eval()


def train_step(job) -> None:
    """A synthetic training rule's job (a :class:`posgen.workflow.job.StepJob`): params.classifiers lists [pe, seed]
    of each output pair, in order; one :func:`train_job` per PE's seeds where they train as one ensemble
    (``train.ensemble``), else one per classifier, each as it would train alone."""
    p = job.params
    options = TrainOptions.of_params(p)
    outputs = list(zip(listed(job.output["checkpoints"]), listed(job.output["curves"]), strict=True))
    runs = {}
    for (pe, seed), files in zip(p["classifiers"], outputs, strict=True):
        key = pe if options.train.ensemble else (pe, seed)
        runs.setdefault(key, (pe, {}))[1][int(seed)] = files
    for pe, files_by_seed in runs.values():
        train_job(
            job.input["data"],
            files_by_seed,
            pe=pe,
            options=options,
            experiment=p["experiment"],
            device=p["device"],
            config_hash=p["config_hash"],
        )
