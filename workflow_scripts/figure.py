from _common import setup

setup(snakemake)
from posgen.figures.registry import render  # noqa: E402

p = snakemake.params
render(
    p.figure,
    dict(snakemake.input.items()),
    snakemake.output.png,
    snakemake.output.pdf,
    variants=p.variants,
    n_boot=p.n_boot,
    seed=p.seed,
    **dict(snakemake.wildcards.items()),  # model (and variant) for the provenance; none for a global figure
    config_hash=p.config_hash,
)
