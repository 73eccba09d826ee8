"""The C allocator's settings for tensor work on Linux (glibc's malloc).

By default glibc returns freed memory to the system as soon as a few hundred kB lie free at the top of the heap
(and maps each block above a threshold that adapts to the blocks freed so far); the next tensor of that size
then takes a page fault on every 4 kB it touches. The decomposition's steps allocate and free tens of MB per
call, so on a CPU a quarter to a third of Method B's and the bound's time went to page faults (docs/results.md,
"Long context"). :func:`keep_freed_memory` keeps freed memory in the process instead. PyTorch's CPU tuning guide
swaps the allocator (jemalloc, tcmalloc) for the same reason; this needs no library beside glibc.

glibc caps the mmap threshold at 32 MB, so every larger block is still mapped on its own and unmapped when freed.
A training loop allocates the same large blocks at every step: a classifier's attention weights at 122 tokens
(64 x 16 x 122 x 122 floats, 61 MB) faulted in anew at every operation, 40 % of a training step (docs/results.md,
"Blocks over 32 MB"). ``keep_freed_memory(large_blocks=True)`` maps no block at all (``M_MMAP_MAX`` 0): every block
comes from the heap and stays there when freed, below the trim threshold. The second paper's jobs set it; model
jobs do not, since large blocks of many sizes would fragment the heap and raise their peak (perturb's by 18 % at
the default sizes) for no time saved. glibc still maps memory where the heap cannot grow (its documented
fallback), so no allocation fails for it.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # mallopt's parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # glibc's maximum: larger blocks are still mapped, and returned when freed
TRIM_THRESHOLD = 2**30  # free memory the heap may keep at its top before it returns it


def keep_freed_memory(large_blocks: bool = False) -> bool:
    """Sets glibc's mmap and trim thresholds (:data:`MMAP_THRESHOLD`, :data:`TRIM_THRESHOLD`) for this process,
    and with ``large_blocks`` its count of mapped blocks to 0, so that blocks over 32 MB come from the heap too.
    Returns whether every setting took; False where the C library has no ``mallopt`` (macOS) or refuses one
    (those before it stay set). What the process frees below the trim threshold is kept for reuse rather than
    returned."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = [(M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD)]
    if large_blocks:
        settings.append((M_MMAP_MAX, 0))  # no block mapped on its own
    return all(mallopt(parameter, value) for parameter, value in settings)
