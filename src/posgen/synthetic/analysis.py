"""Per-head ablation with the deposit index, the Toeplitz view of the logits, and the gathered results.

Ablation: each (layer, head) alone gets its value slice zeroed; ``drop = base accuracy - ablated accuracy`` on
the test split. Per layer, ``deposit_index = max_h drop / sum_h max(drop, 0)`` (1: one head carries everything
the layer's heads carry; NaN when no head's ablation lowers the accuracy) and ``top_gap`` = largest drop minus
the second largest.

Toeplitz view: per (layer, head), the variance share of the best ``a(i-j)`` fit and of the best
``a(i-j) + b(i) + c(j)`` fit of the logit matrix (``posgen.decompose.toeplitz_shares``), over each sample's
real tokens (bidirectional), pooled over samples as ``1 - sum SSE / sum SST``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import xarray as xr

from posgen.decompose import toeplitz_shares
from posgen.models import resolve_device
from posgen.stats import deposit_index, top_gap
from posgen.store import open_dataset, provenance, write_netcdf
from posgen.synthetic.tasks import TEST
from posgen.synthetic.train import accuracy, load_classifier, load_split


def ablate(model, tokens, labels, batch_size: int = 1024) -> tuple[float, np.ndarray]:
    """Base test accuracy and the accuracy with each (layer, head) ablated alone: (layer, head) array."""
    L, H = model.dims.n_layers, model.dims.n_heads
    base = accuracy(model, tokens, labels, batch_size)
    ablated = np.zeros((L, H))
    for layer in range(L):
        for head in range(H):
            gate = torch.ones(L, H, device=tokens.device)
            gate[layer, head] = 0.0
            ablated[layer, head] = accuracy(model, tokens, labels, batch_size, gate)
    return base, ablated


def _key_dims(ds: xr.Dataset, task: str, pe: str, seed: int) -> xr.Dataset:
    # object strings: fixed-width ones of different widths get truncated when files are combined
    return ds.expand_dims(task=np.array([task], dtype=object), pe=np.array([pe], dtype=object), seed=[seed])


def _object_strings(ds: xr.Dataset) -> xr.Dataset:
    return ds.assign_coords({k: v.astype(object) for k, v in ds.coords.items() if v.dtype.kind in "US"})


def ablation_job(
    task_path, checkpoints: list, keys: list[tuple[str, int]], out_path, *, device="auto", config_hash: str = ""
) -> xr.Dataset:
    """Ablate every head of the task's classifiers (``keys`` = (pe, seed) per checkpoint): dims task, pe, seed,
    layer, head."""
    dev = resolve_device(device)
    data = open_dataset(task_path, lazy=False)
    task = data.attrs["task"]
    tokens, labels = load_split(data, TEST, dev)
    parts = []
    for path, (pe, seed) in zip(checkpoints, keys):
        model = load_classifier(path, dev)
        base, ablated = ablate(model, tokens, labels)
        drop = base - ablated  # (layer, head)
        L, H = drop.shape
        ds = xr.Dataset(
            {
                "base_accuracy": base,
                "ablated_accuracy": (("layer", "head"), ablated),
                "drop": (("layer", "head"), drop),
                "deposit_index": ("layer", deposit_index(drop)),
                "top_gap": ("layer", top_gap(drop)),
                "top_head": ("layer", drop.argmax(-1)),
            },
            coords={"layer": np.arange(L), "head": np.arange(H)},
        )
        parts.append(_key_dims(ds, task, pe, seed))
        print(f"{task}/{pe}/seed{seed}: base {base:.4f}, largest drop per layer {drop.max(-1).round(4).tolist()}")
    out = xr.combine_by_coords(parts)
    out.attrs = provenance(task=task, n_test=len(labels), config_hash=config_hash)
    out["drop"].attrs["description"] = "base test accuracy minus the accuracy with this head's values zeroed"
    out["deposit_index"].attrs["description"] = "max_h drop / sum_h max(drop, 0); NaN when no drop is positive"
    out["top_gap"].attrs["description"] = "largest minus second-largest drop of the layer"
    write_netcdf(out, out_path)
    return out


def toeplitz_of(model, tokens: torch.Tensor, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pooled (layer, head) Toeplitz and additive variance shares over the samples' real-token blocks."""
    sse = np.zeros((2, model.dims.n_layers, model.dims.n_heads))
    sst = np.zeros((model.dims.n_layers, model.dims.n_heads))
    for sample, T in enumerate(lengths):
        logits = model.attention_logits(tokens[sample : sample + 1, :T])[0]  # (layer, head, T, T)
        shares = toeplitz_shares(logits, causal=False)
        centred = logits.double() - logits.double().mean((-1, -2), keepdim=True)
        total = (centred * centred).sum((-1, -2)).cpu().numpy()  # (layer, head)
        for i, share in enumerate(shares):
            sse[i] += np.nan_to_num((1 - share.cpu().numpy()) * total)
        sst += total
    with np.errstate(divide="ignore", invalid="ignore"):
        pooled = np.where(sst > 0, 1 - sse / sst, np.nan)
    return pooled[0], pooled[1]


def toeplitz_job(
    task_path,
    checkpoints: list,
    keys: list[tuple[str, int]],
    out_path,
    *,
    n_samples: int,
    device="auto",
    config_hash: str = "",
) -> xr.Dataset:
    """Toeplitz and additive shares of every head of the task's classifiers on the first ``n_samples`` test
    samples (at least 3 real tokens each)."""
    dev = resolve_device(device)
    data = open_dataset(task_path, lazy=False)
    task = data.attrs["task"]
    test = np.flatnonzero(np.asarray(data["split"].values) == TEST)[:n_samples]
    tokens = torch.as_tensor(np.asarray(data["tokens"].values)[test], dtype=torch.long, device=dev)
    lengths = np.asarray(data["length"].values)[test]
    parts = []
    for path, (pe, seed) in zip(checkpoints, keys):
        model = load_classifier(path, dev)
        toeplitz, additive = toeplitz_of(model, tokens, lengths)
        ds = xr.Dataset(
            {"toeplitz_share": (("layer", "head"), toeplitz), "additive_share": (("layer", "head"), additive)},
            coords={"layer": np.arange(toeplitz.shape[0]), "head": np.arange(toeplitz.shape[1])},
        )
        parts.append(_key_dims(ds, task, pe, seed))
        print(f"{task}/{pe}/seed{seed}: Toeplitz share per layer {np.nanmean(toeplitz, -1).round(3).tolist()}")
    out = xr.combine_by_coords(parts)
    out.attrs = provenance(task=task, n_samples=len(test), config_hash=config_hash)
    out["toeplitz_share"].attrs["description"] = "variance share of the best a(i-j) fit of the logits"
    out["additive_share"].attrs["description"] = "variance share of the best a(i-j) + b(i) + c(j) fit"
    return _write(out, out_path)


def _write(ds: xr.Dataset, path) -> xr.Dataset:
    write_netcdf(ds, path)
    return ds


def gather(paths: list, out_path, **attrs) -> xr.Dataset:
    """Merge per-job files with disjoint (task, pe, seed) keys into one file."""
    parts = [_object_strings(open_dataset(p, lazy=False)) for p in paths]
    for part in parts:
        part.attrs = {}
    out = xr.combine_by_coords(parts, combine_attrs="drop")
    out.attrs = provenance(**attrs)
    return _write(out, out_path)


def gather_training(paths: list, keys: list[tuple[str, str, int]], out_path, **attrs) -> xr.Dataset:
    """Learning curves and final test accuracies of every (task, pe, seed): dims task, pe, seed, step."""
    parts = []
    for path, (task, pe, seed) in zip(paths, keys):
        ds = open_dataset(path, lazy=False)
        part = ds[["train_loss", "train_accuracy", "test_accuracy"]]
        part = part.assign(
            final_test_accuracy=float(ds.attrs["test_accuracy"]),
            chance_accuracy=float(ds.attrs["chance_accuracy"]),
            train_seconds=float(ds.attrs["train_seconds"]),
        )
        part.attrs = {}
        parts.append(_key_dims(part, task, pe, seed))
    out = xr.combine_by_coords(parts, combine_attrs="drop")
    out.attrs = provenance(**attrs)
    return _write(out, out_path)


def summary_table(
    training: xr.Dataset, ablation: xr.Dataset, toeplitz: xr.Dataset, n_boot: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """One row per (task, pe): test accuracy (mean over seeds, 95 % bootstrap interval), chance, and in layer 0 the
    largest drop, the gap to the second, the deposit index, and mean Toeplitz / additive shares."""
    from posgen.synthetic.figures import seed_interval

    rows = []
    for task in training["task"].values:
        for pe in training["pe"].values:
            acc = training["final_test_accuracy"].sel(task=task, pe=pe).values
            mean, lo, hi = seed_interval(acc, n_boot, seed)
            abl = ablation.sel(task=task, pe=pe)
            toe = toeplitz.sel(task=task, pe=pe)
            rows.append(
                {
                    "task": str(task),
                    "pe": str(pe),
                    "n_seeds": int(np.isfinite(acc).sum()),
                    "test_accuracy": mean,
                    "test_accuracy_lo": lo,
                    "test_accuracy_hi": hi,
                    "chance_accuracy": float(training["chance_accuracy"].sel(task=task, pe=pe).mean("seed")),
                    "layer0_max_drop": float(abl["drop"].isel(layer=0).max("head").mean("seed")),
                    "layer0_top_gap": float(abl["top_gap"].isel(layer=0).mean("seed")),
                    "layer0_deposit_index": float(abl["deposit_index"].isel(layer=0).mean("seed")),
                    "max_drop_any_layer": float(abl["drop"].max(("layer", "head")).mean("seed")),
                    "toeplitz_share": float(toe["toeplitz_share"].mean()),
                    "additive_share": float(toe["additive_share"].mean()),
                }
            )
    return pd.DataFrame(rows)


def write_summary(training_path, ablation_path, toeplitz_path, csv_path, n_boot: int = 1000, seed: int = 0):
    """``summary.csv`` from the gathered NetCDFs (:func:`summary_table`)."""
    from posgen.store import atomic_path

    table = summary_table(
        open_dataset(training_path, lazy=False),
        open_dataset(ablation_path, lazy=False),
        open_dataset(toeplitz_path, lazy=False),
        n_boot,
        seed,
    )
    with atomic_path(csv_path) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    return table
