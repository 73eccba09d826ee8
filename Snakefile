from snakemake.utils import min_version

min_version("9.19")


configfile: "config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/models.smk"
include: "rules/corpus.smk"
include: "rules/extract.smk"
include: "rules/decompose.smk"
include: "rules/perturb.smk"
include: "rules/synthetic.smk"
include: "rules/llm_heads.smk"
include: "rules/figures.smk"
include: "rules/trajectory.smk"


rule all:
    default_target: True
    input:
        TARGETS,
