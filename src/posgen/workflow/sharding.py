"""Shards (config ``shards``, docs/slurm.md): each (model, variant)'s windows, and its perturbation windows, split
into contiguous ranges ``<start>-<stop>`` (global window indices, stop exclusive), one job each; rule gather merges
their tables along ``sample`` (posgen.gather)."""

from __future__ import annotations

import itertools
import re

SHARD_NAME = re.compile(r"(\d+)-(\d+)")
# model jobs that run once per (model, variant) over their own section's n_samples windows: head_ablation's
# per-layer statistics of means over both probes cannot be gathered along `sample`; band_interventions runs
# its windows one at a time through one loaded model
UNSHARDED = ("head_ablation", "band_interventions")


def shard_ranges(n_samples: int, n_shards: int) -> list[tuple[int, int]]:
    """``n_shards`` contiguous ranges covering ``range(n_samples)``, sizes differing by at most one (the first
    ``n_samples % n_shards`` one window longer)."""
    if not 1 <= n_shards <= n_samples:
        raise ValueError(f"shards: {n_shards} must be between 1 and the {n_samples} windows")
    size, longer = divmod(n_samples, n_shards)
    stops = list(itertools.accumulate(size + (i < longer) for i in range(n_shards)))
    return list(zip([0] + stops[:-1], stops))


def shard_names(n_samples: int, n_shards: int) -> list[str]:
    return [f"{start}-{stop}" for start, stop in shard_ranges(n_samples, n_shards)]


def parse_shard(name: str) -> tuple[int, int]:
    """``'<start>-<stop>'`` -> (start, stop)."""
    match = SHARD_NAME.fullmatch(name)
    if not match or int(match[1]) >= int(match[2]):
        raise ValueError(f"shard {name!r}: not a window range <start>-<stop>")
    return int(match[1]), int(match[2])


def shard_of(sample: int, n_samples: int, n_shards: int) -> str:
    """The name of the shard that holds window ``sample``."""
    for start, stop in shard_ranges(n_samples, n_shards):
        if start <= sample < stop:
            return f"{start}-{stop}"
    raise IndexError(f"window {sample} is not one of the {n_samples} windows")


def rule_windows(rule: str, config: dict) -> int:
    """The windows a job of ``rule`` reads, all shards together: perturb and cap their own ``perturb.n_samples``,
    head_ablation and band_interventions their section's ``n_samples`` (one job each, not sharded), the others
    ``n_samples``."""
    if rule in ("perturb", "cap"):
        return config["perturb"]["n_samples"]
    if rule in UNSHARDED:
        return config[rule]["n_samples"]
    return config["n_samples"]


def rule_shards(rule: str, config: dict) -> list[tuple[int, int]]:
    """The window ranges of ``rule``'s jobs of one (model, variant): config ``shards`` of them, at most one window
    each. head_ablation and band_interventions are one job each (``UNSHARDED``)."""
    total = rule_windows(rule, config)
    if rule in UNSHARDED:
        return [(0, total)]
    return shard_ranges(total, min(config["shards"], total))


def shards_of(rule: str, config: dict) -> list[str]:
    """The shard names of ``rule``'s jobs (the ``shard`` wildcard)."""
    return [f"{start}-{stop}" for start, stop in rule_shards(rule, config)]


def figure_shard(config: dict) -> str:
    """The shard whose qk.h5 holds the example heads' window (figures.sample)."""
    return shard_of(config["figures"]["sample"], config["n_samples"], config["shards"])
