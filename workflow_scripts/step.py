# Every rule's job: the runner of its step (posgen.workflow.steps), handed the job's files, params and wildcards.
from _common import run

run(snakemake)
