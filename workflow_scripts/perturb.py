from _common import model_job, setup

setup(snakemake, uses_torch=True)
from posgen.perturb import perturb_job  # noqa: E402

p = snakemake.params
perturb_job(
    model_job(snakemake),
    n_samples=p.n_samples,
    seq_len=p.seq_len,
    rates=p.rates,
    seed=p.seed,
    jitter=p.jitter,
    dummy_distance=p.dummy_distance,
)
