# Per-head ablation on the pretrained LLMs (issue 10 item 6). Logic in posgen.synthetic.llm_heads.

LLM_HEADS_HASH = config_hash(config, WINDOWS_KEYS + ["dtype", "llm_heads"])


rule llm_heads:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
        decomposition=rules.decompose.output.decomposition,
    output:
        nc="results/{model}/{variant}/head_ablation.nc",
    log:
        "logs/llm_heads/{model}/{variant}.log",
    benchmark:
        "benchmarks/llm_heads/{model}/{variant}.tsv"
    params:
        llm_heads=config["llm_heads"],
        dtype=config["dtype"],
        device=config["device"],
        config_hash=LLM_HEADS_HASH,
    threads: 2
    resources:
        mem_mb=6000,
        runtime=30,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/llm_heads.py"


TARGETS.extend(expand(rules.llm_heads.output.nc, model=MODELS, variant=VARIANTS))
