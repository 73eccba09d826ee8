# Acquiring a model and cutting its token windows. Downloads belong on the head node: compute nodes are often
# offline.
localrules:
    get_model,
    windows,


rule get_model:
    output:
        manifest=paths.MANIFEST,
    log:
        paths.log("get_model", "{model}"),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("get_model"),
    script:
        "../workflow_scripts/step.py"


rule windows:
    input:
        manifest=paths.MANIFEST,
    output:
        windows=paths.WINDOWS,
    log:
        paths.log("windows", "{model}"),
    conda:
        "../envs/posgen.yaml"
    params:
        **params_of("windows"),
    script:
        "../workflow_scripts/step.py"
