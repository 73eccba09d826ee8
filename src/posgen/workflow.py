"""The workflow's shape, read by the Snakefile, rules/*.smk and posgen.plan: the config leaves each step reads.

Light on purpose: the Snakefile imports it while parsing, in an environment that may hold snakemake alone
(no torch, transformers, xarray, h5py, h5netcdf).
"""

from __future__ import annotations


def leaves(*paths: str, **named: str) -> dict[str, str]:
    """{param name: dotted config leaf}: each of ``paths`` under its last key, each of ``named`` under its name."""
    names = [path.rpartition(".")[2] for path in paths] + list(named)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"leaves: two leaves under the param name(s) {', '.join(twice)}")
    return {**{path.rpartition(".")[2]: path for path in paths}, **named}


INTERVALS = leaves(n_boot="intervals.bootstrap", seed="intervals.seed")

# The config leaves each step reads, once: a rule passes exactly these as params and its job's `config_hash`
# covers exactly these plus its own model's `models` entry (rules/common.smk: params_of), so editing any other
# key (a figure setting, another model) neither changes the hash nor reruns the job. Defaults live in the schema
# only (schemas/config.schema.yaml); the library's functions take every leaf as a required keyword argument.
STEP_LEAVES = {
    "windows": leaves("corpus.source", "n_samples", "seq_len", seed="window_seed"),
    "extract": leaves(
        "dtype",
        "device",
        "extract.ref_samples",
        "extract.ref_layers",
        "extract.check_rtol",
        "extract.check_tokens",
        "extract.transparency_tokens",
        "extract.transparency_rtol",
        "extract.compression",
        "extract.analysis",
        "extract.keep_qk",
        "extract.qk_dtype",
    ),
    "decompose": leaves(
        "decomposition.dummy_distances",
        "decomposition.dummy_distance",
        "decomposition.lstsq_tol",
        "decomposition.bound_samples",
        "device",
    ),
    "bands": leaves(),
    "perturb": leaves(
        "perturb.n_samples",
        "perturb.seq_len",
        "perturb.rates",
        "perturb.seed",
        "perturb.jitter",
        "decomposition.dummy_distance",
        "dtype",
        "device",
    ),
    "cap": leaves(
        "perturb.n_samples",
        "perturb.seq_len",
        "decomposition.dummy_distance",
        "dtype",
        "device",
        distance_caps="perturb.caps",
    ),
    "head_ablation": leaves(
        "head_ablation.n_samples",
        "head_ablation.seq_len",
        "head_ablation.probe_samples",
        "head_ablation.probe_period",
        "head_ablation.seed",
        "dtype",
        "device",
    ),
    "example_heads": leaves("figures.sample", "figures.map_tokens", "figures.pool_pairs", "figures.seed"),
    "summarize": INTERVALS,
    "synthetic_summary": INTERVALS,
    "train_trajectory": leaves(source="corpus.source"),
    "trajectory_table": leaves("trajectory.sensitivity_rates", **INTERVALS),
}


def step_leaves(step: str, config: dict) -> dict[str, str]:
    """The leaves ``step`` reads under ``config``: the fused extraction (extract.analysis: fused) also reads what
    the decompose and bands jobs read, since it writes their files."""
    out = dict(STEP_LEAVES[step])
    if step == "extract" and config["extract"]["analysis"] == "fused":
        for other in ("decompose", "bands"):
            for name, path in STEP_LEAVES[other].items():
                if out.setdefault(name, path) != path:
                    raise ValueError(f"step_leaves: param {name!r} of extract and {other} reads two leaves")
    return out
