"""One classifier's analysis job (per-head ablation, the Toeplitz view, position probes) and the gathered files of
a collection of experiments (dims ``experiment, task, pe, seed``).

Definitions: ``posgen.synthetic.ablation`` (docs/method.md section 8.4), ``posgen.synthetic.toeplitz`` (8.5),
``posgen.synthetic.probe`` (8.7); the baselines beside every accuracy: ``posgen.synthetic.baselines``.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from posgen.device import resolve_device
from posgen.experiments import AnalysisOptions
from posgen.integrity import made_from
from posgen.stats import deposit_statistics
from posgen.store import open_dataset, provenance, write_netcdf
from posgen.synthetic.ablation import leave_one_in_accuracy, single_head_accuracy
from posgen.synthetic.baselines import baselines
from posgen.synthetic.bayes import longest_distance, position_free_bayes
from posgen.synthetic.probe import position_probes
from posgen.synthetic.tasks import TEST, TRAIN, n_trigger_ids
from posgen.synthetic.toeplitz import toeplitz_view
from posgen.synthetic.train import CHECKPOINT_KEYS, load_classifier, load_split
from posgen.workflow.job import listed

KEY_DIMS = ("experiment", "task", "pe", "seed")


def _key_dims(ds: xr.Dataset, experiment: str, task: str, pe: str, seed: int) -> xr.Dataset:
    # object strings: fixed-width ones of different widths get truncated when files are combined
    return ds.expand_dims(
        experiment=np.array([experiment], dtype=object),
        task=np.array([task], dtype=object),
        pe=np.array([pe], dtype=object),
        seed=[seed],
    )


def _object_strings(ds: xr.Dataset) -> xr.Dataset:
    return ds.assign_coords({k: v.astype(object) for k, v in ds.coords.items() if v.dtype.kind in "US"})


def ablation_dataset(model, tokens, labels) -> xr.Dataset:
    """Single-head drops of every layer, the deposit statistics per layer, and leave-one-in on layer 0 and on
    the layer with the largest single-head drop (NaN elsewhere)."""
    L, H = model.dims.n_layers, model.dims.n_heads
    base, ablated = single_head_accuracy(model, tokens, labels, list(range(L)))
    drop = base - ablated  # (layer, head)
    stats = deposit_statistics(drop)
    focus = sorted({0, int(stats["top_drop"].argmax())})
    kept = np.full((L, H), np.nan)
    layer_ablated = np.full(L, np.nan)
    kept[focus], layer_ablated[focus] = leave_one_in_accuracy(model, tokens, labels, focus)
    ds = xr.Dataset(
        {
            "base_accuracy": base,
            "ablated_accuracy": (("layer", "head"), ablated),
            "drop": (("layer", "head"), drop),
            **{name: ("layer", value) for name, value in stats.items()},
            "kept_accuracy": (("layer", "head"), kept),
            "layer_ablated_accuracy": ("layer", layer_ablated),
        },
        coords={"layer": np.arange(L), "head": np.arange(H)},
    )
    ds["drop"].attrs["description"] = "base test accuracy minus the accuracy with this head's values zeroed"
    ds["deposit_index"].attrs["description"] = "top drop / sum of positive drops; NaN when the top drop < 5 points"
    ds["deposit"].attrs["description"] = "the paper's criterion: top drop >= 30 points and second drop <= 5"
    ds["kept_accuracy"].attrs["description"] = "accuracy with only this head of its layer kept (leave-one-in)"
    ds["layer_ablated_accuracy"].attrs["description"] = "accuracy with every head of the layer ablated"
    ds["deposit"] = ds["deposit"].astype(np.int8)
    return ds


def analyse_job(
    task_path,
    checkpoint_path,
    curves_path,
    out_paths: dict,
    *,
    key: tuple,
    options: AnalysisOptions,
    device="auto",
    config_hash: str = "",
) -> dict:
    """Ablation, Toeplitz view and position probe of one classifier (``key`` = experiment, task, pe, seed) on the
    first ``ablation_samples`` / ``toeplitz_samples`` test samples; writes ``out_paths`` ablation, toeplitz,
    probe. The checkpoint must be the classifier of ``key`` whose weights ``curves_path`` (its train.nc)
    recorded."""
    dev = resolve_device(device)
    data = open_dataset(task_path, lazy=False)
    recorded = int(open_dataset(curves_path, lazy=False)["checkpoint_digest"])
    expect = dict(zip(CHECKPOINT_KEYS, key, strict=True))
    model = load_classifier(checkpoint_path, dev, expect=expect, digest=recorded)
    faithful = model.dims.faithful
    tokens, labels = load_split(data, TEST, dev, faithful, options.ablation_samples)
    test = np.flatnonzero(np.asarray(data["split"].values) == TEST)[: options.toeplitz_samples]
    lengths = np.asarray(data["length"].values)[test]
    toe_tokens = load_split(data, TEST, dev, faithful, options.toeplitz_samples)[0]
    trigger_ids = n_trigger_ids(data)
    coords = {"layer": np.arange(model.dims.n_layers), "head": np.arange(model.dims.n_heads)}
    parts = {
        "ablation": ablation_dataset(model, tokens, labels),
        "toeplitz": xr.Dataset(
            {
                name: (("layer", "head"), value)
                for name, value in toeplitz_view(model, toe_tokens, lengths, trigger_ids).items()
            },
            coords=coords,
        ),
        "probe": xr.Dataset(
            {name: ("stream", value) for name, value in position_probes(model, tokens).items()},
            coords={"stream": np.arange(model.dims.n_layers + 1)},
        ),
    }
    parts["probe"]["stream"].attrs["long_name"] = "residual stream: 0 = input embeddings, l = after layer l"
    parts["probe"]["position_r2"].attrs["description"] = "held-out R^2 of position, a fresh probe per stream"
    parts["probe"]["transfer_r2"].attrs["description"] = "held-out R^2 of the input stream's probe applied here"
    attrs = provenance(
        **dict(zip(KEY_DIMS, key)), n_ablation=len(labels), n_toeplitz=len(test), config_hash=config_hash
    )
    out = {}
    for name, ds in parts.items():
        ds = _key_dims(ds, *key)
        ds.attrs = attrs
        write_netcdf(ds, out_paths[name])
        out[name] = ds
    top = parts["ablation"]["top_drop"].values
    print(
        f"{'/'.join(map(str, key))}: base {float(parts['ablation']['base_accuracy']):.4f}, top drop per layer "
        f"{top.round(4).tolist()}, position R^2 per stream {parts['probe']['position_r2'].values.round(3).tolist()}"
    )
    return out


def _write(ds: xr.Dataset, path) -> xr.Dataset:
    write_netcdf(ds, path)
    return ds


def combine(parts: list[xr.Dataset]) -> xr.Dataset:
    """One dataset from parts with disjoint (experiment, task, pe, seed) keys: an outer join, so experiments of
    other depths or head counts leave NaN beyond their own layers and heads; per-key scalars keep their dims."""
    return xr.combine_by_coords(parts, combine_attrs="drop", data_vars="minimal", coords="minimal", join="outer")


def gather(paths: list, out_path, **attrs) -> xr.Dataset:
    """Merge per-classifier files with disjoint (experiment, task, pe, seed) keys into one file."""
    parts = [_object_strings(open_dataset(p, lazy=False)) for p in paths]
    for part in parts:
        part.attrs = {}
    out = combine(parts)
    out.attrs = provenance(**attrs)
    return _write(out, out_path)


TRAINING_VARIABLES = [
    "train_loss",
    "train_accuracy",
    "test_accuracy",
    "lr_factor",
    "init_grad_norm",
    "snapshot_accuracy",
    "snapshot_drop",
]
MODEL_SIZES = ("n_layers", "n_heads", "d_model", "faithful")  # per classifier, so a summary can tell experiments apart
FINAL_SCORES = {
    "final_test_accuracy": "test_accuracy",
    "test_mae": "test_mae",
    "test_within_one": "test_within_one",
    "test_accuracy_label0_masked": "test_accuracy_label0_masked",
    "train_seconds": "train_seconds",
    "train_steps": "train_steps",
    "n_train": "n_train",
    "n_test": "n_test",
}


def gather_training(paths: list, keys: list, out_path, **attrs) -> xr.Dataset:
    """Learning curves, final test scores, initial gradient norms and dynamics snapshots of every (experiment,
    task, pe, seed). Snapshot steps differ between tasks and sizes, so ``snapshot`` is the snapshot's index and
    ``snapshot_step`` the optimiser steps it stands for."""
    parts = []
    for path, key in zip(paths, keys):
        ds = open_dataset(path, lazy=False)
        part = ds[TRAINING_VARIABLES]
        steps = part["snapshot"].values
        config = json.loads(ds.attrs["model_config"])
        part = part.assign_coords(snapshot=np.arange(len(steps))).assign(
            snapshot_step=("snapshot", steps.astype(np.int64)),
            **{name: float(ds.attrs[attr]) for name, attr in FINAL_SCORES.items()},
            **{name: int(config[name]) for name in MODEL_SIZES},
            lr=float(json.loads(ds.attrs["train"])["lr"]),
        )
        part.attrs = {}
        parts.append(_key_dims(part.drop_vars("side").assign_coords(side=[0, 1]), *key))
    out = combine(parts)
    out["side"].attrs["flag_meanings"] = "query key"
    out.attrs = provenance(**attrs)
    return _write(out, out_path)


def gather_baselines(task_paths: list, keys: list, out_path, **attrs) -> xr.Dataset:
    """The baselines of every (experiment, task) of a collection (dims experiment, task, baseline), from the data
    set each trained on (``task_paths[i]`` for ``keys[i]`` = (experiment, task)): the position-free rules of
    ``posgen.synthetic.baselines`` fitted on the data, the exact position-free Bayes accuracy ``bayes``
    (``posgen.synthetic.bayes``), and the task's ``longest_distance`` (0 for count)."""
    parts, cache = [], {}
    for path, (experiment, task) in zip(task_paths, keys):
        if path not in cache:
            data = open_dataset(path, lazy=False)
            sizes = json.loads(data.attrs["sizes"])
            values = {**baselines(data, TRAIN, TEST), "bayes": position_free_bayes(task, sizes)}
            cache[path] = values, longest_distance(task, sizes)
        values, longest = cache[path]
        part = xr.Dataset(
            {
                "baseline_accuracy": ("baseline", np.array(list(values.values()))),
                "longest_distance": longest,
            },
            coords={"baseline": np.array(list(values), dtype=object)},
        )
        parts.append(
            part.expand_dims(experiment=np.array([experiment], dtype=object), task=np.array([task], dtype=object))
        )
    out = combine(parts)
    out["baseline_accuracy"].attrs["description"] = (
        "test accuracy of a position-free rule; bayes: the exact accuracy of the best position-free classifier"
    )
    out.attrs = provenance(**attrs)
    return _write(out, out_path)


def analyse_step(job) -> None:
    """A synthetic analysis rule's job (a :class:`posgen.workflow.job.StepJob`): params.classifiers lists [pe,
    seed] of each checkpoint, in order (a task job analyses many in turn); each classifier's files record only its
    own inputs."""
    p, i, o = job.params, job.input, job.output
    files = zip(
        *(listed(x) for x in (i["checkpoint"], i["curves"], o["ablation"], o["toeplitz"], o["probe"])), strict=True
    )
    options = AnalysisOptions.of_params(p)
    for (pe, seed), (checkpoint, curves, ablation, toeplitz, probe) in zip(p["classifiers"], files, strict=True):
        with made_from([i["data"], checkpoint, curves]):
            analyse_job(
                i["data"],
                checkpoint,
                curves,
                {"ablation": ablation, "toeplitz": toeplitz, "probe": probe},
                key=(p["experiment"], job.wildcards["task"], pe, int(seed)),
                options=options,
                device=p["device"],
                config_hash=p["config_hash"],
            )


def gather_step(job) -> None:
    """Rule synthetic_gather's job: a collection's per-classifier files gathered, each gathered file recording only
    the files it was gathered from."""
    i, o, p = job.input, job.output, job.params
    for part in ("ablation", "toeplitz", "probe"):
        with made_from(listed(i[part])):
            gather(listed(i[part]), o[part], config_hash=p["config_hash"])
    with made_from(listed(i["training"])):
        gather_training(listed(i["training"]), p["classifiers"], o["training"], config_hash=p["config_hash"])
    with made_from(listed(i["tasks"])):
        gather_baselines(listed(i["tasks"]), p["tasks"], o["baselines"], config_hash=p["config_hash"])
