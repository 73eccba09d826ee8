# Per-head ablation of the pretrained LLMs (docs/method.md section 8.6), beside each head's Method A numbers.
# Logic in posgen.synthetic.llm_heads.

LLM_HEADS_KEYS = ["n_samples", "seq_len", "probe_samples", "probe_period", "seed"]
LLM_HEADS_LEAVES = [f"llm_heads.{key}" for key in LLM_HEADS_KEYS] + ["dtype", "device"]


rule llm_heads:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
        decomposition=DECOMPOSITION,
    output:
        nc="results/{model}/{variant}/head_ablation.nc",
    log:
        "logs/llm_heads/{model}/{variant}.log",
    benchmark:
        "benchmarks/llm_heads/{model}/{variant}.tsv"
    priority: MODEL_PRIORITY["llm_heads"]
    conda:
        "../envs/posgen.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=6000,
        runtime=60,
    params:
        **{key: config["llm_heads"][key] for key in LLM_HEADS_KEYS},
        dtype=config["dtype"],
        device=config["device"],
        config_hash=hash_of(LLM_HEADS_LEAVES),
    script:
        "../workflow_scripts/llm_heads.py"


TARGETS.extend(expand(rules.llm_heads.output.nc, model=MODELS, variant=VARIANTS))
