from _common import setup

setup(snakemake, uses_torch=True)
from posgen.llm.examples import examples_job  # noqa: E402

examples_job(
    snakemake.input.qk,
    snakemake.input.decomposition,
    snakemake.output.examples,
    options={key: snakemake.params[key] for key in ("sample", "map_tokens", "pool_pairs", "seed")},
    model=snakemake.wildcards.model,
    variant=snakemake.wildcards.variant,
    config_hash=snakemake.params.config_hash,
)
