"""A job's termination by SIGTERM (SLURM's time limit, ``scancel``, Snakemake's own kill).

SIGTERM's default action skips every ``finally``, so the handler raises ``SystemExit(128 + signum)`` instead:
the temporaries (``posgen.store.atomic_path``, the acquisition's staged folder) are then removed on the way
out. A raise can be lost, though: one that lands while the interpreter runs a ``__del__`` or a callback is
printed as "Exception ignored" and the job runs on. So the handler also remembers the signal, and every step
that publishes an output (:func:`refuse_if_terminated`, called just before the rename) refuses after one: a job
asked to stop never makes an output appear, whether or not its raise arrived.
"""

from __future__ import annotations

import signal
import sys

RECEIVED: list[int] = []  # the signals this process was asked to stop by, in order


def on_sigterm(signum, frame):
    RECEIVED.append(signum)
    print(f"terminated by {signal.Signals(signum).name}; removing this job's unfinished temporaries", file=sys.stderr)
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """Install :func:`on_sigterm` for SIGTERM (in a job's main thread, at its start)."""
    signal.signal(signal.SIGTERM, on_sigterm)


def refuse_if_terminated() -> None:
    """Raise ``SystemExit(128 + signum)`` if this process has received a termination signal."""
    if RECEIVED:
        raise SystemExit(128 + RECEIVED[0])
