from _common import setup

setup(snakemake)
from posgen.summary import summarize  # noqa: E402

p = snakemake.params
summarize(
    snakemake.input.decomposition,
    snakemake.output.csv,
    dict(zip(p.models, snakemake.output.nc)),
    n_boot=p.decomposition["bootstrap"],
    seed=p.decomposition["bootstrap_seed"],
    config_hash=p.config_hash,
)
