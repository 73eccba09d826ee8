configfile: "config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/models.smk"
include: "rules/corpus.smk"
include: "rules/extract.smk"
include: "rules/decompose.smk"
include: "rules/perturb.smk"
include: "rules/llm_heads.smk"
include: "rules/figures.smk"


rule all:
    default_target: True
    input:
        TARGETS,
