from _common import decomposition_options, setup

setup(snakemake, uses_torch=True)
from posgen.decomposition import decompose_store  # noqa: E402

p = snakemake.params
decompose_store(snakemake.input.qk, snakemake.output.decomposition, decomposition_options(p), config_hash=p.config_hash)
