"""Shared preamble of the workflow scripts: make the library importable and send output to the rule's log."""

import sys
from pathlib import Path


def _one_line_for_posgen_errors(exc_type, exc, tb):
    # posgen's own errors (a bad input, a damaged file, a failed self-check) are already one line naming the
    # key or file and what to do: the traceback would only bury it in the log
    if exc_type.__module__.startswith("posgen"):
        print(f"{exc_type.__name__}: {exc}", file=sys.stderr)
    else:
        sys.__excepthook__(exc_type, exc, tb)


def setup(snakemake, uses_torch: bool = False, large_blocks: bool = False) -> None:
    """``uses_torch``: the job runs a model or tensor code; only then is torch imported and configured.
    ``large_blocks``: freed blocks over 32 MB stay in the process too (a training loop's, posgen.allocator)."""
    sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))
    log = open(snakemake.log[0], "w", buffering=1)
    sys.stdout = sys.stderr = log
    sys.excepthook = _one_line_for_posgen_errors
    from posgen.termination import exit_on_sigterm

    exit_on_sigterm()  # SLURM's time limit and scancel: temporaries removed, no output published (module doc)
    from posgen.integrity import record_inputs
    from posgen.store import sweep_stale_temporaries

    record_inputs(snakemake.input)  # every output this job writes records the digests of what it read

    for output in snakemake.output:
        # a SIGKILLed job (or a failed node) ran no cleanup: its temporary of this output is swept now
        for removed in sweep_stale_temporaries(output):
            print(f"removed {removed}, a temporary left by a killed job")
    if uses_torch:
        import torch

        # Random-init weights produce float32 denormals, which CPUs handle ~5x slower; flushing them to zero
        # changes no result beyond 1e-38.
        torch.set_flush_denormal(True)
        torch.set_num_threads(max(1, snakemake.threads))
        from posgen.allocator import keep_freed_memory

        # freed tensors stay in the process: no page faults on the next (posgen.allocator)
        keep_freed_memory(large_blocks=large_blocks)
    from posgen.testing.faults import fail_once

    fail_once(snakemake.rule)  # inert unless POSGEN_FAIL_ONCE names this rule (tests/workflow/test_slurm.py)


def run(snakemake) -> None:
    """Run the job of ``snakemake.rule`` by its step's runner (posgen.workflow.steps), handed a
    :class:`posgen.workflow.job.StepJob` of the rule's named files, params and wildcards."""
    sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))
    from posgen.workflow.job import StepJob, resolve
    from posgen.workflow.steps import step_of

    step = step_of(snakemake.rule)
    setup(snakemake, uses_torch=step.torch, large_blocks=step.large_blocks)
    job = StepJob.of(
        snakemake.input.items(),
        snakemake.output.items(),
        snakemake.params.items(),
        snakemake.wildcards.items(),
        threads=snakemake.threads,
    )
    resolve(step.runner)(job)
