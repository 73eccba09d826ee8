from _common import setup

setup(snakemake)
from posgen.llm.gap_origin import write_origin  # noqa: E402

write_origin(snakemake.input.csv, snakemake.output.md, config_hash=snakemake.params.config_hash)
