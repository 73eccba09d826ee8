"""Seconds spent in each step of :meth:`posgen.decomposition.Decomposer.unit`, for the benches.

The library keeps no timers: while a :class:`StepTimer` is active, each step (a Decomposer method) is wrapped
with a clock.
"""

from __future__ import annotations

import time

from posgen.decomposition.decomposer import Decomposer

# step name -> the Decomposer method that runs it, in the order Decomposer.unit runs them
STEPS = {
    "operands": "operands",  # rotations, mean keys (method.md sections 1 and 3A)
    "moments": "moments",  # sums over the counted entries (section 4)
    "method_b": "method_b",  # Method B's right-hand side and solve (section 3B)
    "correlations": "correlations",  # every method's r from its sums (sections 3A, 3B, 3C and 4)
    "bound": "error_and_bound",  # the error of A and the bound, entry by entry (section 5)
    "check": "check_bound",
}


class StepTimer:
    """Context manager: ``seconds[step]`` accumulates the time of each of :data:`STEPS`. ``sync`` runs before each clock reading (a GPU's kernels run asynchronously)."""

    def __init__(self, sync=None):
        self.sync = sync or (lambda: None)
        self.seconds = dict.fromkeys(STEPS, 0.0)
        self._saved: list = []

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)

    def _clocked(self, name: str, method):
        def wrapper(*args, **kwargs):
            self.sync()
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.sync()
                self.seconds[name] += time.perf_counter() - start

        return wrapper

    def __enter__(self) -> StepTimer:
        targets = [(Decomposer, attr, name) for name, attr in STEPS.items()]
        for cls, attr, name in targets:
            original = cls.__dict__[attr]
            self._saved.append((cls, attr, original))
            setattr(cls, attr, self._clocked(name, original))
        return self

    def __exit__(self, *exc) -> bool:
        for cls, attr, original in reversed(self._saved):
            setattr(cls, attr, original)
        self._saved.clear()
        return False

    def steps(self) -> dict:
        """Seconds per step so far."""
        return dict(self.seconds)
