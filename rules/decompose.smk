# The store path (extract.analysis: store): the decomposition and band statistics of each shard, read back from
# its qk.h5. The fused path writes the same files from the extraction job (rules/extract.smk).
if not FUSED:

    rule decompose:
        input:
            qk=rules.extract.output.qk,
        output:
            decomposition=f"{SHARD_DIR}/decomposition.nc",
        log:
            "logs/decompose/{model}/{variant}/{shard}.log",
        benchmark:
            "benchmarks/decompose/{model}/{variant}/{shard}.tsv"
        conda:
            "../envs/posgen.yaml"
        threads: MODEL_THREADS
        resources:
            **resources_for("decompose"),
        params:
            **params_of("decompose"),
        script:
            "../workflow_scripts/decompose.py"

    rule bands:
        input:
            qk=rules.extract.output.qk,
        output:
            bands=f"{SHARD_DIR}/bands.nc",
        log:
            "logs/bands/{model}/{variant}/{shard}.log",
        benchmark:
            "benchmarks/bands/{model}/{variant}/{shard}.tsv"
        conda:
            "../envs/posgen.yaml"
        threads: 1
        resources:
            **resources_for("bands"),
        params:
            **params_of("bands"),
        script:
            "../workflow_scripts/bands.py"


localrules:
    gather,


# The shards' NetCDFs merged along `sample` (bands: averaged, weighted by windows): the unsharded file.
rule gather:
    input:
        shard_files,
    output:
        "results/{model}/{variant}/{table}.nc",
    log:
        "logs/gather/{model}/{variant}/{table}.log",
    wildcard_constraints:
        table="decomposition|bands|perturb|cap",
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/gather.py"


DECOMPOSITION = "results/{model}/{variant}/decomposition.nc"
BANDS = "results/{model}/{variant}/bands.nc"


# One job per model, so that adding a model leaves the others' summaries (and their figures) alone.
rule summarize:
    input:
        decomposition=over_variants(DECOMPOSITION),
    output:
        csv="results/{model}/summary.csv",
        nc="results/{model}/summary.nc",
    log:
        "logs/summarize/{model}.log",
    benchmark:
        "benchmarks/summarize/{model}.tsv"
    conda:
        "../envs/posgen.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        **params_of("summarize"),
    script:
        "../workflow_scripts/summarize.py"


localrules:
    summary_table,


# results/summary.csv: the per-model tables, models in name order; every row keeps its own job's config_hash.
rule summary_table:
    input:
        csv=expand(rules.summarize.output.csv, model=sorted(MODELS)),
    output:
        csv="results/summary.csv",
    log:
        "logs/summary_table.log",
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/summary_table.py"


TARGETS.extend(expand(DECOMPOSITION, model=MODELS, variant=VARIANTS))
TARGETS.extend(expand(BANDS, model=MODELS, variant=VARIANTS))
TARGETS.extend(expand(rules.summarize.output.nc, model=MODELS))
TARGETS.extend(rules.summary_table.output)
