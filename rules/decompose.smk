# The store path (extract.analysis: store): the decomposition and band statistics of each shard, read back from
# its qk.h5. The fused path writes the same files from the extraction job (rules/extract.smk).
if not FUSED:

    rule decompose:
        input:
            qk=rules.extract.output.qk,
        output:
            decomposition=shard_table("decomposition"),
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
            bands=shard_table("bands"),
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
        TABLE,
    log:
        "logs/gather/{model}/{variant}/{table}.log",
    wildcard_constraints:
        table="|".join(GATHERED),
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/gather.py"


# One job per model, so that adding a model leaves the others' summaries (and their figures) alone.
rule summarize:
    input:
        decomposition=over_variants(DECOMPOSITION),
    output:
        **MODEL_SUMMARY,
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
        csv=SUMMARY_TABLE,
    log:
        "logs/summary_table.log",
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/summary_table.py"


localrules:
    gap_origin,
    position_study,


# The position study's answer (README "The position study", docs/method.md section 3C): where Method A's
# random-init gap comes from, per model and random-init seed, from the run's results/summary.csv.
rule gap_origin:
    input:
        csv=rules.summary_table.output.csv,
    output:
        md=GAP_ORIGIN,
    log:
        "logs/gap_origin.log",
    conda:
        "../envs/posgen.yaml"
    params:
        config_hash=hash_of([], per_model=False),
    script:
        "../workflow_scripts/gap_origin.py"


rule position_study:
    input:
        rules.gap_origin.output,
