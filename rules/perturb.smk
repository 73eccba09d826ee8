# Position-generalisation experiments (docs/method.md section 7): perturbed token order / position ids, and
# LM-Infinite style RoPE distance capping, one job per shard of the perturbation windows (rule gather merges them).
# Logic in posgen.perturb.


rule perturb:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
    output:
        nc=f"{SHARD_DIR}/perturb.nc",
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
        n_samples=config["perturb"]["n_samples"],
        seq_len=config["perturb"]["seq_len"],
        rates=config["perturb"]["rates"],
        seed=config["perturb"]["seed"],
        jitter=config["perturb"]["jitter"],
        dummy_distance=config["decomposition"]["dummy_distance"],
        dtype=config["dtype"],
        device=config["device"],
        device_map=entry_key("device_map"),
        config_hash=hash_of(PERTURB_LEAVES),
    script:
        "../workflow_scripts/perturb.py"


rule cap:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
    output:
        nc=f"{SHARD_DIR}/cap.nc",
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
        n_samples=config["perturb"]["n_samples"],
        seq_len=config["perturb"]["seq_len"],
        distance_caps=config["perturb"]["caps"],
        dummy_distance=config["decomposition"]["dummy_distance"],
        dtype=config["dtype"],
        device=config["device"],
        device_map=entry_key("device_map"),
        config_hash=hash_of(CAP_LEAVES),
    script:
        "../workflow_scripts/cap.py"


PERTURB = "results/{model}/{variant}/perturb.nc"
CAP = "results/{model}/{variant}/cap.nc"

TARGETS.extend(expand(PERTURB, model=MODELS, variant=VARIANTS))
TARGETS.extend(expand(CAP, model=MODELS, variant=VARIANTS))
