from _common import setup

setup(snakemake)
from posgen.synthetic.tasks import write_task  # noqa: E402

p = snakemake.params
write_task(p.task, p.options, p.options["data_seed"], snakemake.output.data, p.config_hash)
