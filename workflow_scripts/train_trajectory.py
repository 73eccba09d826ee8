from pathlib import Path

from _common import setup

setup(snakemake, uses_torch=True)
from posgen.trajectory.train import train_job  # noqa: E402

p = snakemake.params
train_job(
    p.source,
    Path(snakemake.output.manifest).parent,
    snakemake.output.training,
    train=p.train,
    model=snakemake.wildcards.model,
    config_hash=p.config_hash,
)
