"""One model job's run, shared by every job that runs a model (extraction, perturbation, capping, head ablation), by
the Python API and by the tests' builders: which model variant runs on which windows, on which device, where its
output goes and what it records; and the skeleton every such job repeats: load the model (capturing or plain),
read the shard of its windows, run, record provenance, write atomically.

Built per job from the rule's files and params (:meth:`ModelRun.of_job`); a notebook or test builds one directly
(``posgen.testing.tiny.tiny_job``). Importing it imports no torch: the steps that need it load it when they run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from posgen.workflow.sharding import parse_shard


@dataclass(frozen=True)
class ModelRun:
    """One model job (docs/data-model.md for the files)."""

    model_dir: Path  # the acquired model folder, resources/models/<model>
    windows: Path | None  # its windows.h5 (None: a run on windows in memory, the Python API's)
    out: Path | None  # the job's output file (None: the caller keeps the result)
    model: str  # the config's model name, recorded in the output
    variant: str  # trained | random-seed<S> | step<N>
    dtype: str = "float32"  # config `dtype` of the forward pass
    device: str = "cpu"  # config `device`: auto | cpu | cuda
    device_map: str | None = None  # "auto": the model spread over the node's GPUs (a models entry's device_map)
    samples: tuple[int, int] | None = None  # the shard: window range (start, stop); None: every window
    config_hash: str = ""  # recorded in the output (posgen.config.job_hash)

    def __post_init__(self):
        for name in ("model_dir", "windows", "out"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        if self.samples is not None:
            object.__setattr__(self, "samples", (int(self.samples[0]), int(self.samples[1])))

    @classmethod
    def of_job(cls, job, out: str = "nc") -> ModelRun:
        """The run of a workflow job (a :class:`posgen.workflow.job.StepJob`): the model folder beside its
        manifest, the windows, output ``out``, the wildcards and the shared params (dtype, device, the model's
        device_map, config_hash); the shard wildcard, where the rule has one."""
        p, w = job.params, job.wildcards
        shard = w.get("shard")
        return cls(
            model_dir=Path(job.input["manifest"]).parent,
            windows=Path(job.input["windows"]),
            out=Path(job.output[out]),
            model=w["model"],
            variant=w["variant"],
            dtype=p["dtype"],
            device=p["device"],
            device_map=p["device_map"] or None,
            samples=parse_shard(shard) if shard else None,
            config_hash=p["config_hash"],
        )

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

    def load(self, capturing: bool = True, backend: str | None = None):
        """``(model, tokenizer, manifest)`` of the variant: with a capturing backend (``backend``, or the one its
        config needs), or with transformers' own attention (``capturing`` False)."""
        if capturing:
            from posgen.llm.capture import load_capturing

            return load_capturing(
                self.model_dir,
                self.variant,
                dtype=self.dtype,
                device=self.device,
                backend=backend,
                device_map=self.device_map,
            )
        from posgen.models import load_model

        return load_model(
            self.model_dir, self.variant, dtype=self.dtype, device=self.device, device_map=self.device_map
        )

    def token_windows(self, n_samples: int | None = None, seq_len: int | None = None, section: str = "perturb"):
        """(token ids of the shard's windows (n, T) int64, their global indices (n,)): the first ``n_samples``
        windows of windows.h5 cut to ``seq_len`` tokens (None: all), ``section`` naming the config section
        that asked for them in an error."""
        import numpy as np

        from posgen.corpus import read_windows

        windows = read_windows(self.windows, n_samples, seq_len, section=section)
        total = windows.sizes["sample"]
        start, stop = self.window_range(total, f"{section}.n_samples" if n_samples is not None else str(self.windows))
        return windows["token_id"].values[start:stop].astype(np.int64), np.arange(start, stop)

    def attrs(self, model, manifest: dict, **extra) -> dict:
        """The attrs that name the model, its weights, the pass's dtype and device and the job's config hash."""
        from posgen.models import manifest_attrs

        return {
            **manifest_attrs(manifest, model=self.model, variant=self.variant),
            "dtype": self.dtype,
            "device": str(model.device),
            **extra,
            "config_hash": self.config_hash,
        }

    def write(self, ds, model, manifest: dict, started: float, **extra):
        """``ds`` with provenance (:meth:`attrs`, its runtime since ``started``) written atomically to ``out``."""
        from posgen.store import provenance, write_netcdf

        ds.attrs = provenance(
            **ds.attrs, **self.attrs(model, manifest, **extra, runtime_s=round(time.perf_counter() - started, 2))
        )
        write_netcdf(ds, self.out)
        return ds
