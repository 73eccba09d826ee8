from pathlib import Path

from _common import setup

setup(snakemake, uses_torch=True)
from posgen.perturb import perturb_job  # noqa: E402

p = snakemake.params
perturb_job(
    Path(snakemake.input.manifest).parent,
    snakemake.input.windows,
    snakemake.output.nc,
    model_name=snakemake.wildcards.model,
    variant=snakemake.wildcards.variant,
    n_samples=p.perturb["n_samples"],
    seq_len=p.perturb["seq_len"],
    rates=p.perturb["rates"],
    seed=p.perturb["seed"],
    jitter=p.perturb["jitter"],
    dummy_distance=p.default_D,
    dtype=p.dtype,
    device=p.device,
    config_hash=p.config_hash,
)
