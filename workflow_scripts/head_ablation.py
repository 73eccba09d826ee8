from _common import model_job, setup

setup(snakemake, uses_torch=True)
from posgen.llm.head_ablation import head_ablation_job  # noqa: E402

p = snakemake.params
head_ablation_job(
    model_job(snakemake),
    snakemake.input.decomposition,
    n_samples=p.n_samples,
    seq_len=p.seq_len,
    probe_samples=p.probe_samples,
    probe_period=p.probe_period,
    seed=p.seed,
    probes=p.probes,
)
