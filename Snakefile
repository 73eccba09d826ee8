from snakemake.utils import min_version

min_version("9.19")

import sys
from pathlib import Path

# The library lives beside the workflow; make it importable without an install.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from posgen.config import ConfigError, check_files

# Snakemake's own reading keeps the last of duplicate keys and words a YAML error without file or line: read
# every config file strictly first, and stop with one line (--configfile files are also checked, before
# Snakemake reads them, by the workflow profile).
try:
    check_files([p for p in ["config.yaml"] if Path(p).is_file()] + list(workflow.overwrite_configfiles))
except ConfigError as err:
    sys.exit(f"ConfigError: {err}")


configfile: "config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/resources.smk"
include: "rules/models.smk"
include: "rules/llm.smk"
include: "rules/trajectory.smk"
include: "rules/synthetic.smk"
include: "rules/figures.smk"
include: "rules/atlas.smk"
include: "rules/targets.smk"


# Before the first job of a run that has jobs to run (posgen.start_checks, imported here so that parsing stays
# light): the folders it writes must be writable, and a run sized for a GPU (its CPU price past a bound) must see
# one, unless a cluster executor runs it.
onstart:
    from posgen.start_checks import refuse_unwritable, refuse_without_gpu

    refuse_unwritable()
    refuse_without_gpu(workflow, config)


# What `all` builds, listed in one place (posgen.workflow.targets.final_outputs); the named targets
# (rules/targets.smk) build the rest.
rule all:
    default_target: True
    input:
        final_outputs(config),
