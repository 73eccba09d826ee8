from _common import setup

setup(snakemake)
from posgen.llm.bands import band_stats  # noqa: E402

band_stats(snakemake.input.qk, snakemake.output.bands, config_hash=snakemake.params.config_hash)
