"""The options of the first paper's model jobs (extract, perturb, cap, head_ablation, band_interventions), each step's as one frozen
value that its job function takes, as the decomposition's job takes
:class:`posgen.decomposition.options.DecompositionOptions`: built from the job's params in one place (:meth:`of`),
or at the schema's defaults for a caller outside the workflow (:meth:`defaults`).

A class's fields are the params its job reads, named as the step's params (posgen.workflow.steps): the fields are
the one list of those names. Standard library only (no torch): the API and the tests build them before a model
loads.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """A step's options; ``STEP`` names the step (posgen.workflow.steps.STEPS) whose params and config leaves its
    fields are. A field without a default is a config leaf of the step; one with a default is not (its default
    holds outside the workflow)."""

    STEP: ClassVar[str] = ""

    def __post_init__(self):
        # frozen: config lists become hashable tuples (every job reads them as sequences)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, list):
                object.__setattr__(self, field.name, tuple(value))

    @classmethod
    def of(cls, params, **overrides):
        """The options from a job's params (a mapping holding every field's name), but ``overrides``."""
        names = [field.name for field in dataclasses.fields(cls) if field.name not in overrides]
        return cls(**{name: params[name] for name in names}, **overrides)

    @classmethod
    def defaults(cls, **overrides):
        """The schema's default of every config leaf among the fields (the others' own defaults), but
        ``overrides`` (a caller outside the workflow: ``ExtractOptions.defaults(check_tokens=0)``)."""
        from posgen.config import schema_default
        from posgen.workflow.steps import STEPS

        fields = dataclasses.fields(cls)
        unknown = sorted(set(overrides) - {field.name for field in fields})
        if unknown:
            known = ", ".join(field.name for field in fields)
            raise TypeError(f"{cls.__name__}: not an option of {cls.STEP}: {', '.join(unknown)} (known: {known})")
        leaves = STEPS[cls.STEP].leaves
        required = [f.name for f in fields if f.default is dataclasses.MISSING and f.name not in overrides]
        return cls(**{name: schema_default(leaves[name]) for name in required}, **overrides)


@dataclasses.dataclass(frozen=True)
class ExtractOptions(JobOptions):
    """:func:`posgen.llm.extract.extract`'s options (config ``extract.<name>``, described in that module's doc):
    the reference windows and layers, the self-check's and the transparency check's tolerance and tokens, qk.h5's
    gzip level and q/k dtype; ``first_token`` (a models entry's key) and ``keep_qk`` (None: every window's q/k)."""

    STEP: ClassVar[str] = "extract"

    ref_samples: tuple[int, ...]
    ref_layers: tuple[int, ...]
    check_rtol: float
    check_tokens: int
    transparency_tokens: int
    transparency_rtol: float
    compression: int
    qk_dtype: str
    first_token: str = "model"
    keep_qk: int | None = None

    @classmethod
    def of(cls, params, **overrides):
        """The options of rule extract's job: ``keep_qk`` holds on the fused path only (extract.analysis: fused),
        and "all" keeps every window's."""
        fused = params["analysis"] == "fused"
        keep_qk = params["keep_qk"] if fused and params["keep_qk"] != "all" else None
        return super().of(params, **{"keep_qk": keep_qk, **overrides})


@dataclasses.dataclass(frozen=True)
class PerturbOptions(JobOptions):
    """:func:`posgen.llm.perturb.perturb_job`'s options: the first ``n_samples`` windows cut to ``seq_len``
    tokens, perturbed at each of ``rates`` (draws seeded by ``seed``, positions moved by up to ``jitter``), f/g
    read at the dummy distance ``dummy_distance``."""

    STEP: ClassVar[str] = "perturb"

    n_samples: int
    seq_len: int
    rates: tuple[float, ...]
    seed: int
    jitter: int
    dummy_distance: int


@dataclasses.dataclass(frozen=True)
class CapOptions(JobOptions):
    """:func:`posgen.llm.perturb.cap_job`'s options: the perturbation's windows, RoPE distances capped at each of
    ``distance_caps`` (config ``perturb.caps``), f/g read at ``dummy_distance``."""

    STEP: ClassVar[str] = "cap"

    n_samples: int
    seq_len: int
    distance_caps: tuple[int, ...]
    dummy_distance: int


@dataclasses.dataclass(frozen=True)
class HeadAblationOptions(JobOptions):
    """:func:`posgen.llm.head_ablation.head_ablation_job`'s options: the first ``n_samples`` windows cut to
    ``seq_len`` tokens, and the probes (``probes``; the repeat probe's ``probe_samples`` sequences of period
    ``probe_period``, drawn with ``seed``)."""

    STEP: ClassVar[str] = "head_ablation"

    n_samples: int
    seq_len: int
    probe_samples: int
    probe_period: int
    seed: int
    probes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class BandOptions(JobOptions):
    """:func:`posgen.llm.band_interventions.band_job`'s options: the first ``n_samples`` windows cut to ``seq_len``
    tokens, each band setting of ``shares`` (from below and from above) and, with ``ablate``, each quarter zeroed
    (posgen.llm.band_settings.grid); the decomposition's options that Method A's reading of each setting's
    logits takes (config ``decomposition``) and the tolerance of the logits rebuilt before it (``extract.check_rtol``)."""

    STEP: ClassVar[str] = "band_interventions"

    n_samples: int
    seq_len: int
    shares: tuple[float, ...]
    ablate: bool
    dummy_distances: tuple[int, ...]
    dummy_distance: int
    lstsq_tol: float
    precision: str
    check_rtol: float
