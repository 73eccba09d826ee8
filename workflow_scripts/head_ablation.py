from pathlib import Path

from _common import setup

setup(snakemake, uses_torch=True)
from posgen.head_ablation import head_ablation_job  # noqa: E402

p = snakemake.params
head_ablation_job(
    Path(snakemake.input.manifest).parent,
    snakemake.input.windows,
    snakemake.input.decomposition,
    snakemake.output.nc,
    model_name=snakemake.wildcards.model,
    variant=snakemake.wildcards.variant,
    n_samples=p.n_samples,
    seq_len=p.seq_len,
    probe_samples=p.probe_samples,
    probe_period=p.probe_period,
    seed=p.seed,
    dtype=p.dtype,
    device=p.device,
    device_map=p.device_map or None,
    config_hash=p.config_hash,
)
