from _common import setup

setup(snakemake, uses_torch=True)
from posgen.synthetic.analysis import analyse_job  # noqa: E402

p, w = snakemake.params, snakemake.wildcards
analyse_job(
    snakemake.input.data,
    snakemake.input.checkpoint,
    snakemake.input.curves,
    dict(snakemake.output.items()),
    key=(w.experiment, w.task, w.pe, int(w.seed)),
    options=p.options,
    device=p.device,
    config_hash=p.config_hash,
)
