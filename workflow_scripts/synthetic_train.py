from _common import listed, setup

setup(snakemake, uses_torch=True, large_blocks=True)
from posgen.synthetic.train import train_job  # noqa: E402

# params.classifiers: [pe, seed] of each output pair, in order. One train_job per PE's seeds where they train as
# one ensemble, else one per classifier, each as it would train alone (synthetic.jobs: task runs many in turn).
p = snakemake.params
outputs = list(zip(listed(snakemake.output.checkpoints), listed(snakemake.output.curves), strict=True))
runs = {}
for (pe, seed), files in zip(p.classifiers, outputs, strict=True):
    key = pe if p.ensemble else (pe, seed)
    runs.setdefault(key, (pe, {}))[1][int(seed)] = files
for pe, files_by_seed in runs.values():
    train_job(
        snakemake.input.data,
        files_by_seed,
        pe=pe,
        options=p.options,
        experiment=p.experiment,
        device=p.device,
        config_hash=p.config_hash,
    )
