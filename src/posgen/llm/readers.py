"""The first paper's result readers (below reproduction.md, the scale study, the replication and the head atlas,
which read them): the perturbation and cap tables as the verdicts need them, with intervals over windows; the
per-head columns each step adds to results/heads.parquet (a step's ``heads``, posgen.workflow.steps); and files
keyed by the model and variant their attrs name."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posgen.llm.bands import band_shares, low_frequency_share
from posgen.paths import owner
from posgen.stats import bootstrap_indices, interval
from posgen.store import open_dataset, require

N_BOOT, BOOT_SEED = 1000, 0  # the bootstrap over windows of the verdicts' intervals (as the summary's defaults)


@dataclass(frozen=True)
class Perturbation:
    """One (kind, rate) of a perturb.nc, means over samples: perplexity ratios on every target and on the kept
    ones (with the 95 % bootstrap interval over windows), and the share of the targets whose token or position
    id moved."""

    ratio: float
    kept: float
    moved: float
    kept_lo: float = np.nan
    kept_hi: float = np.nan


@dataclass(frozen=True)
class CapEffect:
    """One distance cap C of a cap.nc, means over samples (and layers): r between the capped and uncapped
    Method A terms f and g, the perplexity ratio, and 95 % bootstrap intervals over windows of g's r and of g's r
    less f's."""

    f_corr: float
    g_corr: float
    ratio: float
    g_lo: float = np.nan
    g_hi: float = np.nan
    gap_lo: float = np.nan
    gap_hi: float = np.nan


def _over_windows(per_sample) -> tuple[float, float]:
    """The 95 % percentile bootstrap interval over windows of the mean of ``per_sample (sample,)``."""
    values = np.asarray(per_sample, dtype=np.float64)
    idx = bootstrap_indices(len(values), N_BOOT, BOOT_SEED)
    _, lo, hi = interval(lambda v: np.nanmean(v, 0), values, idx)
    return float(lo), float(hi)


def perturbation_ratios(path) -> dict:
    """{(kind, rate): Perturbation} of a perturb.nc: the mean perplexity ratios over samples, on every target and
    on the kept targets (with its 95 % bootstrap interval over windows), and the share of positions 1..T-1 moved
    (posgen.llm.draws)."""
    ds = open_dataset(path, lazy=False)
    require(ds, ["ppl_ratio", "ppl_ratio_kept", "moved", "kind", "rate"], str(path))
    means = {name: ds[name].mean("sample") for name in ("ppl_ratio", "ppl_ratio_kept", "moved")}
    out = {}
    for kind in ds["kind"].values:
        for rate in ds["rate"].values:
            at = {name: float(mean.sel(kind=kind, rate=rate)) for name, mean in means.items()}
            kept = ds["ppl_ratio_kept"].sel(kind=kind, rate=rate).transpose("sample").values
            out[str(kind), round(float(rate), 9)] = Perturbation(
                at["ppl_ratio"],
                at["ppl_ratio_kept"],
                at["moved"],  # moved: a fraction of positions 1..T-1
                *_over_windows(kept),
            )
    ds.close()
    return out


def cap_effects(path) -> dict:
    """{cap: CapEffect} of a cap.nc: f_corr and g_corr (means over samples and layers), the perplexity ratio
    (mean over samples), and 95 % bootstrap intervals over windows of g_corr and of g_corr - f_corr."""
    ds = open_dataset(path, lazy=False)
    require(ds, ["f_corr", "g_corr", "ppl_ratio", "cap"], str(path))
    out = {}
    for cap in ds["cap"].values:
        f, g = (ds[name].sel(cap=cap) for name in ("f_corr", "g_corr"))
        g_windows = g.mean([d for d in g.dims if d != "sample"]).values  # (sample,): mean over layers
        gap_windows = (g - f).mean([d for d in g.dims if d != "sample"]).values
        out[int(cap)] = CapEffect(
            float(f.mean()),
            float(g.mean()),
            float(ds["ppl_ratio"].sel(cap=cap).mean()),
            *_over_windows(g_windows),
            *_over_windows(gap_windows),
        )
    ds.close()
    return out


def claim_tables(inputs) -> tuple[dict, dict, dict]:
    """The bands, perturbation and cap tables the first paper's claims read, ``{model: {variant: ...}}`` each, from
    a job's ``bands``, ``perturb`` and ``cap`` inputs (the scale study's and the replication's jobs)."""
    from posgen.workflow.job import listed  # the workflow's input lists, read only inside a job

    return (
        by_model_variant(listed(inputs["bands"]), band_shares),
        by_model_variant(listed(inputs["perturb"]), perturbation_ratios),
        by_model_variant(listed(inputs["cap"]), cap_effects),
    )


def by_model_variant(paths, read) -> dict:
    """{model: {variant: read(path)}} over per-variant files (posgen.paths.owner: their model and variant from
    their path, which every read of a .nc checks against its recorded identity)."""
    out: dict = {}
    for path in paths:
        model, variant = owner(path)
        out.setdefault(model, {})[variant] = read(path)
    return out


# ------------------------------------------------------------------- per-head columns (results/heads.parquet)


def band_columns(path) -> dict[str, np.ndarray]:
    """(layer, head) low-frequency shares of a bands.nc's queries' and keys' token variance (posgen.llm.bands); a
    query head reads KV head ``head // (heads / kv_heads)`` (grouped-query attention)."""
    bands = open_dataset(path, lazy=False)
    require(bands, ["q_var", "k_var", "theta"], str(path))
    theta = bands["theta"].transpose("layer", "band").values
    q_var = bands["q_var"].transpose("layer", "head", "band").values
    k_var = bands["k_var"].transpose("layer", "kv_head", "band").values
    low_q = np.stack([low_frequency_share(q_var[i], theta[i]) for i in range(len(theta))])
    low_k = np.stack([low_frequency_share(k_var[i], theta[i]) for i in range(len(theta))])
    group = q_var.shape[1] // k_var.shape[1]
    return {"low_share_q": low_q, "low_share_k": low_k[:, np.arange(q_var.shape[1]) // group]}


def block_swap_columns(path) -> dict[str, np.ndarray]:
    """(layer, head) block-swap score of a block_swap.nc (1 positional, 0 semantic; posgen.llm.block_swap)."""
    swap = open_dataset(path, lazy=False)
    require(swap, ["positional_score"], str(path))
    return {"positional_score": swap["positional_score"].transpose("layer", "head").values}


def head_ablation_columns(path) -> dict[str, np.ndarray]:
    """(layer, head) loss increase (nats) of a head_ablation.nc, one column per probe: ``loss_increase_<probe>``."""
    ablation = open_dataset(path, lazy=False)
    require(ablation, ["loss_increase"], str(path))
    increase = ablation["loss_increase"].transpose("probe", "layer", "head")
    return {f"loss_increase_{probe}": increase.sel(probe=probe).values for probe in ablation["probe"].values.tolist()}


def band_intervention_columns(path) -> dict[str, np.ndarray]:
    """(layer, head) KL of the head's attention rows under each band setting of a band_interventions.nc (mean over
    windows; posgen.llm.band_interventions), one column per setting: ``band_kl_<setting>``."""
    ds = open_dataset(path, lazy=False)
    require(ds, ["kl"], str(path))
    kl = ds["kl"].mean("sample").transpose("setting", "layer", "head")
    return {f"band_kl_{s}": kl.sel(setting=s).values for s in ds["setting"].values.tolist() if s != "none"}
