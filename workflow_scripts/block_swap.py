from _common import setup

setup(snakemake, uses_torch=True)
from posgen.llm.block_swap import block_swap_job  # noqa: E402

block_swap_job(
    snakemake.input.qk, snakemake.input.decomposition, snakemake.output.block_swap, snakemake.params.config_hash
)
