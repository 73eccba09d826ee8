"""The per-step trajectory of one checkpoint series (rule trajectory_table): every headline statistic of the
first paper against training step, from the outputs the ordinary rules already wrote per variant.

- Method A and B r, mean over heads and pooled, with their 95 % bootstrap intervals: the model's summary.csv.
- variance explained by f alone and by g alone (Method A): summary.csv.
- low-frequency share of the token variance: from bands.nc, the fraction of the per-band token variance
  ``E ||v_t - mean||^2`` that sits in the lower-frequency half of the rotating bands (smaller theta), per
  (layer, head), then averaged; 0.5 when the variance is spread evenly, near 1 when the token-specific
  (semantic) variation lives in the low-frequency bands, the pattern of docs/method.md section 5.
- perturbation sensitivity: perplexity ratio (perturbed / clean) at ``sensitivity_rates``, per perturbation
  kind, mean over samples with a 95 % bootstrap interval (perturb.nc).
- held-out perplexity at each checkpoint (training.nc; a hub series has none).

The random-init control of a trained trajectory rides along with ``step = -1``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from posgen.config import variant_order, variant_step
from posgen.integrity import shown
from posgen.llm.bands import band_shares
from posgen.llm.summary import SHARE_COLUMNS
from posgen.stats import bootstrap_mean
from posgen.store import atomic_path, open_dataset, provenance, require, write_netcdf

RANDOM_STEP = -1  # `step` of the random-init control
SUMMARY_STATS = ["mean_r", "mean_r_lo", "mean_r_hi", "pooled_r", "pooled_r_lo", "pooled_r_hi"]


def summary_columns(summary_csv, variants: list[str]) -> tuple[dict, list, list]:
    """The trajectory's columns of the model's summary.csv, each variant's row: (variables, methods, sinks); r
    statistics per (variant, method, sink), Method A's f/g split and the position shares per (variant, sink)."""
    summary = pd.read_csv(summary_csv)
    missing = sorted(set(variants) - set(summary["variant"]))
    if missing:
        raise KeyError(f"{shown(summary_csv)}: no rows for variant(s) {', '.join(missing)}")
    methods = sorted(summary["method"].unique())
    sinks = sorted(summary["sink"].unique())
    indexed = summary.set_index(["variant", "method", "sink"])
    data = {}
    for stat in SUMMARY_STATS:
        values = np.array(
            [[[indexed.loc[(v, m, s), stat] for s in sinks] for m in methods] for v in variants], dtype=np.float64
        )  # (variant, method, sink)
        data[stat] = (("variant", "method", "sink"), values)
    for stat in ("r2_f", "r2_g", *SHARE_COLUMNS):  # per (variant, sink): Method A's f/g split, the position shares
        values = np.array([[indexed.loc[(v, "A", s), stat] for s in sinks] for v in variants], dtype=np.float64)
        data[stat] = (("variant", "sink"), values)
    return data, methods, sinks


def sensitivity(perturb_paths, variants: list[str], rates, n_boot: int, seed: int) -> tuple[dict, np.ndarray]:
    """The perplexity ratio of every perturbation kind at ``rates``, per variant (one perturb.nc each), mean over
    samples with its bootstrap interval: (variables (variant, kind, rate), kinds)."""
    ratios = []
    for path in perturb_paths:
        perturb = open_dataset(path, lazy=False)
        require(perturb, ["ppl_ratio"], str(path))
        absent = sorted(set(rates) - set(np.round(perturb["rate"].values, 9)))
        if absent:
            raise KeyError(f"{shown(path)}: no perturbation at rate(s) {absent} (trajectory.sensitivity_rates)")
        ratios.append(perturb["ppl_ratio"].sel(rate=list(rates)).load())
        perturb.close()
    stacked = xr.concat(ratios, dim=pd.Index(variants, name="variant"))  # (variant, kind, rate, sample)
    mean, lo, hi = bootstrap_mean(stacked, "sample", n_boot=n_boot, seed=seed)
    data = {
        name: (("variant", "kind", "rate"), values.transpose("variant", "kind", "rate").values)
        for name, values in (("ppl_ratio", mean), ("ppl_ratio_lo", lo), ("ppl_ratio_hi", hi))
    }
    return data, stacked["kind"].values


def heldout_perplexity(training_path, steps: list[int]) -> np.ndarray:
    """The held-out perplexity at each of ``steps`` from training.nc, (variant,); NaN where it has none (the
    random-init control, a hub series without training.nc: ``training_path`` None)."""
    if training_path is None:
        return np.full(len(steps), np.nan)
    training = open_dataset(training_path, lazy=False)
    require(training, ["heldout_ppl"], str(training_path))
    by_step = dict(zip(training["step"].values.tolist(), training["heldout_ppl"].values))
    training.close()
    return np.array([by_step.get(s, np.nan) for s in steps])


def trajectory_table(
    summary_csv,
    bands_paths,
    perturb_paths,
    variants,
    *,
    sensitivity_rates,
    training_path=None,
    n_boot: int = 1000,
    seed: int = 0,
) -> xr.Dataset:
    """The trajectory dataset: dims (variant, method, sink, kind, rate), coordinate ``step`` along variant.

    ``bands_paths`` and ``perturb_paths`` are one file per entry of ``variants``, in that order.
    """
    variants = list(variants)
    if not (len(bands_paths) == len(perturb_paths) == len(variants)):
        raise ValueError(
            f"{len(bands_paths)} bands and {len(perturb_paths)} perturb files for {len(variants)} variants"
        )
    order = sorted(range(len(variants)), key=lambda i: variant_order(variants[i]))
    variants = [variants[i] for i in order]
    bands_paths = [list(bands_paths)[i] for i in order]
    perturb_paths = [list(perturb_paths)[i] for i in order]
    steps = [RANDOM_STEP if variant_step(v) is None else variant_step(v) for v in variants]
    data, methods, sinks = summary_columns(summary_csv, variants)
    shares = [band_shares(p) for p in bands_paths]
    for side in "qk":
        data[f"low_share_{side}"] = ("variant", np.array([s[f"low_share_{side}"] for s in shares]))
    ratios, kinds = sensitivity(perturb_paths, variants, sensitivity_rates, n_boot, seed)
    data |= ratios
    data["heldout_ppl"] = ("variant", heldout_perplexity(training_path, steps))
    return xr.Dataset(
        data,
        coords={
            "variant": variants,
            "step": ("variant", np.array(steps, dtype=np.int64)),
            "method": methods,
            "sink": sinks,
            "kind": kinds,
            "rate": list(sensitivity_rates),
        },
        attrs={"random_init_step": RANDOM_STEP, "interval": "95% percentile bootstrap over samples"},
    )


def table_rows(ds: xr.Dataset) -> pd.DataFrame:
    """One CSV row per (variant, method, sink), in step order: r statistics, f/g split, band shares, held-out
    perplexity, and the perplexity ratio of every kind at every sensitivity rate (``ppl_<kind>_<percent>``)."""
    rows = []
    for v in ds["variant"].values:
        one = ds.sel(variant=v)
        extra = {
            f"ppl_{kind}_{rate * 100:g}pct": float(one["ppl_ratio"].sel(kind=kind, rate=rate))
            for kind in ds["kind"].values
            for rate in ds["rate"].values
        }
        for m in ds["method"].values:
            for s in ds["sink"].values:
                rows.append(
                    {
                        "variant": v,
                        "step": int(one["step"]),
                        "method": m,
                        "sink": s,
                        **{stat: float(one[stat].sel({"method": m, "sink": s})) for stat in SUMMARY_STATS},
                        "r2_f": float(one["r2_f"].sel(sink=s)) if m == "A" else np.nan,
                        "r2_g": float(one["r2_g"].sel(sink=s)) if m == "A" else np.nan,
                        **{stat: float(one[stat].sel(sink=s)) for stat in SHARE_COLUMNS},
                        "low_share_q": float(one["low_share_q"]),
                        "low_share_k": float(one["low_share_k"]),
                        "heldout_ppl": float(one["heldout_ppl"]),
                        **extra,
                    }
                )
    return pd.DataFrame(rows)


def trajectory_job(
    summary_csv,
    bands_paths,
    perturb_paths,
    variants,
    csv_path,
    nc_path,
    *,
    sensitivity_rates,
    training_path=None,
    n_boot: int = 1000,
    seed: int = 0,
    model: str = "",
    config_hash: str = "",
) -> xr.Dataset:
    """Rule trajectory_table: results/<model>/trajectory.nc and .csv."""
    ds = trajectory_table(
        summary_csv,
        bands_paths,
        perturb_paths,
        variants,
        sensitivity_rates=sensitivity_rates,
        training_path=training_path,
        n_boot=n_boot,
        seed=seed,
    )
    prov = provenance(config_hash=config_hash, model=model, n_boot=int(n_boot), bootstrap_seed=int(seed))
    ds.attrs.update(prov)
    write_netcdf(ds, nc_path)
    table = table_rows(ds).assign(model=model, config_hash=config_hash, posgen_version=prov["posgen_version"])
    with atomic_path(csv_path) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    return ds


def trajectory_table_step(job):
    """Rule trajectory_table's job (a :class:`posgen.workflow.job.StepJob`)."""
    p, i = job.params, job.input
    return trajectory_job(
        i["summary"],
        i["bands"],
        i["perturb"],
        p["variants"],
        job.output["csv"],
        job.output["nc"],
        sensitivity_rates=p["sensitivity_rates"],
        training_path=i.get("training") or None,
        n_boot=p["n_boot"],
        seed=p["seed"],
        model=job.wildcards["model"],
        config_hash=p["config_hash"],
    )
