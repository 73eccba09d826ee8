"""The tables of a collection of experiments, from the gathered NetCDFs: ``summary.csv`` (one row per experiment,
task, pe), ``classifiers.csv`` (one row per classifier: experiment, task, pe, seed; what the verdicts decide on)
and ``deposit.csv`` (one row per experiment, task, pe, seed, layer)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from posgen.claims import t_interval
from posgen.stats import MIN_TOP_DROP
from posgen.store import atomic_path, open_dataset, provenance
from posgen.synthetic.convergence import CONVERGED, gate, heldout_rising, plateau_slope

DEPOSIT_VARIABLES = ["top_drop", "second_drop", "top_head", "deposit_index", "deposit", "layer_ablated_accuracy"]


def _agreement(heads: np.ndarray) -> float:
    """Fraction of seeds whose head equals the most common one (NaN with fewer than 2 seeds)."""
    heads = heads[np.isfinite(heads)].astype(int)
    if len(heads) < 2:
        return np.nan
    return float(np.bincount(heads).max() / len(heads))


def _fraction(flags: np.ndarray) -> float:
    flags = flags[np.isfinite(flags)]
    return float(flags.mean()) if len(flags) else np.nan


def _dynamics(train: xr.Dataset, abl: xr.Dataset) -> dict:
    """Per seed: is the trained model's layer-0 top head already the top one at the first snapshot after
    initialisation, and is it the head with the largest query+key gradient norm at initialisation? Only seeds
    whose top drop is at least MIN_TOP_DROP count: below it the top head is noise."""
    final_head = abl["top_head"].isel(layer=0).values  # (seed,)
    drops = train["snapshot_drop"].values  # (seed, snapshot, head)
    early = np.nanargmax(np.nan_to_num(drops[:, 1], nan=-np.inf), -1) if drops.shape[1] > 1 else final_head
    grad = train["init_grad_norm"].isel(layer=0).sum("side").values  # (seed, head)
    seeded = np.nanargmax(np.nan_to_num(grad, nan=-np.inf), -1)
    top = abl["top_drop"].isel(layer=0).values
    valid = np.isfinite(final_head) & (np.nan_to_num(top, nan=-1.0) >= MIN_TOP_DROP)
    return {
        "early_top_is_final": _fraction(np.where(valid, early == final_head, np.nan)),
        "init_grad_top_is_final": _fraction(np.where(valid, seeded == final_head, np.nan)),
    }


def _after_layer2(values: np.ndarray) -> float:
    """Mean over the streams after layer 2 (streams 3..L; NaN at depth 3 or less) of a (stream,) array."""
    values = values[np.isfinite(values)]
    return float(values[3:].mean()) if len(values) > 3 else np.nan


def classifier_table(
    training: xr.Dataset, ablation: xr.Dataset, probe: xr.Dataset, baselines: xr.Dataset
) -> pd.DataFrame:
    """One row per trained classifier (experiment, task, pe, seed): its regime (sizes, optimiser steps, learning
    rate, train/test sequences, longest distance), scores, the gate and its inputs (docs/method.md section 8.3:
    training and held-out slopes, whether the held-out accuracy still rises, ``gate``, ``converged``),
    the task's position-free floors, the layer-0 deposit statistics and both position probes."""
    rows = []
    for key in training["final_test_accuracy"].to_dataframe().dropna().index:
        experiment, task, pe, seed = key
        sel = dict(experiment=experiment, task=task, pe=pe, seed=seed)
        train, abl, prb = training.sel(sel), ablation.sel(sel), probe.sel(sel)
        base = baselines.sel(experiment=experiment, task=task)
        curve, lr = train["train_accuracy"].values, train["lr_factor"].values
        test_curve = train["test_accuracy"].values
        finite = curve[np.isfinite(curve)]
        layer0 = abl.isel(layer=0)
        position, transfer = prb["position_r2"].values, prb["transfer_r2"].values
        rows.append(
            {
                "experiment": str(experiment),
                "task": str(task),
                "pe": str(pe),
                "seed": int(seed),
                **{name: int(train[name]) for name in ("n_layers", "n_heads", "d_model", "train_steps", "n_train")},
                "faithful": bool(train["faithful"]),
                "lr": float(train["lr"]),
                "n_test": int(train["n_test"]),
                "longest_distance": int(base["longest_distance"]),
                "test_accuracy": float(train["final_test_accuracy"]),
                "test_accuracy_label0_masked": float(train["test_accuracy_label0_masked"]),
                "final_train_accuracy": float(finite[-1]) if len(finite) else np.nan,
                "train_slope": plateau_slope(curve, lr),
                "test_slope": plateau_slope(test_curve, lr),
                "heldout_rising": heldout_rising(test_curve, lr, int(train["n_test"])),
                **{
                    f"baseline_{name}": float(base["baseline_accuracy"].sel(baseline=name))
                    for name in base["baseline"].values
                },
                "layer0_top_drop": float(layer0["top_drop"]),
                "layer0_second_drop": float(layer0["second_drop"]),
                "layer0_deposit": bool(layer0["deposit"]),
                "position_r2_input": float(position[0]),
                "position_r2_after_layer2": _after_layer2(position),
                "transfer_r2_after_layer2": _after_layer2(transfer),
                "transfer_r2_input": float(transfer[0]),
                "transfer_r2_last": float(transfer[np.isfinite(transfer)][-1]),
            }
        )
    table = pd.DataFrame(rows)
    if not table.empty:  # the gate (posgen.synthetic.convergence) from the row's own columns
        table["gate"] = [gate(row) for _, row in table.iterrows()]
        table["converged"] = table["gate"] == CONVERGED
    return table


# the Toeplitz shares with their nulls and the distance x content split (posgen.synthetic.toeplitz), mean over seeds
TOEPLITZ_COLUMNS = (
    "toeplitz_share",
    "toeplitz_null",
    "additive_share",
    "additive_null",
    "distance_share",
    "content_share",
    "interaction_share",
)


def _trained_cells(training: xr.Dataset, baselines: xr.Dataset):
    """The (experiment, task, pe) selections with at least one trained seed, in the files' order: a task without
    a longest distance in an experiment's baselines, or a (task, pe) without a test accuracy, it does not train."""
    for experiment in training["experiment"].values:
        for task in training["task"].values:
            if task not in baselines["task"].values or not np.isfinite(
                baselines["longest_distance"].sel(experiment=experiment, task=task)
            ):
                continue  # this experiment does not train this task
            for pe in training["pe"].values:
                key = dict(experiment=experiment, task=task, pe=pe)
                if np.isfinite(training.sel(key)["final_test_accuracy"].values).any():
                    yield key


def _regime_columns(train: xr.Dataset) -> dict:
    """The classifiers' regime, over the seeds of one (experiment, task, pe): sizes, PE mode, seeds trained,
    optimiser steps, learning rate, training sequences (the same for every seed, NaN where none trained)."""
    return {
        "n_layers": int(np.nanmax(train["n_layers"].values)),
        "n_heads": int(np.nanmax(train["n_heads"].values)),
        "d_model": int(np.nanmax(train["d_model"].values)),
        "faithful": bool(np.nanmax(train["faithful"].values)),
        "n_seeds": int(np.isfinite(train["final_test_accuracy"].values).sum()),
        "train_steps": int(np.nanmax(train["train_steps"].values)),
        "lr": float(np.nanmax(train["lr"].values)),
        "n_train": int(np.nanmax(train["n_train"].values)),
    }


def _score_columns(train: xr.Dataset) -> dict:
    """Test scores, mean over seeds; the accuracy with its 95 % t interval over seeds."""
    mean, lo, hi = t_interval(train["final_test_accuracy"].values)
    return {
        "test_accuracy": mean,
        "test_accuracy_lo": lo,
        "test_accuracy_hi": hi,
        "test_accuracy_label0_masked": float(train["test_accuracy_label0_masked"].mean("seed")),
        "test_mae": float(train["test_mae"].mean("seed")),
        "test_within_one": float(train["test_within_one"].mean("seed")),
    }


def _deposit_columns(abl: xr.Dataset) -> dict:
    """The deposit statistics over seeds: layer 0's, leave-one-in on layer 0, and the best layer's (the largest mean
    top drop)."""
    layer0 = abl.isel(layer=0)
    best_layer = abl["top_drop"].mean("seed").fillna(-np.inf).argmax("layer")
    return {
        "layer0_top_drop": float(layer0["top_drop"].mean("seed")),
        "layer0_second_drop": float(layer0["second_drop"].mean("seed")),
        "layer0_deposit_index": float(layer0["deposit_index"].mean("seed")),
        "layer0_deposit_seeds": _fraction(layer0["deposit"].values.astype(float)),
        "layer0_top_head_agreement": _agreement(layer0["top_head"].values.astype(float)),
        "layer0_best_kept_accuracy": float(layer0["kept_accuracy"].max("head").mean("seed")),
        "layer0_ablated_accuracy": float(layer0["layer_ablated_accuracy"].mean("seed")),
        "best_layer": int(best_layer),
        "best_layer_top_drop": float(abl["top_drop"].isel(layer=int(best_layer)).mean("seed")),
        "any_layer_deposit_seeds": _fraction(abl["deposit"].max("layer").values.astype(float)),
    }


def _probe_columns(prb: xr.Dataset) -> dict:
    """The position probe's r2, mean over seeds, of the input, after layer 2 and of the last stream, and the
    transfer probe's after layer 2."""
    r2 = prb["position_r2"].mean("seed")
    return {
        "position_r2_input": float(r2.isel(stream=0)),
        "position_r2_after_layer2": _after_layer2(r2.values),
        "position_r2_last": float(r2.dropna("stream").isel(stream=-1)),
        "transfer_r2_after_layer2": _after_layer2(prb["transfer_r2"].mean("seed").values),
    }


def summary_table(
    training: xr.Dataset,
    ablation: xr.Dataset,
    toeplitz: xr.Dataset,
    probe: xr.Dataset,
    baselines: xr.Dataset,
    per_seed: pd.DataFrame,
) -> pd.DataFrame:
    """One row per (experiment, task, pe) with at least one trained seed: test scores (mean over seeds, 95 %
    t interval of the accuracy over seeds), how many seeds converged, the task's baselines, the layer-0 and
    best-layer deposit statistics, leave-one-in on layer 0, the Toeplitz shares with their nulls and the distance x content split, the
    position probe, and the training dynamics of the layer-0 top head. ``per_seed``: :func:`classifier_table` of
    the same files, whose convergence gate the summary counts."""
    converged_seeds = per_seed.groupby(["experiment", "task", "pe"])["converged"].sum()
    rows = []
    for key in _trained_cells(training, baselines):
        names = {dim: str(value) for dim, value in key.items()}  # experiment, task, pe
        train, abl = training.sel(key), ablation.sel(key)
        base = baselines.sel(experiment=key["experiment"], task=key["task"])
        rows.append(
            {
                **names,
                **_regime_columns(train),
                "longest_distance": int(base["longest_distance"]),
                "converged_seeds": int(converged_seeds[tuple(names.values())]),
                **_score_columns(train),
                **{f"baseline_{b}": float(base["baseline_accuracy"].sel(baseline=b)) for b in base["baseline"].values},
                **_deposit_columns(abl),
                **{name: float(toeplitz.sel(key)[name].mean()) for name in TOEPLITZ_COLUMNS},
                **_probe_columns(probe.sel(key)),
                **_dynamics(train, abl),
            }
        )
    return pd.DataFrame(rows)


def deposit_table(ablation: xr.Dataset) -> pd.DataFrame:
    """Per-seed, per-layer deposit statistics: one row per (experiment, task, pe, seed, layer)."""
    table = ablation[DEPOSIT_VARIABLES + ["base_accuracy"]].to_dataframe().reset_index()
    table = table.dropna(subset=["top_drop"])
    table["deposit"] = table["deposit"].astype(bool)
    table["top_head"] = table["top_head"].astype(int)
    return table[["experiment", "task", "pe", "seed", "layer", "base_accuracy"] + DEPOSIT_VARIABLES]


def write_summary(inputs: dict, csv_path, classifiers_path, deposit_path, *, config_hash: str = "") -> pd.DataFrame:
    """``summary.csv``, ``classifiers.csv`` and ``deposit.csv`` from the gathered NetCDFs ``inputs`` (training,
    ablation, toeplitz, probe, baselines); provenance as constant columns ``config_hash`` and ``posgen_version``,
    as results/summary.csv."""
    data = {name: open_dataset(path, lazy=False) for name, path in inputs.items()}
    per_seed = classifier_table(data["training"], data["ablation"], data["probe"], data["baselines"])
    parts = (data[name] for name in ("training", "ablation", "toeplitz", "probe", "baselines"))
    table = summary_table(*parts, per_seed)
    keep = {"config_hash": config_hash, "posgen_version": provenance()["posgen_version"]}
    table = table.assign(**keep)
    for path, frame in ((csv_path, table), (classifiers_path, per_seed.assign(**keep))):
        with atomic_path(path) as tmp:
            frame.to_csv(tmp, index=False, float_format="%.6g")
    with atomic_path(deposit_path) as tmp:
        deposit_table(data["ablation"]).assign(**keep).to_csv(tmp, index=False, float_format="%.6g")
    return table


def summary_step(job) -> pd.DataFrame:
    """Rule synthetic_summary's job (a :class:`posgen.workflow.job.StepJob`)."""
    o = job.output
    return write_summary(
        dict(job.input), o["csv"], o["classifiers"], o["deposit"], config_hash=job.params["config_hash"]
    )
