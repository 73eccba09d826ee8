from _common import setup

setup(snakemake)
from posgen.synthetic.verdicts import write_verdicts  # noqa: E402

write_verdicts(snakemake.input.classifiers, snakemake.output.md, snakemake.params.title)
