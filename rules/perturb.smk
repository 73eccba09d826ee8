# Position-generalisation experiments (docs/method.md section 7): perturbed token order / position ids, and
# LM-Infinite style RoPE distance capping, one job per shard of the perturbation windows (rule gather merges them).
# Logic in posgen.llm.perturb.


rule perturb:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
    output:
        nc=shard_table("perturb"),
    log:
        "logs/perturb/{model}/{variant}/{shard}.log",
    benchmark:
        "benchmarks/perturb/{model}/{variant}/{shard}.tsv"
    priority: MODEL_PRIORITY["perturb"]
    conda:
        "../envs/posgen.yaml"
    threads: MODEL_THREADS
    resources:
        **resources_for("perturb"),
    params:
        **params_of("perturb"),
        device_map=entry_key("device_map"),
    script:
        "../workflow_scripts/perturb.py"


rule cap:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
    output:
        nc=shard_table("cap"),
    log:
        "logs/cap/{model}/{variant}/{shard}.log",
    benchmark:
        "benchmarks/cap/{model}/{variant}/{shard}.tsv"
    priority: MODEL_PRIORITY["cap"]
    conda:
        "../envs/posgen.yaml"
    threads: MODEL_THREADS
    resources:
        **resources_for("cap"),
    params:
        **params_of("cap"),
        device_map=entry_key("device_map"),
    script:
        "../workflow_scripts/cap.py"
