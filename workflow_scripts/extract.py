from pathlib import Path

from _common import setup

setup(snakemake, uses_torch=True)
from posgen.extract import extract  # noqa: E402

p = snakemake.params
extract(
    Path(snakemake.input.manifest).parent,
    snakemake.input.windows,
    snakemake.output.qk,
    model_name=snakemake.wildcards.model,
    variant=snakemake.wildcards.variant,
    dtype=p.dtype,
    device=p.device,
    ref_samples=p.ref_samples,
    ref_layers=p.ref_layers,
    check_rtol=p.check_rtol,
    check_tokens=p.check_tokens,
    transparency_tokens=p.transparency_tokens,
    transparency_rtol=p.transparency_rtol,
    compression=p.compression,
    config_hash=p.config_hash,
)
