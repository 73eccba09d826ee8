from _common import setup

setup(snakemake)
from posgen.integrity import made_from  # noqa: E402
from posgen.synthetic.analysis import gather, gather_baselines, gather_training  # noqa: E402

# each gathered file records only the files it was gathered from
i, o, p = snakemake.input, snakemake.output, snakemake.params
for part in ("ablation", "toeplitz", "probe"):
    with made_from(i[part]):
        gather(list(i[part]), o[part], config_hash=p.config_hash)
with made_from(i.training):
    gather_training(list(i.training), p.classifiers, o.training, config_hash=p.config_hash)
with made_from(i.tasks):
    gather_baselines(list(i.tasks), p.tasks, o.baselines, config_hash=p.config_hash)
