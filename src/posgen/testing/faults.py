"""Test-only fault injection, inert unless the environment asks for it.

``POSGEN_FAIL_ONCE=<rule>:<marker file>`` makes the first job of ``<rule>`` that calls ``fail_once`` raise;
the job that creates the marker is the one that fails, every later call (the retry, other jobs of the rule)
finds it and runs normally. The marker must sit on a filesystem that all jobs share (the workflow
directory on a cluster), so that a retry on another node sees it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

ENV = "POSGEN_FAIL_ONCE"


class InjectedFailure(RuntimeError):
    """Raised by fail_once; never raised unless POSGEN_FAIL_ONCE names the rule."""


def fail_once(rule: str) -> None:
    spec = os.environ.get(ENV, "")
    if not spec:
        return
    target, sep, marker = spec.partition(":")
    if not sep or not target or not marker:
        raise ValueError(f"{ENV}={spec!r}: expected <rule>:<marker file>")
    if target != rule:
        return
    try:
        # O_EXCL: exactly one job wins the marker, even when several start at once
        fd = os.open(Path(marker), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(f"{rule} {socket.gethostname()} {os.getpid()} {os.environ.get('SLURM_JOB_ID', '-')}\n")
    raise InjectedFailure(f"{ENV}: injected failure of rule {rule!r} (marker {marker})")
