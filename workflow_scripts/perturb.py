from _common import model_job, picked, setup

setup(snakemake, uses_torch=True)
from posgen.llm.perturb import perturb_job  # noqa: E402

names = ("n_samples", "seq_len", "rates", "seed", "jitter", "dummy_distance")
perturb_job(model_job(snakemake), **picked(snakemake.params, *names))
