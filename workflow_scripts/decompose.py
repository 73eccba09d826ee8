from _common import setup

setup(snakemake, uses_torch=True)
from posgen.decomposition import decompose_store  # noqa: E402

p = snakemake.params
decompose_store(
    snakemake.input.qk,
    snakemake.output.decomposition,
    dummy_distances=p.dummy_distances,
    dummy_distance=p.dummy_distance,
    device=p.device,
    lstsq_tol=p.lstsq_tol,
    precision=p.precision,
    bound_rows=p.bound_rows,
    bound_samples=p.bound_samples,
    config_hash=p.config_hash,
)
