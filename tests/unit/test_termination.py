"""A SIGTERM whose SystemExit is swallowed (raised inside a __del__) still stops the job from publishing."""

import gc
import os
import signal
import sys

import pytest

from posgen import termination
from posgen.store import atomic_path


@pytest.fixture
def sigterm_handler():
    before = signal.getsignal(signal.SIGTERM)
    termination.exit_on_sigterm()
    yield
    signal.signal(signal.SIGTERM, before)
    termination.RECEIVED.clear()


class _SignalledInDel:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, where a raise is printed and ignored
        for _ in range(1000):  # a few bytecodes so the pending handler runs inside __del__
            pass


def test_swallowed_sigterm_publishes_nothing(sigterm_handler, tmp_path, monkeypatch):
    lost = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: lost.append(unraisable.exc_type))
    out = tmp_path / "result.nc"
    with pytest.raises(SystemExit) as stopped:
        with atomic_path(out) as tmp:
            tmp.write_bytes(b"complete")
            obj = _SignalledInDel()
            del obj  # the SystemExit raised in __del__ is lost: the block runs on to the end
            gc.collect()
            assert termination.RECEIVED == [signal.SIGTERM]
    assert stopped.value.code == 128 + signal.SIGTERM
    assert lost == [SystemExit]  # the raise really was lost
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary


def test_without_a_signal_the_output_is_published(tmp_path):
    out = tmp_path / "result.nc"
    with atomic_path(out) as tmp:
        tmp.write_bytes(b"complete")
    assert out.read_bytes() == b"complete"
