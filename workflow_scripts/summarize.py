from _common import setup

setup(snakemake)
from posgen.llm.summary import summarize  # noqa: E402

p = snakemake.params
summarize(
    snakemake.input.decomposition,
    snakemake.output.csv,
    {snakemake.wildcards.model: snakemake.output.nc},
    n_boot=p.n_boot,
    seed=p.seed,
    config_hash=p.config_hash,
)
