"""decomposition.nc: the statistics of every (sample, layer), unit by unit (:class:`DecompositionTable`, fed by
the store path's :func:`decompose_store` and by the fused path, posgen.llm.fused), with the provenance that says how
they were made (docs/data-model.md)."""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr
from tqdm import tqdm

from posgen.decomposition.bound import STATISTICS as BOUND_STATISTICS
from posgen.decomposition.decomposer import METHODS, RC_SUMS, SUMS, VECTORS, Decomposer
from posgen.decomposition.drift import BASES, SMOOTH_DEGREE, heldout_coefficients, heldout_fit
from posgen.decomposition.mask import SINKS
from posgen.decomposition.options import DecompositionOptions
from posgen.integrity import shown
from posgen.rope_table import PARAMETERS, RopeTable
from posgen.store import HELDOUT_COEF, HELDOUT_MEAN, carried_attrs, open_dataset, provenance, read_rope, write_netcdf


def _check_store(ds: xr.Dataset, path) -> None:
    need = ["q", "k", *PARAMETERS]
    missing = [v for v in need if v not in ds]
    if missing:
        raise KeyError(f"{shown(path)}: missing variable(s) {', '.join(missing)}")


class DecompositionTable:
    """The statistics of :meth:`Decomposer.unit`, (sample, layer) unit by unit, and the decomposition.nc they make.

    ``rope`` is the model's RoPE table: qk.h5's (the store path, :func:`posgen.store.read_rope`) or the capture's
    (the fused path); ``samples`` the windows' global indices. The error of A and the bound run on windows with a
    global index below ``bound_samples`` (0: all), so every shard of a sharded run agrees with the unsharded one.
    ``heldout_coef`` (layer, kv_head, basis, dim): the coefficients of the mean key at every position over
    ``heldout_windows`` held-out windows (:func:`~posgen.decomposition.drift.heldout_coefficients`), Method
    A-shared's source (None: A-shared is NaN).
    """

    def __init__(
        self,
        dec: Decomposer,
        rope: RopeTable,
        samples,
        n_tokens: int,
        bound_samples: int,
        heldout_coef=None,
        heldout_windows: int = 0,
    ):
        self.dec = dec
        self.rope = rope
        self.samples = np.asarray(samples, dtype=np.int64)
        self.n_tokens = int(n_tokens)
        self.bound_samples = int(bound_samples)
        self.kv_group = rope.kv_group
        self.layers = [rope.layer(layer) for layer in range(rope.n_layers)]
        self.arrays: dict[str, np.ndarray] = {}
        # on the analysis device once, not copied there for every (window, layer)
        self.heldout_coef = None if heldout_coef is None else torch.as_tensor(np.asarray(heldout_coef)).to(dec.device)
        self.heldout_windows = int(heldout_windows) if heldout_coef is not None else 0
        self.pending: list = []  # (sample position, layer, UnitStatistics) not yet copied to the host

    def add(self, sample: int, layer: int, q, k) -> None:
        """One unit: window ``sample`` (global index), q (H, T, d) and k (H_kv, T, d) of ``layer``, pre-RoPE. Its
        statistics stay on the analysis device until :meth:`flush` (called once a window's layers are in)."""
        with_bound = not self.bound_samples or sample < self.bound_samples
        if self.heldout_coef is None:
            heldout = None
        else:  # on the decomposer's drift basis, built once per window length
            heldout = heldout_fit(self.heldout_coef[layer], self.dec.basis(self.n_tokens)["drift"])
        unit = self.dec.statistics(q, k, self.kv_group, self.layers[layer], with_bound=with_bound, heldout_k=heldout)
        position = int(np.flatnonzero(self.samples == sample)[0])
        self.pending.append((position, layer, unit))

    def flush(self) -> None:
        """The pending units' statistics to the host in one copy, checked (:meth:`Decomposer.to_host`)."""
        if not self.pending:
            return
        results = self.dec.to_host([unit for _, _, unit in self.pending])
        for (position, layer, _), result in zip(self.pending, results):
            for name, value in result.items():
                if name not in self.arrays:
                    self.arrays[name] = np.full((len(self.samples), len(self.layers)) + value.shape, np.nan)
                self.arrays[name][position, layer] = value
        self.pending = []

    def dataset(self, attrs: dict) -> xr.Dataset:
        """decomposition.nc (docs/data-model.md); ``attrs`` are added to the provenance."""
        self.flush()
        dec, n_samples = self.dec, len(self.samples)
        used = np.array([dec.layer_distance(rope, self.n_tokens) for rope in self.layers], dtype=np.int64)
        coords = {
            "sample": self.samples,
            "layer": np.arange(self.rope.n_layers),
            "head": np.arange(self.rope.n_heads),
            "method": list(METHODS),
            "sink": list(SINKS),
            "basis": list(BASES),
            "D": np.asarray(dec.dummy_distances, dtype=np.int64),
            # per layer, carried along by every variable with a layer dim: what the statistics split by and scored at
            "layer_type": ("layer", self.rope.layer_types(self.n_tokens)),
            "dummy_distance_used": ("layer", used),
        }
        base = ("sample", "layer", "head")
        dims = {
            "r": base + ("method", "sink"),
            "r_f": base + ("method", "sink"),
            "r_g": base + ("method", "sink"),
            "r_rc": base + ("method", "sink"),
            "r_sweep": base + ("sink", "D"),
            "r_sweep_rc": base + ("sink", "D"),
            **{name: base + ("sink",) for name in BOUND_STATISTICS},
            "lstsq_residual": base + ("sink",),
            **{name: base + ("method", "sink") for name in (*SUMS, *RC_SUMS)},
            **{f"{v}_position_share": base + ("basis", "sink") for v in VECTORS},
            "k_shared_share": base + ("sink",),
            "k_scaled_share": base + ("sink",),
        }
        data = {name: (dims[name], self.arrays[name]) for name in dims}
        data["r2_f"] = (dims["r_f"], self.arrays["r_f"] ** 2)
        data["r2_g"] = (dims["r_g"], self.arrays["r_g"] ** 2)
        bound_samples = int((self.samples < self.bound_samples).sum()) if self.bound_samples else n_samples
        return xr.Dataset(
            data,
            coords=coords,
            attrs=provenance(
                dummy_distance=int(dec.dummy_distance),
                smooth_degree=SMOOTH_DEGREE,
                heldout_windows=self.heldout_windows,
                n_tokens=self.n_tokens,
                lstsq_tol=float(dec.lstsq_tol),
                precision=dec.precision,
                bound_rows=dec.bound_rows,
                bound_samples=bound_samples,
                lstsq_residual_max=float(dec.max_residual),
                device=str(dec.device),
                **attrs,
            ),
        )


def heldout_source(ds: xr.Dataset):
    """Method A-shared's source in a qk.h5 dataset: its held-out key coefficients, those of the mean keys a file
    written before them holds, or None."""
    if HELDOUT_COEF in ds:
        return ds[HELDOUT_COEF].values
    if HELDOUT_MEAN in ds:
        return heldout_coefficients(ds[HELDOUT_MEAN].values, ds.sizes["token"]).numpy()
    return None


def decompose_dataset(
    ds: xr.Dataset,
    options: DecompositionOptions,
    *,
    progress: bool = True,
    attrs: dict | None = None,
    what: str = "q/k dataset",
) -> xr.Dataset:
    """decomposition.nc of ``ds``, a dataset named as qk.h5 (opened from the file, or captured in memory by
    :func:`posgen.api.capture_qk`), one (sample, layer) at a time; ``attrs`` are added to its provenance, before
    the carried attrs of ``ds``; ``what`` names ``ds`` in errors. ``options`` as in :func:`decompose_store`."""
    _check_store(ds, what)
    dec = Decomposer.from_options(options)
    heldout = heldout_source(ds)
    table = DecompositionTable(
        dec,
        read_rope(ds),
        ds["sample"].values,
        ds.sizes["token"],
        options.bound_samples,
        heldout_coef=heldout,
        heldout_windows=int(ds.attrs.get("heldout_windows", 0)),
    )
    units = [(s_, l_) for s_ in range(ds.sizes["sample"]) for l_ in range(ds.sizes["layer"])]
    label = f"decompose {ds.attrs.get('model', '')}/{ds.attrs.get('variant', '')}"
    for s_, l_ in tqdm(units, desc=label, unit="layer", disable=not progress):
        q = ds["q"].isel(sample=s_, layer=l_).values
        k = ds["k"].isel(sample=s_, layer=l_).values
        table.add(int(table.samples[s_]), l_, q, k)
        if l_ == ds.sizes["layer"] - 1:
            table.flush()  # a window's layers: one copy to the host
    return table.dataset({**(attrs or {}), **carried_attrs(ds)})


def decompose_store(
    qk_path,
    out_path,
    options: DecompositionOptions,
    *,
    config_hash: str = "",
    progress: bool = True,
) -> xr.Dataset:
    """decomposition.nc from qk.h5, one (sample, layer) at a time (see docs/data-model.md); the store path.

    Every layer carries its ``layer_type`` (:func:`posgen.layer_types.layer_types`) and ``dummy_distance_used`` (the D of its
    Method A r, r_g and bound: :func:`posgen.layer_types.used_dummy_distance`) as coordinates; ``r_sweep`` takes each
    D of the sweep by the same rule.

    The error of A and the section 5 bound (checked entry by entry) are evaluated on the windows with a global
    index below ``options.bound_samples`` (0: all); elsewhere their statistics are NaN. Every r statistic covers
    every sample.
    """
    # without dask: xarray's lazy indexing reads exactly the (sample, layer) slice asked for
    ds = open_dataset(qk_path, lazy=False)
    out = decompose_dataset(
        ds,
        options,
        progress=progress,
        attrs={"config_hash": config_hash, "analysis": "store", "source": str(qk_path)},
        what=str(qk_path),
    )
    ds.close()
    write_netcdf(out, out_path)
    return out


def decompose_step(job) -> None:
    """Rule decompose's job (the store path; a :class:`posgen.workflow.job.StepJob`)."""
    p = job.params
    decompose_store(
        job.input["qk"], job.output["decomposition"], DecompositionOptions.of(p), config_hash=p["config_hash"]
    )
