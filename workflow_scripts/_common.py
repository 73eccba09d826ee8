"""Shared preamble of the workflow scripts: make the library importable and send output to the rule's log."""

import sys
from pathlib import Path


def setup(snakemake) -> None:
    sys.path.insert(0, str(Path(snakemake.scriptdir).parent / "src"))
    log = open(snakemake.log[0], "w", buffering=1)
    sys.stdout = sys.stderr = log
    from posgen.testing import fail_once

    fail_once(snakemake.rule)  # inert unless POSGEN_FAIL_ONCE names this rule (tests/test_slurm.py)
