configfile: "config.yaml"


include: "rules/common.smk"
include: "rules/models.smk"
include: "rules/corpus.smk"
include: "rules/extract.smk"


rule all:
    default_target: True
    input:
        TARGETS,
