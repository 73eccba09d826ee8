from _common import setup

setup(snakemake, uses_torch=True)
from posgen.synthetic.train import train_job  # noqa: E402

p, w = snakemake.params, snakemake.wildcards
train_job(
    snakemake.input.data,
    snakemake.output.checkpoint,
    snakemake.output.curves,
    pe=w.pe,
    seed=int(w.seed),
    options=p.options,
    experiment=w.experiment,
    device=p.device,
    config_hash=p.config_hash,
)
