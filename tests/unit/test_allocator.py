"""posgen.allocator: glibc keeps freed memory, so the decomposition's tensors stop faulting their pages in anew.

What the thresholds change is read from glibc's own accounting (``mallinfo2``), which is exact within one process:
a 16 MB block is mapped on its own and returned when freed by default, and comes from the heap and stays there
once :func:`posgen.allocator.keep_freed_memory` has run; one of 48 MB, above glibc's largest mmap threshold (a
classifier's attention weights at 122 tokens are 61 MB), only with ``large_blocks``. The page faults this saves
vary with the host's load (a count comparison flaked under CI), so their size is a measurement in
docs/results.md, not a test."""

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
    took = None if sys.argv[1] == "plain" else keep_freed_memory(large_blocks=sys.argv[1] == "large")
    block = np.ones(int(sys.argv[2]), dtype=np.uint8)
    alive = libc.mallinfo2()
    del block
    freed = libc.mallinfo2()
    print(took, alive.hblkhd, freed.hblkhd, freed.fordblks)
    """
)


def _mallinfo(mode: str, block: int) -> tuple[str, int, int, int]:
    out = subprocess.run([sys.executable, "-c", WORKLOAD, mode, str(block)], capture_output=True, text=True, check=True)
    took, *sizes = out.stdout.split()
    return (took, *map(int, sizes))


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _has_mallinfo2(), reason="glibc >= 2.33 (mallopt, mallinfo2)")
@pytest.mark.parametrize(
    "block, kept_by",
    [(16 * 2**20, ("keep", "large")), (48 * 2**20, ("large",))],
    ids=["16MB", "48MB-over-glibcs-largest-mmap-threshold"],
)
def test_a_freed_block_is_returned_by_default_and_kept_with_the_thresholds(block, kept_by):
    took, mapped_alive, mapped_freed, free_in_heap = _mallinfo("plain", block)
    assert took == "None"
    assert mapped_alive - mapped_freed >= block  # mapped on its own, unmapped when freed: the next one faults again
    assert free_in_heap < block
    for mode in ("keep", "large"):
        took, mapped_alive, mapped_freed, free_in_heap = _mallinfo(mode, block)
        assert took == "True"
        if mode in kept_by:
            assert mapped_alive - mapped_freed < block  # from the heap
            assert free_in_heap >= block  # and kept there for the next tensor of its size
        else:
            assert mapped_alive - mapped_freed >= block  # still mapped: a model job's peak returns
