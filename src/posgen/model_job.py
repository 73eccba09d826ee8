"""The context every model job shares (extraction, perturbation, capping, head ablation): which model variant
runs on which windows, on which device, where its output goes and what it records.

Built once per job by the workflow scripts (``workflow_scripts/_common.py: model_job``) from the rule's input,
output, wildcards and params; a notebook or test builds one directly. Each job's own options stay separate
keyword arguments of its function. Light on purpose: no torch, no xarray.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelJob:
    """One model job's context (docs/data-model.md for the files)."""

    model_dir: Path  # the acquired model folder, resources/models/<model>
    windows: Path  # its windows.h5
    out: Path  # the job's output file
    model: str  # the config's model name, recorded in the output
    variant: str  # trained | random-seed<S> | step<N>
    dtype: str  # config `dtype` of the forward pass
    device: str  # config `device`: auto | cpu | cuda
    device_map: str | None = None  # "auto": the model spread over the node's GPUs (a models entry's device_map)
    samples: tuple[int, int] | None = None  # the shard: window range (start, stop); None: every window
    config_hash: str = ""  # recorded in the output (posgen.config.job_hash)

    def __post_init__(self):
        for name in ("model_dir", "windows", "out"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        if self.samples is not None:
            object.__setattr__(self, "samples", (int(self.samples[0]), int(self.samples[1])))

    @property
    def label(self) -> str:
        """``<model>/<variant>``, for progress bars."""
        return f"{self.model}/{self.variant}"

    def window_range(self, n_windows: int, of: str) -> tuple[int, int]:
        """The shard's (start, stop) among ``n_windows`` windows (``of``: where they come from, for the error)."""
        start, stop = self.samples if self.samples is not None else (0, n_windows)
        if not 0 <= start < stop <= n_windows:
            raise ValueError(f"shard {start}-{stop}: outside the {n_windows} windows of {of}")
        return start, stop
