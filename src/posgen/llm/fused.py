"""The fused path: decomposition.nc and bands.nc computed inside the extraction job (docs/method.md, "Fused and
store paths").

The store path writes every window's pre-RoPE q/k to qk.h5 and the decompose and bands jobs read them back; at
paper scale that is ~85 GB per (model, variant). Here each window's q/k, still in memory after its forward pass,
go through the same :class:`~posgen.decomposition.table.DecompositionTable` and :class:`~posgen.llm.bands.BandTable` layer by
layer, on the analysis device, and are dropped; qk.h5 keeps only the windows asked for (``extract.keep_qk``).
Both paths run the same code on the same float32 values, so they give the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import xarray as xr

from posgen.decomposition import Decomposer, DecompositionOptions, DecompositionTable
from posgen.llm.bands import BandTable
from posgen.rope_table import PARAMETERS, ROPE_VARIABLES, RopeTable
from posgen.store import write_netcdf


def rope_dataset(rope: RopeTable, n_tokens: int, n_kv_heads: int) -> xr.Dataset:
    """qk.h5's per-layer RoPE variables that the statistics read, as a dataset named like qk.h5 (what
    :class:`~posgen.llm.bands.BandTable` reads on the fused path)."""
    data = {name: (ROPE_VARIABLES[name][0], getattr(rope, name)) for name in PARAMETERS}
    n_layers, n_band = rope.inv_freq.shape
    coords = {
        "layer": np.arange(n_layers),
        "head": np.arange(rope.n_heads),
        "kv_head": np.arange(n_kv_heads),
        "band": np.arange(n_band),
        "token": np.arange(n_tokens),
    }
    return xr.Dataset(data, coords=coords)


class Analysis:
    """What the decompose and bands jobs compute, fed window by window from the extraction (the fused path).

    ``options`` as in :func:`posgen.decomposition.table.decompose_store` (``bound_samples`` counts global window
    indices, as there).
    """

    def __init__(
        self,
        options: DecompositionOptions,
        *,
        decomposition_path: str | Path,
        bands_path: str | Path,
        config_hash: str = "",
    ):
        self.decomposition_path = Path(decomposition_path)
        self.bands_path = Path(bands_path)
        self.decomposer = Decomposer.from_options(options)
        self.bound_samples = options.bound_samples
        self.config_hash = config_hash
        self.decomposition: DecompositionTable | None = None
        self.bands: BandTable | None = None

    def start(
        self, rope: RopeTable, n_tokens: int, n_kv_heads: int, samples, heldout_coef=None, heldout_windows: int = 0
    ) -> None:
        """Called once the model's RoPE table is known (after the first forward pass); ``heldout_coef`` the
        coefficients of the mean key over ``heldout_windows`` held-out windows (qk.h5's ``k_heldout_coef``), or
        None."""
        samples = np.asarray(samples, dtype=np.int64)
        self.decomposition = DecompositionTable(
            self.decomposer,
            rope,
            samples,
            n_tokens,
            self.bound_samples,
            heldout_coef=heldout_coef,
            heldout_windows=heldout_windows,
        )
        self.bands = BandTable(rope_dataset(rope, n_tokens, n_kv_heads), len(samples))

    def add(self, sample: int, q: np.ndarray, k: np.ndarray) -> None:
        """Window ``sample`` (global index): q (layer, head, token, dim), k (layer, kv_head, token, dim)."""
        on_device = self.decomposer.device.type != "cpu"  # a GPU: each layer copied there once, for both tables
        for layer in range(q.shape[0]):
            q_l, k_l = q[layer], k[layer]
            if on_device:
                q_l, k_l = (torch.as_tensor(x).to(self.decomposer.device) for x in (q_l, k_l))
            self.decomposition.add(sample, layer, q_l, k_l)
            self.bands.add(layer, q_l, k_l)
        self.decomposition.flush()  # the window's statistics to the host in one copy

    def write(self, attrs: dict) -> None:
        """decomposition.nc and bands.nc, each with ``attrs`` (qk.h5's carried attrs) in its provenance."""
        source = {"config_hash": self.config_hash, "analysis": "fused", **attrs}
        write_netcdf(self.decomposition.dataset(source), self.decomposition_path)
        write_netcdf(self.bands.dataset(source), self.bands_path)
