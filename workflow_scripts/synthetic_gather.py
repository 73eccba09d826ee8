from _common import setup

setup(snakemake)
from posgen.synthetic.analysis import gather, gather_baselines, gather_training  # noqa: E402

i, o, p = snakemake.input, snakemake.output, snakemake.params
for part in ("ablation", "toeplitz", "probe"):
    gather(list(i[part]), o[part], config_hash=p.config_hash)
gather_training(list(i.training), p.classifiers, o.training, config_hash=p.config_hash)
gather_baselines(list(i.tasks), p.tasks, o.baselines, config_hash=p.config_hash)
