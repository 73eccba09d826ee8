from _common import decomposition_options, model_job, setup

setup(snakemake, uses_torch=True)
from posgen.llm.extract import OPTIONS, extract  # noqa: E402
from posgen.llm.fused import Analysis  # noqa: E402

p = snakemake.params
out = snakemake.output
# the fused path writes the shard's statistics too (extract.analysis: fused) and keeps q/k of the first keep_qk
# windows only; the store path keeps every window's
fused = p.analysis == "fused"
analysis = (
    Analysis(
        decomposition_options(p), decomposition_path=out.decomposition, bands_path=out.bands, config_hash=p.config_hash
    )
    if fused
    else None
)
extract(
    model_job(snakemake, out="qk"),
    **{name: p[name] for name in OPTIONS},
    first_token=p.first_token,
    keep_qk=p.keep_qk if fused and p.keep_qk != "all" else None,
    analysis=analysis,
)
