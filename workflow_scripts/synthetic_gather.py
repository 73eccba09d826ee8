from _common import setup

setup(snakemake)
from posgen.synthetic.analysis import gather, gather_training  # noqa: E402

i, o, p = snakemake.input, snakemake.output, snakemake.params
gather(list(i.ablation), o.ablation, config_hash=p.config_hash)
gather(list(i.toeplitz), o.toeplitz, config_hash=p.config_hash)
gather_training(list(i.curves), p.classifiers, o.training, config_hash=p.config_hash)
