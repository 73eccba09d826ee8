"""posgen.allocator: glibc keeps freed memory, so the decomposition's tensors stop faulting their pages in anew.

What the thresholds change is read from glibc's own accounting (``mallinfo2``), which is exact within one process:
a 16 MB block is mapped on its own and returned when freed by default, and comes from the heap and stays there
once :func:`posgen.allocator.keep_freed_memory` has run. The page faults this saves vary with the host's load
(a count comparison flaked under CI), so their size is a measurement in docs/results.md, not a test."""

import ctypes
import subprocess
import sys
import textwrap

import pytest

WORKLOAD = textwrap.dedent(
    """
    import ctypes, sys
    import numpy as np
    from posgen.allocator import keep_freed_memory

    class MallInfo2(ctypes.Structure):  # malloc.h, glibc >= 2.33
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    took = keep_freed_memory() if sys.argv[1] == "keep" else None
    block = np.ones(16 * 2**20, dtype=np.uint8)
    alive = libc.mallinfo2()
    del block
    freed = libc.mallinfo2()
    print(took, alive.hblkhd, freed.hblkhd, freed.fordblks)
    """
)
BLOCK = 16 * 2**20


def _mallinfo(mode: str) -> tuple[str, int, int, int]:
    out = subprocess.run([sys.executable, "-c", WORKLOAD, mode], capture_output=True, text=True, check=True)
    took, *sizes = out.stdout.split()
    return (took, *map(int, sizes))


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _has_mallinfo2(), reason="glibc >= 2.33 (mallopt, mallinfo2)")
def test_a_freed_block_is_returned_by_default_and_kept_with_the_thresholds():
    took, mapped_alive, mapped_freed, free_in_heap = _mallinfo("plain")
    assert took == "None"
    assert mapped_alive - mapped_freed >= BLOCK  # mapped on its own, unmapped when freed: the next one faults again
    assert free_in_heap < BLOCK
    took, mapped_alive, mapped_freed, free_in_heap = _mallinfo("keep")
    assert took == "True"
    assert mapped_alive - mapped_freed < BLOCK  # from the heap
    assert free_in_heap >= BLOCK  # and kept there for the next tensor of its size
