# The second paper's family (docs/method.md section 8, posgen.synthetic): PE classifiers on the synthetic tasks in
# named experiments (posgen.synthetic.experiments), one training and one analysis job per (experiment, task, pe,
# seed); gathered NetCDFs and a summary per collection: `run` (what `all` builds) and `deposit_study` (target).

from posgen.config import config_hash as _hash_of_options
from posgen.synthetic.experiments import COLLECTIONS, classifiers, pe_labels, resolve, train_options

SYN = config["synthetic"]
SYN_DATA_KEYS = ["data_seed", "vocab_size", "test_fraction", "distance", "count"]
SYN_DATA = canonical({key: SYN[key] for key in SYN_DATA_KEYS})
SYN_DATA_LEAVES = [f"synthetic.{key}" for key in SYN_DATA_KEYS]
# every experiment named by a collection, with its resolved settings
SYN_EXPERIMENTS = {name: resolve(SYN, name) for which in COLLECTIONS for name in SYN[which]}
SYN_TASKS = sorted({task for options in SYN_EXPERIMENTS.values() for task in options["tasks"]})
SYN_PES = sorted({pe for options in SYN_EXPERIMENTS.values() for pe in pe_labels(options)})
SYN_CLASSIFIER_DIR = "results/synthetic/{experiment}/{task}/{pe}/seed{seed}"
SYN_PARTS = ["training", "ablation", "toeplitz", "probe"]


wildcard_constraints:
    experiment="|".join(re.escape(name) for name in SYN_EXPERIMENTS) or "none",
    task="|".join(SYN_TASKS),
    pe="|".join(re.escape(pe) for pe in SYN_PES),
    seed=r"\d+",


def syn_train_options(wildcards):
    return train_options(SYN_EXPERIMENTS[wildcards.experiment])


def syn_analysis_options(wildcards):
    options = SYN_EXPERIMENTS[wildcards.experiment]
    return {key: options[key] for key in ("ablation_samples", "toeplitz_samples")}


def syn_hash(*parts):
    """A params function: the hash of the data settings and the experiment's ``parts`` (train, analysis)."""

    def job_config_hash(wildcards):
        picked = {"data": SYN_DATA, "device": config["device"]}
        for part in parts:
            picked[part.__name__] = part(wildcards)
        return _hash_of_options(picked)

    return job_config_hash


def syn_classifier_files(which, name):
    """Per-classifier files ``name`` of every experiment of collection ``which``."""
    return [
        f"{SYN_CLASSIFIER_DIR}/{name}".format(experiment=experiment, task=task, pe=pe, seed=seed)
        for experiment in SYN[which]
        for task, pe, seed in classifiers(SYN_EXPERIMENTS[experiment])
    ]


def syn_keys(which):
    return [[experiment, *key] for experiment in SYN[which] for key in classifiers(SYN_EXPERIMENTS[experiment])]


rule synthetic_tasks:
    output:
        data="results/synthetic/tasks/{task}.nc",
    log:
        "logs/synthetic/tasks/{task}.log",
    benchmark:
        "benchmarks/synthetic/tasks/{task}.tsv"
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        options=SYN_DATA,
        config_hash=hash_of(SYN_DATA_LEAVES, per_model=False),
    script:
        "../workflow_scripts/synthetic_tasks.py"


rule synthetic_train:
    input:
        data=rules.synthetic_tasks.output.data,
    output:
        checkpoint=f"{SYN_CLASSIFIER_DIR}/model.pt",
        curves=f"{SYN_CLASSIFIER_DIR}/train.nc",
    log:
        "logs/synthetic/train/{experiment}/{task}/{pe}/seed{seed}.log",
    benchmark:
        "benchmarks/synthetic/train/{experiment}/{task}/{pe}/seed{seed}.tsv"
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=60,
    params:
        options=syn_train_options,
        device=config["device"],
        config_hash=syn_hash(syn_train_options),
    script:
        "../workflow_scripts/synthetic_train.py"


rule synthetic_analyse:
    input:
        data=rules.synthetic_tasks.output.data,
        checkpoint=rules.synthetic_train.output.checkpoint,
    output:
        ablation=f"{SYN_CLASSIFIER_DIR}/ablation.nc",
        toeplitz=f"{SYN_CLASSIFIER_DIR}/toeplitz.nc",
        probe=f"{SYN_CLASSIFIER_DIR}/probe.nc",
    log:
        "logs/synthetic/analyse/{experiment}/{task}/{pe}/seed{seed}.log",
    benchmark:
        "benchmarks/synthetic/analyse/{experiment}/{task}/{pe}/seed{seed}.tsv"
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
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
            tasks=expand(rules.synthetic_tasks.output.data, task=SYN_TASKS),
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
            intervals=config["intervals"],
        script:
            "../workflow_scripts/synthetic_summary.py"


SYN_RUN_OUTPUTS = [f"results/synthetic/{part}.nc" for part in SYN_PARTS] + ["results/synthetic/summary.csv"]
SYN_STUDY = "results/synthetic/deposit_study"
TARGETS.extend(SYN_RUN_OUTPUTS)


def study_summary_if_built(wildcards):
    """The deposit study's summary for the reproduction table: when this run builds the study (target
    `deposit_study`) or an earlier run did; `make run` on a fresh clone neither waits for it nor builds it."""
    path = f"{SYN_STUDY}/summary.csv"
    if "deposit_study" in workflow.dag_settings.targets or Path(path).exists():
        return [path]
    return []
