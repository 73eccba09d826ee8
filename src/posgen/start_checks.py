"""Checks at the start of a run (Snakemake's ``onstart``: after the DAG is built, before any job), each a one-line
stop instead of a traceback or a silent start: the folders a run writes must be writable
(:func:`refuse_unwritable`), and a run sized for a GPU must see one (:func:`refuse_without_gpu`).

The decisive GPU experiment (target ``decisive_gpu``), the decisive study and the paper configs plan tens to
thousands of core-hours; on a machine without a CUDA device Snakemake would start them without a word. At the start
of a local run (Snakemake's ``onstart``, after the DAG is built and before any job), :func:`refuse_without_gpu`
prices the jobs that will run on this CPU by ``posgen.plan`` (the first paper's model jobs by their plan rows, the
second paper's training by its experiment's plan) and, past :data:`CPU_HOURS` and with no CUDA device visible,
stops in one line with that price and the variable that runs it here anyway. A cluster executor (profiles/slurm)
is never stopped: its jobs run on the nodes it asks for.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from posgen import paths
from posgen.experiments import COLLECTIONS
from posgen.plan import plan
from posgen.synthetic.cost import study_cost
from posgen.workflow.sharding import UNSHARDED
from posgen.workflow.synthetic import SyntheticPlan, rule_name

# core-hours: twice a study target's documented bound (2 hours on 2 cores), since the plan's CPU rates run up to
# 1.8x slow on make run's jobs; the default run plans 0.2, the scale study 4.4, the decisive GPU experiment 33.6
CPU_HOURS = 8.0
ANYWAY = "POSGEN_ON_CPU"  # set to 1: run a GPU-sized plan on this CPU all the same
TRAIN = "synthetic_train"


def cuda_visible() -> bool:
    """Whether this machine shows a CUDA device: ``nvidia-smi -L`` lists one and CUDA_VISIBLE_DEVICES hides none
    (torch is not imported where the workflow parses)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return False
    found = shutil.which("nvidia-smi")
    if found is None:
        return False
    try:
        listed = subprocess.run([found, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def cpu_price(config: dict, jobs) -> tuple[float, int]:
    """(core-hours, jobs priced) of ``jobs`` ((rule, wildcards) pairs) on this CPU by posgen.plan: a model job by its
    plan row; a classifier's training job (rule synthetic_train) by its share of its experiment's planned hours, a
    job that trains several (an experiment's unit rule) by the whole experiment's."""
    # a job of an unsharded rule has no shard wildcard: its one plan row is keyed without one
    rows = {
        (r.model, r.variant, r.cost.rule, None if r.cost.rule in UNSHARDED else r.shard): r.cost.seconds
        for r in plan(config, device="cpu")
        if r.cost
    }
    synthetic, experiments = SyntheticPlan(config), {}
    for which in COLLECTIONS:
        for row in study_cost(config["synthetic"], which, "cpu") if config["synthetic"].get(which) else ():
            experiments[row.experiment] = (row.device_hours, row.classifiers)
    units = {rule_name(TRAIN, name, synthetic): name for name in experiments}
    hours, priced, whole = 0.0, 0, set()
    for rule, wildcards in jobs:
        key = (wildcards.get("model"), wildcards.get("variant"), rule, wildcards.get("shard"))
        if key in rows:
            hours, priced = hours + rows[key] / 3600, priced + 1
        elif rule == TRAIN and wildcards.get("experiment") in experiments:
            total, classifiers = experiments[wildcards["experiment"]]
            hours, priced = hours + total / classifiers, priced + 1
        elif rule in units and rule not in whole:
            hours, priced = hours + experiments[units[rule]][0], priced + 1
            whole.add(rule)
    return hours, priced


def refuse_without_gpu(workflow, config: dict) -> None:
    """Stop a local run whose jobs plan more than :data:`CPU_HOURS` core-hours where no CUDA device is visible (one
    line, before any job); a cluster executor, :data:`ANYWAY` set, or a visible GPU lets it run."""
    executor = workflow.executor_plugin.name if workflow.executor_plugin is not None else "local"
    if executor != "local" or os.environ.get(ANYWAY) == "1" or cuda_visible():
        return
    jobs = [(job.rule.name, dict(job.wildcards_dict)) for job in workflow.dag.needrun_jobs()]
    hours, priced = cpu_price(config, jobs)
    if hours > CPU_HOURS:
        sys.exit(
            f"posgen: this run is sized for a GPU and none is visible here (nvidia-smi): {priced} of its jobs "
            f"plan {hours:.1f} core-hours on this CPU (posgen.plan --device cpu), more than {CPU_HOURS:.0f}; run it "
            f"on a GPU node (docs/slurm.md: --profile profiles/slurm), or here anyway with {ANYWAY}=1 before the "
            "command"
        )


WRITTEN = (paths.RESULTS, "resources", "logs")  # the folders a run writes (benchmarks/ sits beside logs/)


def refuse_unwritable(folders=WRITTEN) -> None:
    """Stop in one line where a folder the run writes cannot be written (read-only, no rights): the folder, or
    where it does not exist yet the folder it would be made in; before the first job, since Snakemake would run the
    first jobs and then fail with a traceback creating an output's folder."""
    for folder in map(Path, folders):
        where = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
        try:
            with tempfile.NamedTemporaryFile(dir=where, prefix=".posgen-writable-"):
                pass
        except OSError as err:
            sys.exit(
                f"posgen: {folder}/ cannot be written ({err.strerror or err}); nothing was run: make it writable, "
                "or run from a working directory that is (snakemake --directory DIR)"
            )
