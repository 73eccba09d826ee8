from _common import model_job, setup

setup(snakemake, uses_torch=True)
from posgen.extract import extract  # noqa: E402
from posgen.fused import Analysis  # noqa: E402

p = snakemake.params
out = snakemake.output
# the fused path when the rule writes the statistics too (extract.analysis: fused)
analysis = (
    Analysis(
        decomposition_path=out.decomposition,
        bands_path=out.bands,
        dummy_distances=p.dummy_distances,
        dummy_distance=p.dummy_distance,
        device=p.device,
        lstsq_tol=p.lstsq_tol,
        bound_samples=p.bound_samples,
        config_hash=p.config_hash,
    )
    if "decomposition" in out.keys()
    else None
)
extract(
    model_job(snakemake, out="qk"),
    ref_samples=p.ref_samples,
    ref_layers=p.ref_layers,
    check_rtol=p.check_rtol,
    check_tokens=p.check_tokens,
    transparency_tokens=p.transparency_tokens,
    transparency_rtol=p.transparency_rtol,
    compression=p.compression,
    keep_qk=None if p.keep_qk == "all" else p.keep_qk,
    qk_dtype=p.qk_dtype,
    analysis=analysis,
)
