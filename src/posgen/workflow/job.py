"""The job a step's runner is handed (posgen.workflow.steps: ``runner``): its input and output files by role, its
params, wildcards and threads, as Snakemake gives them to ``workflow_scripts/step.py``; a test or notebook builds
one directly. Light on purpose: no torch, no xarray."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path


class Named(dict):
    """A mapping whose keys read as attributes too (``job.input.qk``), as Snakemake's named lists."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def listed(paths) -> list:
    """A role's files as a list: one path (a str) or many."""
    return [paths] if isinstance(paths, (str, Path)) else list(paths)


@dataclasses.dataclass(frozen=True)
class StepJob:
    """One job of a step: ``input`` and ``output`` (role -> path or paths), ``params`` and ``wildcards`` (name ->
    value), ``threads``."""

    input: Named
    output: Named
    params: Named
    wildcards: Named
    threads: int = 1

    @classmethod
    def of(cls, input=None, output=None, params=None, wildcards=None, threads: int = 1) -> StepJob:
        return cls(*(Named(dict(x or {})) for x in (input, output, params, wildcards)), threads=threads)


def resolve(name: str):
    """The object ``"module:attribute"`` names (a step's runner, a figure's drawing function or loader)."""
    module, _, attribute = name.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as err:
        raise LookupError(f"{name}: no such function ({err})") from None
