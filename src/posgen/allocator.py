"""The C allocator's settings for tensor work on Linux (glibc's malloc).

By default glibc returns freed memory to the system as soon as a few hundred kB lie free at the top of the heap
(and maps each block above a threshold that adapts to the blocks freed so far); the next tensor of that size
then takes a page fault on every 4 kB it touches. The decomposition's steps allocate and free tens of MB per
call, so on a CPU a quarter to a third of Method B's and the bound's time went to page faults (docs/results.md,
"Long context"). :func:`keep_freed_memory` keeps freed memory in the process instead. PyTorch's CPU tuning guide
swaps the allocator (jemalloc, tcmalloc) for the same reason; this needs no library beside glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # blocks of 32 MB and more are still mapped, and returned when freed (glibc's maximum)
TRIM_THRESHOLD = 2**30  # free memory the heap may keep at its top before it returns it


def keep_freed_memory() -> bool:
    """Sets glibc's mmap and trim thresholds (:data:`MMAP_THRESHOLD`, :data:`TRIM_THRESHOLD`) for this process.
    Returns whether both took; False, and nothing changed, where the C library has no ``mallopt`` (macOS) or
    refuses them. A process's peak memory stays what it was; what it frees below the thresholds is kept for
    reuse rather than returned."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
