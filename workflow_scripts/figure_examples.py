from _common import setup

setup(snakemake, uses_torch=True)
from posgen.figures import write_examples  # noqa: E402

write_examples(
    snakemake.input.qk,
    snakemake.input.decomposition,
    snakemake.output.examples,
    options=snakemake.params.options,
    model=snakemake.wildcards.model,
    variant=snakemake.wildcards.variant,
    config_hash=snakemake.params.config_hash,
)
