# Training trajectories (README "Training trajectories", posgen.trajectory): every model of config
# `trajectory.models` is a checkpoint series whose variants step<N> go through the ordinary per-variant rules; this
# file adds the training of the workflow's own tiny Llama and the per-step table (its figures: rules/figures.smk;
# the target `trajectory`: rules/targets.smk). Rule `all` never asks for any of it.


# Output beside the acquired models' layout: resources/models/<name>/{config,tokenizer,manifest.json,step<N>/}.
rule train_trajectory:
    output:
        manifest=paths.MANIFEST,
        training=paths.TRAINING_LOG,
    log:
        paths.log("train_trajectory", "{model}"),
    benchmark:
        paths.benchmark("train_trajectory", "{model}")
    wildcard_constraints:
        model=alternatives(TRAIN_MODELS),
    conda:
        "../envs/posgen.yaml"
    # one thread: the model is too narrow (width 128) for a second one to pay its synchronisation on a busy CPU
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
    params:
        **params_of("train_trajectory"),
    script:
        "../workflow_scripts/step.py"


# A trained trajectory model's manifest comes from its training, never from a download.
ruleorder: train_trajectory > get_model


rule trajectory_table:
    input:
        summary=paths.MODEL_SUMMARY["csv"],
        bands=over_variants(paths.BANDS),
        perturb=over_variants(paths.PERTURB),
        training=lambda w: paths.TRAINING_LOG.format(model=w.model) if w.model in TRAIN_MODELS else [],
    output:
        **paths.TRAJECTORY_TABLE,
    log:
        paths.log("trajectory_table", "{model}"),
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        **params_of("trajectory_table"),
    script:
        "../workflow_scripts/step.py"
