# The second paper's family (docs/method.md section 8, posgen.synthetic): PE classifiers on the synthetic tasks in
# named experiments (posgen.experiments), one training and one analysis job per (experiment, task, pe,
# seed), one training job per (experiment, task, pe) where the experiment sets train.ensemble, one training and one
# analysis job per (experiment, task) where it sets jobs: task; gathered NetCDFs, a
# summary, a per-classifier table and the verdicts per collection: `run` (what `all` builds) and the named targets `deposit_study`, `regime_study`, `decisive_study` (rules/deposit_study.smk).

# profiles/slurm asks a GPU for synthetic_train and synthetic_analyse by name; the generated rules below (names per
# experiment, which set-resources cannot match) ask for it themselves unless the config runs on the CPU
SYN_GPU = 0 if config["device"] == "cpu" else 1


rule synthetic_tasks:
    output:
        data=SYN_TASK_DATA,
    log:
        "logs/synthetic/tasks/{dataset}.log",
    benchmark:
        "benchmarks/synthetic/tasks/{dataset}.tsv"
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        task=lambda w: SYN_DATASETS[w.dataset][0],
        options=lambda w: SYN_DATASETS[w.dataset][1],
        config_hash=lambda w: _hash_of_options(SYN_DATASETS[w.dataset][1]),
    script:
        "../workflow_scripts/synthetic_tasks.py"


rule synthetic_train:
    input:
        data=syn_task_data,
    output:
        checkpoints=f"{SYN_CLASSIFIER_DIR}/model.pt",
        curves=f"{SYN_CLASSIFIER_DIR}/train.nc",
    log:
        "logs/synthetic/train/{experiment}/{task}/{pe}/seed{seed}.log",
    benchmark:
        "benchmarks/synthetic/train/{experiment}/{task}/{pe}/seed{seed}.tsv"
    wildcard_constraints:
        experiment="|".join(re.escape(name) for name in SYN_SOLO) or "none",
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=60,
    params:
        experiment=lambda w: w.experiment,
        classifiers=lambda w: [[w.pe, int(w.seed)]],
        ensemble=False,
        options=syn_train_options,
        device=config["device"],
        config_hash=syn_hash(syn_train_options),
    script:
        "../workflow_scripts/synthetic_train.py"


# experiments with train.ensemble: one job per (task, pe) trains every seed as one batched ensemble
for experiment in SYN_ENSEMBLES:
    fixed = syn_fixed(experiment)
    seeds = SYN_EXPERIMENTS[experiment]["seeds"]
    rule_name = f"synthetic_train_ensemble_{re.sub(r'[^0-9A-Za-z_]', '_', experiment)}"

    rule:
        name:
            rule_name
        input:
            data=lambda w, fixed=fixed: syn_task_data(fixed(w)),
        output:
            checkpoints=syn_seed_files(experiment, "model.pt"),
            curves=syn_seed_files(experiment, "train.nc"),
        log:
            f"logs/synthetic/train/{experiment}/{{task}}/{{pe}}/ensemble.log",
        benchmark:
            f"benchmarks/synthetic/train/{experiment}/{{task}}/{{pe}}/ensemble.tsv"
        conda:
            "../envs/posgen.yaml"
        threads: 1
        resources:
            mem_mb=2000 + 500 * len(seeds),
            runtime=60 * len(seeds),
            gpu=SYN_GPU,
        params:
            experiment=experiment,
            classifiers=lambda w, seeds=seeds: [[w.pe, seed] for seed in seeds],
            ensemble=True,
            options=lambda w, fixed=fixed: syn_train_options(fixed(w)),
            device=config["device"],
            config_hash=lambda w, fixed=fixed: syn_hash(syn_train_options)(fixed(w)),
        script:
            "../workflow_scripts/synthetic_train.py"


# experiments with jobs: task: one job per task trains (then analyses) every PE and seed in turn, in one process
for experiment in SYN_BY_TASK:
    fixed = syn_fixed(experiment)
    n_classifiers = len(syn_task_classifiers(experiment))
    name = re.sub(r"[^0-9A-Za-z_]", "_", experiment)

    rule:
        name:
            f"synthetic_train_task_{name}"
        input:
            data=lambda w, fixed=fixed: syn_task_data(fixed(w)),
        output:
            checkpoints=syn_task_files(experiment, "model.pt"),
            curves=syn_task_files(experiment, "train.nc"),
        log:
            f"logs/synthetic/train/{experiment}/{{task}}.log",
        benchmark:
            f"benchmarks/synthetic/train/{experiment}/{{task}}.tsv"
        conda:
            "../envs/posgen.yaml"
        threads: 1
        resources:
            mem_mb=2000,
            runtime=60 * n_classifiers,
            gpu=SYN_GPU,
        params:
            experiment=experiment,
            classifiers=syn_task_classifiers(experiment),
            ensemble=SYN_EXPERIMENTS[experiment]["train"]["ensemble"],
            options=lambda w, fixed=fixed: syn_train_options(fixed(w)),
            device=config["device"],
            config_hash=lambda w, fixed=fixed: syn_hash(syn_train_options)(fixed(w)),
        script:
            "../workflow_scripts/synthetic_train.py"

    rule:
        name:
            f"synthetic_analyse_task_{name}"
        input:
            data=lambda w, fixed=fixed: syn_task_data(fixed(w)),
            checkpoint=syn_task_files(experiment, "model.pt"),
            curves=syn_task_files(experiment, "train.nc"),
        output:
            ablation=syn_task_files(experiment, "ablation.nc"),
            toeplitz=syn_task_files(experiment, "toeplitz.nc"),
            probe=syn_task_files(experiment, "probe.nc"),
        log:
            f"logs/synthetic/analyse/{experiment}/{{task}}.log",
        benchmark:
            f"benchmarks/synthetic/analyse/{experiment}/{{task}}.tsv"
        conda:
            "../envs/posgen.yaml"
        threads: 1
        resources:
            mem_mb=2000,
            runtime=30 * n_classifiers,
            gpu=SYN_GPU,
        params:
            experiment=experiment,
            classifiers=syn_task_classifiers(experiment),
            options=lambda w, fixed=fixed: syn_analysis_options(fixed(w)),
            device=config["device"],
            config_hash=lambda w, fixed=fixed: syn_hash(syn_train_options, syn_analysis_options)(fixed(w)),
        script:
            "../workflow_scripts/synthetic_analyse.py"


rule synthetic_analyse:
    input:
        data=syn_task_data,
        checkpoint=f"{SYN_CLASSIFIER_DIR}/model.pt",
        curves=f"{SYN_CLASSIFIER_DIR}/train.nc",
    output:
        ablation=f"{SYN_CLASSIFIER_DIR}/ablation.nc",
        toeplitz=f"{SYN_CLASSIFIER_DIR}/toeplitz.nc",
        probe=f"{SYN_CLASSIFIER_DIR}/probe.nc",
    log:
        "logs/synthetic/analyse/{experiment}/{task}/{pe}/seed{seed}.log",
    benchmark:
        "benchmarks/synthetic/analyse/{experiment}/{task}/{pe}/seed{seed}.tsv"
    wildcard_constraints:
        experiment="|".join(re.escape(name) for name in SYN_SOLO + SYN_ENSEMBLES) or "none",
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        experiment=lambda w: w.experiment,
        classifiers=lambda w: [[w.pe, int(w.seed)]],
        options=syn_analysis_options,
        device=config["device"],
        config_hash=syn_hash(syn_train_options, syn_analysis_options),
    script:
        "../workflow_scripts/synthetic_analyse.py"


for which, folder in COLLECTIONS.items():

    rule:
        name:
            f"synthetic_gather_{which}"
        input:
            tasks=syn_task_keys(which)[1],
            training=syn_classifier_files(which, "train.nc"),
            ablation=syn_classifier_files(which, "ablation.nc"),
            toeplitz=syn_classifier_files(which, "toeplitz.nc"),
            probe=syn_classifier_files(which, "probe.nc"),
        output:
            **{part: f"{folder}/{part}.nc" for part in SYN_PARTS},
            baselines=f"{folder}/baselines.nc",
        log:
            f"logs/synthetic/gather_{which}.log",
        benchmark:
            f"benchmarks/synthetic/gather_{which}.tsv"
        conda:
            "../envs/posgen.yaml"
        threads: 1
        resources:
            mem_mb=2000,
            runtime=10,
        params:
            classifiers=syn_keys(which),
            tasks=syn_task_keys(which)[0],
            config_hash=_hash_of_options({"data": SYN_DATA, "keys": syn_keys(which)}),
        script:
            "../workflow_scripts/synthetic_gather.py"

    rule:
        name:
            f"synthetic_summary_{which}"
        input:
            **{part: f"{folder}/{part}.nc" for part in SYN_PARTS + ["baselines"]},
        output:
            csv=f"{folder}/summary.csv",
            classifiers=f"{folder}/classifiers.csv",
            deposit=f"{folder}/deposit.csv",
        log:
            f"logs/synthetic/summary_{which}.log",
        benchmark:
            f"benchmarks/synthetic/summary_{which}.tsv"
        conda:
            "../envs/posgen.yaml"
        threads: 1
        resources:
            mem_mb=2000,
            runtime=10,
        params:
            **params_of("synthetic_summary", per_model=False),
        script:
            "../workflow_scripts/synthetic_summary.py"

    rule:
        name:
            f"synthetic_verdicts_{which}"
        input:
            classifiers=f"{folder}/classifiers.csv",
        output:
            md=f"{folder}/verdicts.md",
        log:
            f"logs/synthetic/verdicts_{which}.log",
        localrule: True
        conda:
            "../envs/posgen.yaml"
        params:
            title=f"Verdicts of the collection {which}",
        script:
            "../workflow_scripts/synthetic_verdicts.py"
