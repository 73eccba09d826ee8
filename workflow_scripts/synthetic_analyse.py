from _common import setup

setup(snakemake, uses_torch=True)
from posgen.synthetic.analysis import analyse_job  # noqa: E402


def listed(paths):
    return [paths] if isinstance(paths, str) else list(paths)


# params.classifiers: [pe, seed] of each checkpoint, in order (synthetic.jobs: task analyses many in turn)
p, inputs, out = snakemake.params, snakemake.input, snakemake.output
parts = [listed(out.ablation), listed(out.toeplitz), listed(out.probe)]
for i, (pe, seed) in enumerate(p.classifiers):
    analyse_job(
        inputs.data,
        listed(inputs.checkpoint)[i],
        listed(inputs.curves)[i],
        {"ablation": parts[0][i], "toeplitz": parts[1][i], "probe": parts[2][i]},
        key=(p.experiment, snakemake.wildcards.task, pe, int(seed)),
        options=p.options,
        device=p.device,
        config_hash=p.config_hash,
    )
