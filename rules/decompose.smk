rule decompose:
    input:
        qk=rules.extract.output.qk,
    output:
        decomposition="results/{model}/{variant}/decomposition.nc",
    log:
        "logs/decompose/{model}/{variant}.log",
    benchmark:
        "benchmarks/decompose/{model}/{variant}.tsv"
    params:
        # only the keys the decomposition reads: a params change reruns the job
        decomposition={
            key: config["decomposition"][key]
            for key in ["dummy_distances", "default_D", "lstsq_tol", "bound_samples"]
        },
        device=config["device"],
        config_hash=CONFIG_HASH,
    threads: 2
    resources:
        mem_mb=4000,
        runtime=120,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/decompose.py"


rule bands:
    input:
        qk=rules.extract.output.qk,
    output:
        bands="results/{model}/{variant}/bands.nc",
    log:
        "logs/bands/{model}/{variant}.log",
    benchmark:
        "benchmarks/bands/{model}/{variant}.tsv"
    params:
        config_hash=CONFIG_HASH,
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/bands.py"


rule summarize:
    input:
        decomposition=expand(
            rules.decompose.output.decomposition, model=MODELS, variant=VARIANTS
        ),
    output:
        csv="results/summary.csv",
        nc=expand("results/{model}/summary.nc", model=MODELS),
    log:
        "logs/summarize.log",
    benchmark:
        "benchmarks/summarize.tsv"
    params:
        models=MODELS,
        decomposition=config["decomposition"],
        config_hash=CONFIG_HASH,
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/summarize.py"


TARGETS.extend(
    expand(rules.decompose.output.decomposition, model=MODELS, variant=VARIANTS)
)
TARGETS.extend(expand(rules.bands.output.bands, model=MODELS, variant=VARIANTS))
TARGETS.extend(rules.summarize.output)
