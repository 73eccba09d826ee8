from _common import setup

setup(snakemake, uses_torch=True)
from posgen.synthetic.analysis import ablation_job  # noqa: E402

p = snakemake.params
ablation_job(
    snakemake.input.data,
    list(snakemake.input.checkpoints),
    p.classifiers,
    snakemake.output.ablation,
    device=p.device,
    config_hash=p.config_hash,
)
