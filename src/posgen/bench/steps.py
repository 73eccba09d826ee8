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
    "position_shares": "position_shares",  # the position shares of q and k (section 3C)
    "bound": "error_and_bound",  # the error of A and the bound, entry by entry (section 5)
    "check": "check_bound",
}

# the fused extraction's other work, timed beside the analysis steps by ``StepTimer(window_steps=True)``: step
# name -> the (module, or module:class, attribute) it times. Each is timed without the steps inside it (the
# capture without its copies), so that a window's steps add up to its time.
WINDOW_STEPS = {
    "capture": [("posgen.llm.extract", "capture_window")],  # the forward pass through the capturing backend
    "copies": [("posgen.llm.capture:Capture", "_stored")],  # each layer's q/k to host memory, float32
    "self_check": [("posgen.llm.extract", "check_window")],  # the captured logits against the model's own
    "writer": [("posgen.store:QKWriter", "write_sample")],  # keep_qk's windows to qk.h5
    "bands": [("posgen.llm.bands:BandTable", "add")],  # the per-band statistics
    "to_host": [("posgen.decomposition.table:DecompositionTable", "flush")],  # a window's statistics, one copy
    "first_window_setup": [  # after the first pass: the RoPE table, qk.h5 opened, the tables started
        ("posgen.llm.capture:Capture", "rope"),
        ("posgen.llm.extract", "qk_attrs"),
        ("posgen.llm.extract", "open_writer"),
        ("posgen.llm.fused:Analysis", "start"),
    ],
}
# once per shard, before its windows: timed whole (the passes inside them are not a window's)
ONCE_STEPS = {
    "transparency": [("posgen.llm.extract", "transparency_attrs")],
    "held_out": [("posgen.llm.extract", "heldout_mean_keys")],
}


def _owner(path: str):
    """The module or class ``module[:class]``."""
    import importlib

    module, _, cls = path.partition(":")
    owner = importlib.import_module(module)
    return getattr(owner, cls) if cls else owner


class StepTimer:
    """Context manager: ``seconds[step]`` accumulates the time of each of :data:`STEPS` (and with
    ``window_steps``, of :data:`WINDOW_STEPS` and :data:`ONCE_STEPS`), each without the steps it calls (a step of
    :data:`ONCE_STEPS` with them). ``sync`` runs before each clock reading (a GPU's kernels run asynchronously)."""

    def __init__(self, sync=None, window_steps: bool = False):
        self.sync = sync or (lambda: None)
        self.targets = [(Decomposer, attr, name) for name, attr in STEPS.items()]
        if window_steps:
            steps = {**WINDOW_STEPS, **ONCE_STEPS}
            self.targets += [(_owner(where), attr, name) for name, places in steps.items() for where, attr in places]
        self.seconds = dict.fromkeys([name for _, _, name in self.targets], 0.0)  # one entry per step name
        self._saved: list = []
        self._stack: list = []  # the steps running, innermost last
        self._since = 0.0  # when the innermost one last resumed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)

    def _clocked(self, name: str, method):
        def wrapper(*args, **kwargs):
            if self._stack and self._stack[-1] in ONCE_STEPS:  # inside a step timed whole
                return method(*args, **kwargs)
            self.sync()
            now = time.perf_counter()
            if self._stack:  # the enclosing step pauses
                self.seconds[self._stack[-1]] += now - self._since
            self._stack.append(name)
            self._since = now
            try:
                return method(*args, **kwargs)
            finally:
                self.sync()
                now = time.perf_counter()
                self.seconds[self._stack.pop()] += now - self._since
                self._since = now  # the enclosing step resumes

        return wrapper

    def __enter__(self) -> StepTimer:
        for owner, attr, name in self.targets:
            original = owner.__dict__[attr]
            self._saved.append((owner, attr, original))
            setattr(owner, attr, self._clocked(name, original))
        return self

    def __exit__(self, *exc) -> bool:
        for owner, attr, original in reversed(self._saved):
            setattr(owner, attr, original)
        self._saved.clear()
        return False

    def steps(self) -> dict:
        """Seconds per step so far."""
        return dict(self.seconds)
