from _common import model_job, setup

setup(snakemake, uses_torch=True)
from posgen.perturb import cap_job  # noqa: E402

p = snakemake.params
cap_job(
    model_job(snakemake),
    n_samples=p.n_samples,
    seq_len=p.seq_len,
    distance_caps=p.distance_caps,
    dummy_distance=p.dummy_distance,
)
