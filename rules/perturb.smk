# Position-generalisation experiments (science.md section 7): perturbed token order / position ids, and
# LM-Infinite style RoPE distance capping. Logic in posgen.perturb.

PERTURB_HASH = config_hash(
    config, ["models", "corpus", "n_samples", "seq_len", "window_seed", "dtype", "perturb", "decomposition"]
)


rule perturb:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
    output:
        nc="results/{model}/{variant}/perturb.nc",
    log:
        "logs/perturb/{model}/{variant}.log",
    benchmark:
        "benchmarks/perturb/{model}/{variant}.tsv"
    params:
        perturb=config["perturb"],
        default_D=config["decomposition"]["default_D"],
        dtype=config["dtype"],
        device=config["device"],
        config_hash=PERTURB_HASH,
    threads: 2
    resources:
        mem_mb=6000,
        runtime=60,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/perturb.py"


rule cap:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
    output:
        nc="results/{model}/{variant}/cap.nc",
    log:
        "logs/cap/{model}/{variant}.log",
    benchmark:
        "benchmarks/cap/{model}/{variant}.tsv"
    params:
        perturb=config["perturb"],
        default_D=config["decomposition"]["default_D"],
        dtype=config["dtype"],
        device=config["device"],
        config_hash=PERTURB_HASH,
    threads: 2
    resources:
        mem_mb=6000,
        runtime=30,
    conda:
        "../envs/posgen.yaml"
    script:
        "../workflow_scripts/cap.py"


TARGETS.extend(expand(rules.perturb.output.nc, model=MODELS, variant=VARIANTS))
TARGETS.extend(expand(rules.cap.output.nc, model=MODELS, variant=VARIANTS))
