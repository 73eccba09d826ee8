from _common import setup

setup(snakemake, uses_torch=True)
from posgen.synthetic.train import train_job  # noqa: E402


def listed(paths):
    return [paths] if isinstance(paths, str) else list(paths)


p = snakemake.params
outputs = zip(listed(snakemake.output.checkpoints), listed(snakemake.output.curves), strict=True)
train_job(
    snakemake.input.data,
    dict(zip(p.seeds, outputs, strict=True)),
    pe=snakemake.wildcards.pe,
    options=p.options,
    experiment=p.experiment,
    device=p.device,
    config_hash=p.config_hash,
)
