# Per-head ablation of the pretrained LLMs (docs/method.md section 8.6), beside each head's Method A numbers: a
# model job of the first family beside perturb and cap, one per (model, variant). Not sharded: its output holds
# per-layer statistics of the means over both probes' samples (deposit index, top gap, Spearman against the
# gathered decomposition), which a gather along `sample` cannot combine. Logic in posgen.llm.head_ablation.


rule head_ablation:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
        decomposition=DECOMPOSITION,
    output:
        nc=HEAD_ABLATION,
    log:
        "logs/head_ablation/{model}/{variant}.log",
    benchmark:
        "benchmarks/head_ablation/{model}/{variant}.tsv"
    priority: MODEL_PRIORITY["head_ablation"]
    conda:
        "../envs/posgen.yaml"
    threads: MODEL_THREADS
    resources:
        **resources_for("head_ablation"),
    params:
        **params_of("head_ablation"),
        device_map=entry_key("device_map"),
    script:
        "../workflow_scripts/head_ablation.py"
