rule extract:
    input:
        manifest=rules.get_model.output.manifest,
        windows=rules.windows.output.windows,
    output:
        qk="results/{model}/{variant}/qk.h5",
    log:
        "logs/extract/{model}/{variant}.log",
    benchmark:
        "benchmarks/extract/{model}/{variant}.tsv"
    conda:
        "../envs/posgen.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=60,
    params:
        dtype=config["dtype"],
        device=config["device"],
        ref_samples=config["extract"]["ref_samples"],
        ref_layers=config["extract"]["ref_layers"],
        check_rtol=config["extract"]["check_rtol"],
        check_tokens=config["extract"]["check_tokens"],
        transparency_tokens=config["extract"]["transparency_tokens"],
        transparency_rtol=config["extract"]["transparency_rtol"],
        compression=config["extract"]["compression"],
        config_hash=hash_of(EXTRACT_LEAVES),
    script:
        "../workflow_scripts/extract.py"


TARGETS.extend(expand(rules.extract.output.qk, model=MODELS, variant=VARIANTS))
