# The second paper's family (docs/method.md section 8, posgen.synthetic): PE classifiers on the synthetic tasks in
# named experiments (posgen.experiments), trained and analysed in the job unit of their experiment
# (posgen.workflow.synthetic: a job per classifier, per (task, pe) as one ensemble, or per task), gathered, summed
# up and decided per collection: `run` (what `all` builds) and the named targets' studies (rules/targets.smk).


rule synthetic_tasks:
    output:
        data=paths.TASK_DATA,
    log:
        paths.log("synthetic", "tasks", "{dataset}"),
    benchmark:
        paths.benchmark("synthetic", "tasks", "{dataset}")
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        **params_of("synthetic_tasks"),
    script:
        "../workflow_scripts/step.py"


# experiments whose job unit is one classifier: one training and one analysis job each
rule synthetic_train:
    input:
        data=lambda w: SYN.task_data(w.experiment, w.task),
    output:
        checkpoints=paths.CHECKPOINT,
        curves=paths.CURVES,
    log:
        paths.log("synthetic", "train", "{experiment}", "{task}", "{pe}", "seed{seed}"),
    benchmark:
        paths.benchmark("synthetic", "train", "{experiment}", "{task}", "{pe}", "seed{seed}")
    wildcard_constraints:
        experiment=alternatives(SYN.with_unit("classifier")),
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=60,
    params:
        **params_of("synthetic_train"),
    script:
        "../workflow_scripts/step.py"


rule synthetic_analyse:
    input:
        data=lambda w: SYN.task_data(w.experiment, w.task),
        checkpoint=paths.CHECKPOINT,
        curves=paths.CURVES,
    output:
        **paths.ANALYSES,
    log:
        paths.log("synthetic", "analyse", "{experiment}", "{task}", "{pe}", "seed{seed}"),
    benchmark:
        paths.benchmark("synthetic", "analyse", "{experiment}", "{task}", "{pe}", "seed{seed}")
    wildcard_constraints:
        experiment=alternatives(SYN.with_unit("classifier", "ensemble")),
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        **params_of("synthetic_analyse"),
    script:
        "../workflow_scripts/step.py"


# Experiments whose job unit holds several classifiers: a rule of their own, since a rule's outputs are fixed when
# the workflow is parsed. An ensemble's job trains every seed of a (task, pe); a task job trains, then analyses,
# every PE and seed of a task in one process.
for experiment in SYN.with_unit("ensemble", "task"):
    data = lambda w, experiment=experiment: SYN.task_data(experiment, w.task)
    unit_log = "{task}/{pe}/ensemble" if SYN.unit(experiment) == "ensemble" else "{task}"

    rule:
        name:
            rule_name("synthetic_train", experiment, SYN)
        input:
            data=data,
        output:
            checkpoints=SYN.unit_files(experiment, paths.CHECKPOINT),
            curves=SYN.unit_files(experiment, paths.CURVES),
        log:
            paths.log("synthetic", "train", experiment, unit_log),
        benchmark:
            paths.benchmark("synthetic", "train", experiment, unit_log)
        conda:
            "../envs/posgen.yaml"
        threads: 1
        resources:
            **unit_resources(SYN, experiment, "synthetic_train"),
            gpu=SYN_GPU,
        params:
            **params_of("synthetic_train", experiment=experiment),
        script:
            "../workflow_scripts/step.py"

    if SYN.unit(experiment) == "task":

        rule:
            name:
                rule_name("synthetic_analyse", experiment, SYN)
            input:
                data=data,
                checkpoint=SYN.unit_files(experiment, paths.CHECKPOINT),
                curves=SYN.unit_files(experiment, paths.CURVES),
            output:
                **{part: SYN.unit_files(experiment, template) for part, template in paths.ANALYSES.items()},
            log:
                paths.log("synthetic", "analyse", experiment, "{task}"),
            benchmark:
                paths.benchmark("synthetic", "analyse", experiment, "{task}")
            conda:
                "../envs/posgen.yaml"
            threads: 1
            resources:
                **unit_resources(SYN, experiment, "synthetic_analyse"),
                gpu=SYN_GPU,
            params:
                **params_of("synthetic_analyse", experiment=experiment),
            script:
                "../workflow_scripts/step.py"


# A collection's classifiers gathered, summed up and decided (`{collection}`: "" for `run`, /<name> for a study).
rule synthetic_gather:
    input:
        **{part: classifier_inputs(template) for part, template in paths.ANALYSES.items()},
        tasks=lambda w: SYN.collection_tasks(collection_of(w))[1],
        training=classifier_inputs(paths.CURVES),
    output:
        **paths.COLLECTION_PARTS,
    log:
        paths.log("synthetic", "gather{collection}"),
    benchmark:
        paths.benchmark("synthetic", "gather{collection}")
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        **params_of("synthetic_gather"),
    script:
        "../workflow_scripts/step.py"


rule synthetic_summary:
    input:
        **paths.COLLECTION_PARTS,
    output:
        **paths.COLLECTION_TABLES,
    log:
        paths.log("synthetic", "summary{collection}"),
    benchmark:
        paths.benchmark("synthetic", "summary{collection}")
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        **params_of("synthetic_summary"),
    script:
        "../workflow_scripts/step.py"


rule synthetic_verdicts:
    input:
        classifiers=paths.COLLECTION_TABLES["classifiers"],
    output:
        md=paths.VERDICTS,
    log:
        paths.log("synthetic", "verdicts{collection}"),
    localrule: True
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("synthetic_verdicts"),
    script:
        "../workflow_scripts/step.py"
