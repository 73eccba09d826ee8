from pathlib import Path

from _common import setup

setup(snakemake, uses_torch=True)
from posgen.perturb import perturb_job  # noqa: E402
from posgen.shards import parse_shard  # noqa: E402

p = snakemake.params
perturb_job(
    Path(snakemake.input.manifest).parent,
    snakemake.input.windows,
    snakemake.output.nc,
    model_name=snakemake.wildcards.model,
    variant=snakemake.wildcards.variant,
    n_samples=p.n_samples,
    seq_len=p.seq_len,
    rates=p.rates,
    seed=p.seed,
    jitter=p.jitter,
    dummy_distance=p.dummy_distance,
    dtype=p.dtype,
    device=p.device,
    device_map=p.device_map or None,
    samples=parse_shard(snakemake.wildcards.shard),
    config_hash=p.config_hash,
)
