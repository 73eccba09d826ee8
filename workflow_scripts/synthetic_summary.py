from _common import setup

setup(snakemake)
from posgen.synthetic.analysis import write_summary  # noqa: E402

i, p = snakemake.input, snakemake.params
write_summary(
    i.training, i.ablation, i.toeplitz, snakemake.output.csv, n_boot=p.intervals["bootstrap"], seed=p.intervals["seed"]
)
