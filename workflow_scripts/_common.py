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


def model_job(snakemake, out: str = "nc"):
    """The job's :class:`posgen.model_job.ModelJob` from its rule (rules extract, perturb, cap, head_ablation):
    the model folder beside its manifest, the windows, output ``out``, the wildcards and the shared params
    (dtype, device, the model's device_map, config_hash); the shard wildcard, where the rule has one."""
    from posgen.model_job import ModelJob
    from posgen.workflow import parse_shard

    p, w = snakemake.params, snakemake.wildcards
    shard = w.get("shard")
    return ModelJob(
        model_dir=Path(snakemake.input.manifest).parent,
        windows=Path(snakemake.input.windows),
        out=Path(snakemake.output[out]),
        model=w.model,
        variant=w.variant,
        dtype=p.dtype,
        device=p.device,
        device_map=p.device_map or None,
        samples=parse_shard(shard) if shard else None,
        config_hash=p.config_hash,
    )


def listed(paths) -> list:
    """A rule's input or output entry as a list: one path (a str) or many."""
    return [paths] if isinstance(paths, str) else list(paths)


def picked(params, *names) -> dict:
    """The rule's params ``names`` as keywords of the job's function."""
    return {name: params[name] for name in names}


def decomposition_options(params):
    """The decomposition's options (``decompose_store``, the fused ``Analysis``) from the params of a rule carrying
    the "decompose" step's config leaves (posgen.workflow.STEP_LEAVES)."""
    from posgen.decomposition.options import DecompositionOptions

    return DecompositionOptions.of(params)
