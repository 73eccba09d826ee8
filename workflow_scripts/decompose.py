from _common import decomposition_options, setup

setup(snakemake, uses_torch=True)
from posgen.decomposition import decompose_store  # noqa: E402

decompose_store(snakemake.input.qk, snakemake.output.decomposition, **decomposition_options(snakemake.params))
