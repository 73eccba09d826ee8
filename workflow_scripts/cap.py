from _common import model_job, picked, setup

setup(snakemake, uses_torch=True)
from posgen.llm.perturb import cap_job  # noqa: E402

cap_job(model_job(snakemake), **picked(snakemake.params, "n_samples", "seq_len", "distance_caps", "dummy_distance"))
