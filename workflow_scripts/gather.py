from _common import setup

setup(snakemake)
from posgen.shards import gather  # noqa: E402

gather(snakemake.input, snakemake.output[0])
