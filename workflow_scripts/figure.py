from _common import setup

setup(snakemake)
from posgen.figures import render  # noqa: E402

p = snakemake.params
render(
    p.figure,
    dict(snakemake.input.items()),
    snakemake.output.png,
    snakemake.output.pdf,
    variants=p.get("variants", []),
    n_boot=p.get("n_boot", 1000),
    seed=p.get("seed", 0),
    model=snakemake.wildcards.model,
    config_hash=p.config_hash,
)
