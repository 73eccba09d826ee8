localrules:
    windows,


rule windows:
    input:
        manifest=rules.get_model.output.manifest,
    output:
        windows=WINDOWS,
    log:
        "logs/windows/{model}.log",
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("windows"),
    script:
        "../workflow_scripts/windows.py"
