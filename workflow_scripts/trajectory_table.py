from _common import setup

setup(snakemake)
from posgen.trajectory.table import trajectory_job  # noqa: E402

p = snakemake.params
trajectory_job(
    snakemake.input.summary,
    snakemake.input.bands,
    snakemake.input.perturb,
    p.variants,
    snakemake.output.csv,
    snakemake.output.nc,
    sensitivity_rates=p.sensitivity_rates,
    training_path=snakemake.input.training or None,
    n_boot=p.n_boot,
    seed=p.seed,
    model=snakemake.wildcards.model,
    config_hash=p.config_hash,
)
