from _common import setup

setup(snakemake, uses_torch=True)
from posgen.decompose import decompose_store  # noqa: E402

p = snakemake.params
decompose_store(
    snakemake.input.qk,
    snakemake.output.decomposition,
    dummy_distances=p.decomposition["dummy_distances"],
    default_D=p.decomposition["default_D"],
    device=p.device,
    lstsq_tol=p.decomposition["lstsq_tol"],
    bound_samples=p.decomposition["bound_samples"],
    config_hash=p.config_hash,
)
