from _common import setup

setup(snakemake)
from posgen.figures import write_reproduction  # noqa: E402

write_reproduction(
    snakemake.input.summary,
    snakemake.output.csv,
    snakemake.output.md,
    snakemake.input.synthetic_summary,
    snakemake.output.synthetic_csv,
    config_hash=snakemake.params.config_hash,
)
