from _common import setup

setup(snakemake)
from posgen.synthetic.summary import write_summary  # noqa: E402

p = snakemake.params
write_summary(
    dict(snakemake.input.items()),
    snakemake.output.csv,
    snakemake.output.deposit,
    n_boot=p.n_boot,
    seed=p.seed,
    config_hash=p.config_hash,
)
