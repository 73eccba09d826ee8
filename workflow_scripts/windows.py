from pathlib import Path

from _common import setup

setup(snakemake)
from posgen.corpus import windows_job  # noqa: E402

p = snakemake.params
windows_job(
    Path(snakemake.input.manifest).parent,
    snakemake.output.windows,
    source=p.source,
    n_samples=p.n_samples,
    seq_len=p.seq_len,
    seed=p.seed,
    heldout=p.heldout,
    model_name=snakemake.wildcards.model,
    config_hash=p.config_hash,
)
