# Training trajectories (README "Training trajectories", posgen.trajectory): every model of config
# `trajectory.models` is a checkpoint series whose variants step<N> go through the ordinary per-variant rules
# (extract, decompose, bands, perturb, summarize); this file adds the training of the workflow's own tiny Llama,
# the per-step table and the trajectory figures, and the named target `trajectory`. Rule `all` never asks for
# any of it.


# Output beside the acquired models' layout: resources/models/<name>/{config,tokenizer,manifest.json,step<N>/}.
rule train_trajectory:
    output:
        manifest=MANIFEST,
        training=TRAINING_LOG,
    log:
        "logs/train_trajectory/{model}.log",
    benchmark:
        "benchmarks/train_trajectory/{model}.tsv"
    wildcard_constraints:
        model="|".join(re.escape(m) for m in TRAIN_MODELS) or "(?!)",
    conda:
        "../envs/posgen.yaml"
    # one thread: the model is too narrow (width 128) for a second one to pay its synchronisation on a busy CPU
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
    params:
        **params_of("train_trajectory"),
        train=lambda wildcards: canonical(model_entry(config, wildcards.model)["train"]),
    script:
        "../workflow_scripts/train_trajectory.py"


# A trained trajectory model's manifest comes from its training, never from a download.
ruleorder: train_trajectory > get_model


rule trajectory_table:
    input:
        summary=rules.summarize.output.csv,
        bands=over_variants(BANDS),
        perturb=over_variants(PERTURB),
        training=training_log,
    output:
        **TRAJECTORY_TABLE,
    log:
        "logs/trajectory_table/{model}.log",
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        **params_of("trajectory_table"),
        variants=lambda wildcards: variants(config, wildcards.model),
    script:
        "../workflow_scripts/trajectory_table.py"


for row in TRAJECTORY_FIGURES.values():

    rule:
        name:
            f"fig_{row.name}"
        input:
            **trajectory_figure_inputs(row),
        output:
            png=report(
                row.output("png"),
                caption=f"../{row.caption}",
                category=row.category,
                subcategory="{model}",
                labels={"figure": row.name},
            ),
            pdf=row.output("pdf"),
        log:
            row.log,
        localrule: True
        conda:
            "../envs/posgen.yaml"
        params:
            figure=row.name,
            variants=trajectory_figure_variants(row),
            n_boot=None,
            seed=None,
            config_hash=hash_of([]),
        script:
            "../workflow_scripts/figure.py"


localrules:
    trajectory,


rule trajectory:
    input:
        expand(rules.trajectory_table.output, model=TRAJECTORY_MODELS),
        [
            path
            for row in TRAJECTORY_FIGURES.values()
            for ext in ("png", "pdf")
            for path in row.paths({"model": TRAJECTORY_MODELS}, ext)
        ],
