from _common import setup

setup(snakemake)
from posgen.llm.summary import concat_tables  # noqa: E402

concat_tables(snakemake.input.csv, snakemake.output.csv)
