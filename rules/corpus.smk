localrules:
    windows,


rule windows:
    input:
        manifest=rules.get_model.output.manifest,
    output:
        windows="results/{model}/windows.h5",
    log:
        "logs/windows/{model}.log",
    conda:
        "../envs/posgen.yaml"
    params:
        source=config["corpus"]["source"],
        n_samples=config["n_samples"],
        seq_len=config["seq_len"],
        seed=config["window_seed"],
        config_hash=hash_of(WINDOWS_LEAVES),
    script:
        "../workflow_scripts/windows.py"
