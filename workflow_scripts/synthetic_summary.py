from _common import setup

setup(snakemake)
from posgen.synthetic.summary import write_summary  # noqa: E402

o = snakemake.output
write_summary(dict(snakemake.input.items()), o.csv, o.classifiers, o.deposit, config_hash=snakemake.params.config_hash)
