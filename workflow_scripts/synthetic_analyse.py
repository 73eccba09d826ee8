from _common import listed, setup

setup(snakemake, uses_torch=True, large_blocks=True)
from posgen.integrity import made_from  # noqa: E402
from posgen.synthetic.analysis import analyse_job  # noqa: E402

# params.classifiers: [pe, seed] of each checkpoint, in order (synthetic.jobs: task analyses many in turn)
p, inputs, out = snakemake.params, snakemake.input, snakemake.output
files = zip(
    listed(inputs.checkpoint),
    listed(inputs.curves),
    listed(out.ablation),
    listed(out.toeplitz),
    listed(out.probe),
    strict=True,
)
for (pe, seed), (checkpoint, curves, ablation, toeplitz, probe) in zip(p.classifiers, files, strict=True):
    with made_from([inputs.data, checkpoint, curves]):  # each classifier's files: from its own inputs only
        analyse_job(
            inputs.data,
            checkpoint,
            curves,
            {"ablation": ablation, "toeplitz": toeplitz, "probe": probe},
            key=(p.experiment, snakemake.wildcards.task, pe, int(seed)),
            options=p.options,
            device=p.device,
            config_hash=p.config_hash,
        )
