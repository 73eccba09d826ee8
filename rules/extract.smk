# One extraction job per shard of windows. The fused path (extract.analysis: fused) also writes the shard's
# decomposition.nc and bands.nc, and q/k of the first extract.keep_qk windows only; the store path writes every
# window's q/k, for rules decompose and bands (rules/decompose.smk). Logic in posgen.llm.extract and posgen.llm.fused.

FUSED_OUTPUT = {table: shard_table(table) for table in FUSED_TABLES} if FUSED else {}


rule extract:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
    output:
        **FUSED_OUTPUT,
        qk=QK,
    log:
        "logs/extract/{model}/{variant}/{shard}.log",
    benchmark:
        "benchmarks/extract/{model}/{variant}/{shard}.tsv"
    priority: MODEL_PRIORITY["extract"]
    conda:
        "../envs/posgen.yaml"
    threads: MODEL_THREADS
    resources:
        **resources_for("extract"),
    params:
        **params_of("extract"),
        device_map=entry_key("device_map"),
        first_token=entry_key("first_token", "model"),
    script:
        "../workflow_scripts/extract.py"
