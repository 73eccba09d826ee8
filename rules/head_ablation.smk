# Per-head ablation of the pretrained LLMs (docs/method.md section 8.6), beside each head's Method A numbers: a
# model job of the first family beside perturb and cap, one per (model, variant). Not sharded: its output holds
# per-layer statistics of the means over both probes' samples (deposit index, top gap, Spearman against the
# gathered decomposition), which a gather along `sample` cannot combine. Logic in posgen.head_ablation.

HEAD_ABLATION_KEYS = ["n_samples", "seq_len", "probe_samples", "probe_period", "seed"]
HEAD_ABLATION_LEAVES = [f"head_ablation.{key}" for key in HEAD_ABLATION_KEYS] + ["dtype", "device"]


rule head_ablation:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
        decomposition=DECOMPOSITION,
    output:
        nc="results/{model}/{variant}/head_ablation.nc",
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
        **{key: config["head_ablation"][key] for key in HEAD_ABLATION_KEYS},
        dtype=config["dtype"],
        device=config["device"],
        device_map=entry_key("device_map"),
        config_hash=hash_of(HEAD_ABLATION_LEAVES),
    script:
        "../workflow_scripts/head_ablation.py"


TARGETS.extend(expand(rules.head_ablation.output.nc, model=MODELS, variant=VARIANTS))
