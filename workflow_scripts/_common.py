"""Shared preamble of the workflow scripts: make the library importable and send output to the rule's log."""

import sys
from pathlib import Path


def setup(snakemake, uses_torch: bool = False) -> None:
    """``uses_torch``: the job runs a model or tensor code; only then is torch imported and configured."""
    sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))
    log = open(snakemake.log[0], "w", buffering=1)
    sys.stdout = sys.stderr = log
    if uses_torch:
        import torch

        # Random-init weights produce float32 denormals, which CPUs handle ~5x slower; flushing them to zero
        # changes no result beyond 1e-38.
        torch.set_flush_denormal(True)
        torch.set_num_threads(max(1, snakemake.threads))
    from posgen.testing import fail_once

    fail_once(snakemake.rule)  # inert unless POSGEN_FAIL_ONCE names this rule (tests/test_slurm.py)
