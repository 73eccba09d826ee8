# The second paper's family (docs/method.md section 8, posgen.synthetic): PE classifiers on the synthetic tasks,
# one training job per (task, pe, seed); per-task ablation and Toeplitz jobs; gathered NetCDFs and a summary.

SYN = config["synthetic"]
SYN_TASKS, SYN_PES, SYN_SEEDS = SYN["tasks"], SYN["pes"], SYN["seeds"]
SYN_DATA_KEYS = ["data_seed", "vocab_size", "test_fraction", "distance", "count"]
SYN_MODEL_KEYS = ["model", "train", "faithful", "rope_heads", "rope_base"]
# config leaves each step reads (its config_hash covers exactly these; see rules/common.smk)
SYN_DATA_LEAVES = [f"synthetic.{key}" for key in SYN_DATA_KEYS]
SYN_TRAIN_LEAVES = SYN_DATA_LEAVES + [f"synthetic.{key}" for key in SYN_MODEL_KEYS] + ["device"]
SYN_ALL_LEAVES = SYN_TRAIN_LEAVES + ["synthetic.tasks", "synthetic.pes", "synthetic.seeds"]
SYN_CLASSIFIERS = [(pe, seed) for pe in SYN_PES for seed in SYN_SEEDS]  # expand order of pe, seed below
SYN_CONSTRAINTS = {
    "task": "|".join(SYN_TASKS),
    "pe": "|".join(re.escape(pe) for pe in SYN_PES),
    "seed": r"\d+",
}


rule synthetic_tasks:
    output:
        data="results/synthetic/tasks/{task}.nc",
    log:
        "logs/synthetic/tasks/{task}.log",
    benchmark:
        "benchmarks/synthetic/tasks/{task}.tsv"
    wildcard_constraints:
        **SYN_CONSTRAINTS,
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        options=canonical({key: SYN[key] for key in SYN_DATA_KEYS}),
        config_hash=hash_of(SYN_DATA_LEAVES, per_model=False),
    script:
        "../workflow_scripts/synthetic_tasks.py"


rule synthetic_train:
    input:
        data=rules.synthetic_tasks.output.data,
    output:
        checkpoint="results/synthetic/{task}/{pe}/seed{seed}/model.pt",
        curves="results/synthetic/{task}/{pe}/seed{seed}/train.nc",
    log:
        "logs/synthetic/train/{task}/{pe}/seed{seed}.log",
    benchmark:
        "benchmarks/synthetic/train/{task}/{pe}/seed{seed}.tsv"
    wildcard_constraints:
        **SYN_CONSTRAINTS,
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        options=canonical({key: SYN[key] for key in SYN_MODEL_KEYS}),
        device=config["device"],
        config_hash=hash_of(SYN_TRAIN_LEAVES, per_model=False),
    script:
        "../workflow_scripts/synthetic_train.py"


rule synthetic_ablate:
    input:
        data=rules.synthetic_tasks.output.data,
        checkpoints=expand(rules.synthetic_train.output.checkpoint, pe=SYN_PES, seed=SYN_SEEDS, allow_missing=True),
    output:
        ablation="results/synthetic/{task}/ablation.nc",
    log:
        "logs/synthetic/ablate/{task}.log",
    benchmark:
        "benchmarks/synthetic/ablate/{task}.tsv"
    wildcard_constraints:
        **SYN_CONSTRAINTS,
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        classifiers=SYN_CLASSIFIERS,
        device=config["device"],
        config_hash=hash_of(SYN_ALL_LEAVES, per_model=False),
    script:
        "../workflow_scripts/synthetic_ablate.py"


rule synthetic_toeplitz:
    input:
        data=rules.synthetic_tasks.output.data,
        checkpoints=expand(rules.synthetic_train.output.checkpoint, pe=SYN_PES, seed=SYN_SEEDS, allow_missing=True),
    output:
        toeplitz="results/synthetic/{task}/toeplitz.nc",
    log:
        "logs/synthetic/toeplitz/{task}.log",
    benchmark:
        "benchmarks/synthetic/toeplitz/{task}.tsv"
    wildcard_constraints:
        **SYN_CONSTRAINTS,
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        classifiers=SYN_CLASSIFIERS,
        n_samples=SYN["toeplitz_samples"],
        device=config["device"],
        config_hash=hash_of(SYN_ALL_LEAVES + ["synthetic.toeplitz_samples"], per_model=False),
    script:
        "../workflow_scripts/synthetic_toeplitz.py"


rule synthetic_gather:
    input:
        ablation=expand(rules.synthetic_ablate.output.ablation, task=SYN_TASKS),
        toeplitz=expand(rules.synthetic_toeplitz.output.toeplitz, task=SYN_TASKS),
        curves=expand(rules.synthetic_train.output.curves, task=SYN_TASKS, pe=SYN_PES, seed=SYN_SEEDS),
    output:
        ablation="results/synthetic/ablation.nc",
        toeplitz="results/synthetic/toeplitz.nc",
        training="results/synthetic/training.nc",
    log:
        "logs/synthetic/gather.log",
    benchmark:
        "benchmarks/synthetic/gather.tsv"
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        classifiers=[(task, pe, seed) for task in SYN_TASKS for pe in SYN_PES for seed in SYN_SEEDS],
        config_hash=hash_of(SYN_ALL_LEAVES, per_model=False),
    script:
        "../workflow_scripts/synthetic_gather.py"


rule synthetic_summary:
    input:
        **rules.synthetic_gather.output,
    output:
        csv="results/synthetic/summary.csv",
    log:
        "logs/synthetic/summary.log",
    benchmark:
        "benchmarks/synthetic/summary.tsv"
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        intervals=config["intervals"],
    script:
        "../workflow_scripts/synthetic_summary.py"


TARGETS.extend(rules.synthetic_gather.output)
TARGETS.extend(rules.synthetic_summary.output)
