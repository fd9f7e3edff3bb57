"""Keep freed memory in the process: large CPU tensors without a page fault per use.

A training step allocates and frees the same large activations every step. glibc hands every block above
its mmap threshold (at most 32 MiB) to a fresh ``mmap`` and returns it to the kernel when freed, so the next
step faults it in again as fresh zeroed pages (measured on the keypoint policy, 2 cores: ~100k page faults/s,
a quarter of the CPU in the kernel; the translator's full-resolution tensors over 64 frames of 128x128 are
above even the largest threshold). With mmap off and the heap never trimmed, freed blocks are reused. Speed
only: the numbers computed are the same.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
M_MMAP_MAX = -4
_done = False


def keep_freed_memory() -> bool:
    """Tell glibc to serve large blocks from the heap and keep what is freed (process-wide); True if it took
    (Linux glibc only; elsewhere a no-op returning False). Once per process."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to set
        return False
    _done = ok
    return ok
