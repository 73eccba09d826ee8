# Downloads belong on the head node: compute nodes are often offline.
localrules:
    get_model,


rule get_model:
    output:
        manifest=MANIFEST,
    log:
        "logs/get_model/{model}.log",
    conda:
        "../envs/posgen.yaml"
    params:
        entry=own_model_entry,
    script:
        "../workflow_scripts/get_model.py"
