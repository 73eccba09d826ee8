from _common import setup

setup(snakemake, uses_torch=True)
from posgen.synthetic.analysis import toeplitz_job  # noqa: E402

p = snakemake.params
toeplitz_job(
    snakemake.input.data,
    list(snakemake.input.checkpoints),
    p.classifiers,
    snakemake.output.toeplitz,
    n_samples=p.n_samples,
    device=p.device,
    config_hash=p.config_hash,
)
