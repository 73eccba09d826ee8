"""The tables of a collection of experiments: ``summary.csv`` (one row per experiment, task, pe) and
``deposit.csv`` (one row per experiment, task, pe, seed, layer), from the gathered NetCDFs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from posgen.stats import MIN_TOP_DROP, seed_interval
from posgen.store import atomic_path, open_dataset, provenance

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


def summary_table(
    training: xr.Dataset,
    ablation: xr.Dataset,
    toeplitz: xr.Dataset,
    probe: xr.Dataset,
    baselines: xr.Dataset,
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per (experiment, task, pe) with at least one trained seed: test scores (mean over seeds, 95 %
    bootstrap interval of the accuracy), the task's baselines, the layer-0 and best-layer deposit statistics,
    leave-one-in on layer 0, the Toeplitz shares with their nulls and the distance x content split, the
    position probe, and the training dynamics of the layer-0 top head."""
    rows = []
    for experiment in training["experiment"].values:
        for task in training["task"].values:
            base = baselines.sel(task=task)["baseline_accuracy"]
            for pe in training["pe"].values:
                key = dict(experiment=experiment, task=task, pe=pe)
                train = training.sel(key)
                acc = train["final_test_accuracy"].values
                if not np.isfinite(acc).any():
                    continue  # this experiment does not train this (task, pe)
                mean, lo, hi = seed_interval(acc, n_boot, seed)
                abl, toe, prb = ablation.sel(key), toeplitz.sel(key), probe.sel(key)
                layer0 = abl.isel(layer=0)
                best_layer = abl["top_drop"].mean("seed").fillna(-np.inf).argmax("layer")
                r2 = prb["position_r2"].mean("seed")
                rows.append(
                    {
                        "experiment": str(experiment),
                        "task": str(task),
                        "pe": str(pe),
                        "n_layers": int(np.nanmax(train["n_layers"].values)),
                        "n_heads": int(np.nanmax(train["n_heads"].values)),
                        "d_model": int(np.nanmax(train["d_model"].values)),
                        "faithful": bool(np.nanmax(train["faithful"].values)),
                        "n_seeds": int(np.isfinite(acc).sum()),
                        "test_accuracy": mean,
                        "test_accuracy_lo": lo,
                        "test_accuracy_hi": hi,
                        "test_mae": float(train["test_mae"].mean("seed")),
                        "test_within_one": float(train["test_within_one"].mean("seed")),
                        **{f"baseline_{name}": float(base.sel(baseline=name)) for name in base["baseline"].values},
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
                        **{
                            name: float(toe[name].mean())
                            for name in (
                                "toeplitz_share",
                                "toeplitz_null",
                                "additive_share",
                                "additive_null",
                                "distance_share",
                                "content_share",
                                "interaction_share",
                            )
                        },
                        "position_r2_input": float(r2.isel(stream=0)),
                        "position_r2_after_layer2": float(r2.isel(stream=slice(3, None)).mean())
                        if r2.sizes["stream"] > 3
                        else np.nan,
                        "position_r2_last": float(r2.dropna("stream").isel(stream=-1)),
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


def write_summary(
    inputs: dict, csv_path, deposit_path, *, n_boot: int, seed: int, config_hash: str = ""
) -> pd.DataFrame:
    """``summary.csv`` and ``deposit.csv`` from the gathered NetCDFs ``inputs`` (training, ablation, toeplitz,
    probe, baselines); provenance as constant columns ``config_hash`` and ``posgen_version``, as results/summary.csv."""
    data = {name: open_dataset(path, lazy=False) for name, path in inputs.items()}
    table = summary_table(
        data["training"], data["ablation"], data["toeplitz"], data["probe"], data["baselines"], n_boot, seed
    )
    keep = {"config_hash": config_hash, "posgen_version": provenance()["posgen_version"]}
    table = table.assign(**keep)
    with atomic_path(csv_path) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    with atomic_path(deposit_path) as tmp:
        deposit_table(data["ablation"]).assign(**keep).to_csv(tmp, index=False, float_format="%.6g")
    return table
